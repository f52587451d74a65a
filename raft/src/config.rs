//! Raft timing and limits: plain settings with etcd-like defaults for a noisy shared machine, validated
//! once into a [`RaftConfig`] that cannot be invalid. Each voter draws its election timeout from its
//! own slice of the election window ([`RaftConfig::openraft_for`], decision 0110), so two survivors
//! of a failover never campaign together.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Largest number of entries openraft may put in one append-entries message.
pub const payload_entries_max: u64 = 4096;
/// Largest number of commands grouped into one log entry.
pub const batch_commands_max_limit: usize = 65_536;
/// Largest size of one log entry's batch, in bytes (kept under the codec's value limit).
pub const batch_bytes_max_limit: usize = 16 * 1024 * 1024;
/// Deepest proposal queue a replica may be configured with.
pub const proposals_queued_max_limit: usize = 1 << 20;

/// Raft settings as an operator writes them (milliseconds, counts). Turn them into a [`RaftConfig`]
/// with [`RaftSettings::validate`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftSettings {
    /// Interval between the leader's heartbeats.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomised election timeout; also the base of the lease.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomised election timeout. Each voter gets its own slice of
    /// `election_timeout_min_ms..election_timeout_max_ms`; openraft 0.9 makes a follower wait the top
    /// of its slice (its "leader lease") plus its drawn timeout after the last heartbeat.
    pub election_timeout_max_ms: u64,
    /// Taken off the lease for clock-rate drift between processes and scheduling delay.
    pub lease_margin_ms: u64,
    /// Build a snapshot after this many entries were applied since the last one.
    pub snapshot_logs_since_last: u64,
    /// Entries kept in the log after a snapshot, so a slightly lagging follower needs no snapshot.
    pub logs_kept_after_snapshot: u64,
    /// Entries per append-entries message.
    pub payload_entries_max: u64,
    /// Commands grouped into one log entry at most.
    pub batch_commands_max: usize,
    /// Bytes of commands grouped into one log entry at most.
    pub batch_bytes_max: usize,
    /// Batches proposed and not yet committed at most (pipelining depth).
    pub batches_in_flight_max: usize,
    /// Proposals waiting to be batched at most; beyond that, `propose` waits (back-pressure).
    pub proposals_queued_max: usize,
    /// How long a proposal may take from queueing to its answer.
    pub propose_timeout_ms: u64,
    /// How long one snapshot chunk transfer may take.
    pub install_snapshot_timeout_ms: u64,
    /// How long shutting a replica down may take before it is reported stuck.
    pub shutdown_timeout_ms: u64,
}

impl Default for RaftSettings {
    fn default() -> Self {
        Self {
            // Decision 0110: a follower campaigns 0.9-1.55 s after the leader's last heartbeat.
            heartbeat_ms: 100,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: 700,
            lease_margin_ms: 100,
            snapshot_logs_since_last: 10_000,
            logs_kept_after_snapshot: 1_000,
            payload_entries_max: 512,
            batch_commands_max: 1024,
            batch_bytes_max: 4 * 1024 * 1024,
            batches_in_flight_max: 2,
            proposals_queued_max: 8192,
            propose_timeout_ms: 5_000,
            install_snapshot_timeout_ms: 10_000,
            shutdown_timeout_ms: 10_000,
        }
    }
}

/// The Raft timings the lease's safety rests on (decision 0150): a leader's lease is
/// `election_timeout_min − lease_margin` by its own settings, and it is safe only while every
/// follower, by *its* settings, refuses votes and waits at least that long after a heartbeat. So
/// they are one cluster-wide setting: every Raft message carries the sender's, and a replica
/// refuses a message whose timings differ from its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub lease_margin_ms: u64,
}

impl std::fmt::Display for Timings {
    /// As the `[raft]` keys an operator writes, so the two sides of a refusal can be compared.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "heartbeat_ms = {}, election_timeout_min_ms = {}, election_timeout_max_ms = {}, lease_margin_ms = {}",
            self.heartbeat_ms,
            self.election_timeout_min_ms,
            self.election_timeout_max_ms,
            self.lease_margin_ms
        )
    }
}

/// Why settings were refused; each names the setting and the bound it broke.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("raft setting {name} = {value} is invalid: {rule}")]
    Invalid {
        name: &'static str,
        value: u64,
        rule: String,
    },
    #[error("openraft refused the raft settings: {0}")]
    Openraft(Box<openraft::ConfigError>),
}

/// Validated Raft settings. The only way to make one is [`RaftSettings::validate`] (or
/// [`RaftConfig::default`]), so every holder may rely on the bounds checked there.
#[derive(Clone, Debug)]
pub struct RaftConfig {
    settings: RaftSettings,
    openraft: Arc<openraft::Config>,
}

fn invalid(name: &'static str, value: u64, rule: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name,
        value,
        rule: rule.into(),
    }
}

fn in_range(name: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(invalid(name, value, format!("must be in {min}..={max}")));
    }
    Ok(())
}

impl RaftSettings {
    /// Checks every bound and builds the openraft configuration.
    pub fn validate(self) -> Result<RaftConfig, ConfigError> {
        let s = &self;
        in_range("heartbeat_ms", s.heartbeat_ms, 1, 60_000)?;
        if s.heartbeat_ms.saturating_mul(3) >= s.election_timeout_min_ms {
            return Err(invalid(
                "heartbeat_ms",
                s.heartbeat_ms,
                format!(
                    "must be under a third of election_timeout_min_ms ({}), so one lost heartbeat does not start an election",
                    s.election_timeout_min_ms
                ),
            ));
        }
        if s.election_timeout_max_ms <= s.election_timeout_min_ms {
            return Err(invalid(
                "election_timeout_max_ms",
                s.election_timeout_max_ms,
                format!(
                    "must be above election_timeout_min_ms ({})",
                    s.election_timeout_min_ms
                ),
            ));
        }
        if s.lease_margin_ms == 0 || s.lease_margin_ms >= s.election_timeout_min_ms {
            return Err(invalid(
                "lease_margin_ms",
                s.lease_margin_ms,
                format!(
                    "must be above 0 and under election_timeout_min_ms ({}), or the lease is empty",
                    s.election_timeout_min_ms
                ),
            ));
        }
        s.validate_limits()?;
        let openraft = s
            .openraft_config()
            .validate()
            .map_err(|e| ConfigError::Openraft(Box::new(e)))?;
        Ok(RaftConfig {
            settings: self,
            openraft: Arc::new(openraft),
        })
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        in_range(
            "snapshot_logs_since_last",
            self.snapshot_logs_since_last,
            1,
            u64::MAX,
        )?;
        in_range(
            "payload_entries_max",
            self.payload_entries_max,
            1,
            payload_entries_max,
        )?;
        in_range(
            "batch_commands_max",
            self.batch_commands_max as u64,
            1,
            batch_commands_max_limit as u64,
        )?;
        in_range(
            "batch_bytes_max",
            self.batch_bytes_max as u64,
            1,
            batch_bytes_max_limit as u64,
        )?;
        in_range(
            "batches_in_flight_max",
            self.batches_in_flight_max as u64,
            1,
            64,
        )?;
        in_range(
            "proposals_queued_max",
            self.proposals_queued_max as u64,
            1,
            proposals_queued_max_limit as u64,
        )?;
        in_range("propose_timeout_ms", self.propose_timeout_ms, 1, 600_000)?;
        in_range(
            "install_snapshot_timeout_ms",
            self.install_snapshot_timeout_ms,
            1,
            600_000,
        )?;
        in_range("shutdown_timeout_ms", self.shutdown_timeout_ms, 1, 600_000)?;
        Ok(())
    }

    fn openraft_config(&self) -> openraft::Config {
        self.openraft_window(self.election_timeout_min_ms, self.election_timeout_max_ms)
    }

    /// openraft's config with the election timeout drawn from `min..max` (openraft also takes `max`
    /// as the lease a follower keeps for a leader it heard).
    fn openraft_window(&self, min: u64, max: u64) -> openraft::Config {
        openraft::Config {
            cluster_name: "mesh".to_string(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: min,
            election_timeout_max: max,
            install_snapshot_timeout: self.install_snapshot_timeout_ms,
            max_payload_entries: self.payload_entries_max,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_logs_since_last),
            max_in_snapshot_log_to_keep: self.logs_kept_after_snapshot,
            ..Default::default()
        }
    }
}

impl Default for RaftConfig {
    /// The default settings, which are valid by construction (a test validates them).
    fn default() -> Self {
        let settings = RaftSettings::default();
        let openraft = Arc::new(settings.openraft_config());
        Self { settings, openraft }
    }
}

impl RaftConfig {
    /// The settings this config was validated from.
    pub fn settings(&self) -> &RaftSettings {
        &self.settings
    }

    /// The timings every replica of the cluster must share ([`Timings`]).
    pub fn timings(&self) -> Timings {
        let s = &self.settings;
        Timings {
            heartbeat_ms: s.heartbeat_ms,
            election_timeout_min_ms: s.election_timeout_min_ms,
            election_timeout_max_ms: s.election_timeout_max_ms,
            lease_margin_ms: s.lease_margin_ms,
        }
    }

    /// The openraft configuration with the whole election window (for a node that knows no voters).
    pub fn openraft(&self) -> Arc<openraft::Config> {
        self.openraft.clone()
    }

    /// The election window of voter `id` among `voters`: the `k`-th of `n` equal, disjoint slices
    /// of `election_timeout_min..election_timeout_max`, `k` being `id`'s place among the sorted ids.
    /// openraft 0.9 draws a node's timeout once, at start; with one window for all, two survivors
    /// that drew close timeouts campaign together, split the vote and do so again every round.
    /// Every slice starts at or above `election_timeout_min`, so the lease (decision 0030) holds.
    /// A node outside `voters`, or slices under 1 ms, get the whole window.
    pub fn election_window(&self, id: u64, voters: &BTreeSet<u64>) -> (u64, u64) {
        let (min, max) = (
            self.settings.election_timeout_min_ms,
            self.settings.election_timeout_max_ms,
        );
        let n = voters.len() as u64;
        let Some(k) = voters.iter().position(|v| *v == id) else {
            return (min, max);
        };
        let width = (max - min) / n.max(1);
        if width == 0 {
            return (min, max);
        }
        let low = min + k as u64 * width;
        (low, low + width)
    }

    /// The openraft configuration for voter `id` of `voters`: its own election window
    /// ([`RaftConfig::election_window`]), everything else as [`RaftConfig::openraft`].
    pub fn openraft_for(&self, id: u64, voters: &BTreeSet<u64>) -> Arc<openraft::Config> {
        let (min, max) = self.election_window(id, voters);
        Arc::new(self.settings.openraft_window(min, max))
    }

    /// How long a lease lasts after the start of the round that confirmed it:
    /// `election_timeout_min − lease_margin` (positive by validation).
    pub fn lease_window(&self) -> Duration {
        Duration::from_millis(self.settings.election_timeout_min_ms - self.settings.lease_margin_ms)
    }

    /// How long a proposal may take.
    pub fn propose_timeout(&self) -> Duration {
        Duration::from_millis(self.settings.propose_timeout_ms)
    }

    /// How long a shutdown may take.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.settings.shutdown_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_validate_to_the_default_config() {
        // Config: the defaults obey every bound, and `RaftConfig::default` equals validating them.
        let validated = RaftSettings::default()
            .validate()
            .expect("defaults are valid");
        let default = RaftConfig::default();
        assert_eq!(validated.settings(), default.settings());
        assert_eq!(
            format!("{:?}", validated.openraft()),
            format!("{:?}", default.openraft())
        );
    }

    #[test]
    fn lease_margin_at_or_above_election_timeout_min_is_refused() {
        // G3: an empty lease window would make the gate meaningless.
        let s = RaftSettings {
            lease_margin_ms: 1000,
            ..RaftSettings::default()
        };
        assert!(matches!(
            s.validate(),
            Err(ConfigError::Invalid {
                name: "lease_margin_ms",
                ..
            })
        ));
    }

    #[test]
    fn heartbeat_not_under_a_third_of_election_timeout_is_refused() {
        // Liveness: one late heartbeat must not start an election.
        let s = RaftSettings {
            heartbeat_ms: 400,
            ..RaftSettings::default()
        };
        assert!(matches!(
            s.validate(),
            Err(ConfigError::Invalid {
                name: "heartbeat_ms",
                ..
            })
        ));
    }

    #[test]
    fn election_timeout_max_not_above_min_is_refused() {
        // Liveness: the election timeout must be randomised over a non-empty range.
        let s = RaftSettings {
            election_timeout_max_ms: 400,
            ..RaftSettings::default()
        };
        assert!(s.validate().is_err());
    }

    #[test]
    fn each_voter_campaigns_in_its_own_slice_of_the_election_window() {
        // Liveness (decision 0110): voters' windows are disjoint, so two survivors never draw the
        // same timeout; safety (decision 0030): every slice starts at or above the lease's base.
        let config = RaftConfig::default();
        let s = config.settings().clone();
        let voters: BTreeSet<u64> = [1, 2, 3].into();
        let windows: Vec<(u64, u64)> = voters
            .iter()
            .map(|id| config.election_window(*id, &voters))
            .collect();
        assert_eq!(windows, vec![(400, 500), (500, 600), (600, 700)]);
        for pair in windows.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "overlapping windows {windows:?}");
        }
        for (min, max) in &windows {
            assert!(*min >= s.election_timeout_min_ms && *max <= s.election_timeout_max_ms);
            assert!(
                config.lease_window().as_millis() < u128::from(*min),
                "a follower could campaign inside the lease"
            );
            let openraft = config.openraft_for(1, &voters);
            assert!(openraft.clone().as_ref().clone().validate().is_ok());
        }
        let stranger = config.election_window(9, &voters);
        assert_eq!(
            stranger,
            (s.election_timeout_min_ms, s.election_timeout_max_ms)
        );
    }

    #[test]
    fn zero_limits_are_refused() {
        // Limits: every queue and batch has a positive bound.
        let s = RaftSettings {
            batch_commands_max: 0,
            ..RaftSettings::default()
        };
        assert!(s.validate().is_err());
    }
}
