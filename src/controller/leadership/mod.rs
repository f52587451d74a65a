//! The leader's decisions as sans-I/O cores (issue 22 item 1, decision 0321), in the manner of the
//! push engine (`controller::engine`): what a leader knows goes in as plain data with the time it
//! is, what to do comes out as typed values; the async shell in `Service` reads the state, calls
//! the core and carries the answer out. [`intake`] decides on a host's report; the push engine
//! decides the push and the G9 floor hold (`engine::floor`).

pub(crate) mod intake;

#[cfg(test)]
mod tests {
    #[test]
    fn the_leadership_cores_read_no_clock_do_no_io_and_draw_no_randomness() {
        // Decision 0321: report intake and the G9 hold decide on what they are handed; a clock
        // read, an await, a socket, a file, a lock or a random draw in them would put a decision
        // back into the shell's world.
        let sources = [
            ("leadership/intake.rs", include_str!("intake.rs")),
            ("engine/floor.rs", include_str!("../engine/floor.rs")),
        ];
        let forbidden = [
            "tokio::",
            "Instant::now",
            "SystemTime",
            "std::fs",
            "std::net",
            "std::thread",
            "std::process",
            "std::sync",
            "getrandom",
            "rand::",
            ".await",
            "async fn",
            "tracing::",
            "service::",
        ];
        for (file, source) in sources {
            for word in forbidden {
                assert!(!source.contains(word), "{file} names {word}");
            }
        }
    }
}
