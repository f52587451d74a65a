//! Domain tables over redb and the Raft state machine's apply of domain commands.
