//! Fault injection (pause, kill, partition, drop/delay/reorder), history recording and the checkers that read it.
