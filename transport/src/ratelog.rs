//! Warnings about one peer at most once per interval, with a count of the ones held back: a peer
//! that sends a bad frame on every stream, or a host that floods oversized reports, must not
//! fill the log at its own rate. Time is passed in, so the rule is tested without a clock.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often one warning about one peer is logged at most (the first always).
pub const warn_every_ms: u64 = 10_000;
/// Peers whose last warning is remembered at most; beyond, the memory starts again (a peer then
/// gets one more line than it would have).
pub const warned_peers_max: usize = 4096;

struct Slot {
    at: Instant,
    held: u64,
}

/// Decides which warnings about which peer are logged: the first, then at most one per
/// [`warn_every_ms`], each saying how many were held back since the last.
pub struct LogEvery<K> {
    every: Duration,
    last: Mutex<HashMap<K, Slot>>,
}

impl<K: Eq + Hash> Default for LogEvery<K> {
    fn default() -> LogEvery<K> {
        LogEvery::new(Duration::from_millis(warn_every_ms))
    }
}

impl<K: Eq + Hash> LogEvery<K> {
    /// A limiter logging once per `every` per key.
    pub fn new(every: Duration) -> LogEvery<K> {
        LogEvery {
            every,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(held)` when a warning about `key` at `now` is due, `held` being how many were held
    /// back since the last one logged; `None` when it is held back (and counted).
    pub fn due(&self, key: K, now: Instant) -> Option<u64> {
        // A panic while holding it leaves at worst a stale time: recoverable.
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(slot) = last.get_mut(&key) {
            if now.saturating_duration_since(slot.at) < self.every {
                slot.held = slot.held.saturating_add(1);
                return None;
            }
            let held = slot.held;
            *slot = Slot { at: now, held: 0 };
            return Some(held);
        }
        if last.len() >= warned_peers_max {
            last.clear();
        }
        last.insert(key, Slot { at: now, held: 0 });
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_warned_about_once_per_interval_with_the_count_held_back() {
        // Issue 23 part 5: one line per peer per interval, saying how many were not logged.
        let log = LogEvery::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(log.due("ace", t0), Some(0), "the first is logged");
        assert_eq!(log.due("ace", t0 + Duration::from_secs(1)), None);
        assert_eq!(log.due("ace", t0 + Duration::from_secs(9)), None);
        assert_eq!(
            log.due("g14", t0 + Duration::from_secs(9)),
            Some(0),
            "per peer"
        );
        assert_eq!(
            log.due("ace", t0 + Duration::from_secs(10)),
            Some(2),
            "the next says how many were held back"
        );
        assert_eq!(log.due("ace", t0 + Duration::from_secs(11)), None);
        assert_eq!(log.due("ace", t0 + Duration::from_secs(20)), Some(1));
    }

    #[test]
    fn the_memory_of_warned_peers_stays_bounded() {
        // Limits: a flood of distinct peers cannot grow the memory past warned_peers_max.
        let log = LogEvery::new(Duration::from_secs(10));
        let now = Instant::now();
        for peer in 0..(warned_peers_max * 2) {
            assert_eq!(log.due(peer, now), Some(0));
        }
        let len = log.last.lock().expect("lock").len();
        assert!(len <= warned_peers_max, "{len}");
    }
}
