//! The mesh-host agent: envelope validator, supervised process runtime and reporter.
