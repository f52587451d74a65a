//! End-to-end beds: real `meshd` and `mesh-host` processes on loopback, one bed per guarantee.
