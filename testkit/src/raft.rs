//! Raft settings for tests that run replicas in-process or as binaries on loopback.

use mesh_raft::RaftSettings;

/// Elections in under a second, so a test's cluster has a leader quickly, and a proposal timeout
/// long enough for a loaded test machine.
pub fn fast_raft() -> RaftSettings {
    RaftSettings {
        heartbeat_ms: 50,
        election_timeout_min_ms: 500,
        election_timeout_max_ms: 1000,
        lease_margin_ms: 100,
        propose_timeout_ms: 5_000,
        ..RaftSettings::default()
    }
}
