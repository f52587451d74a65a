//! meshctl: argument parsing and rendering only; every decision is made in `core` or by a replica.
