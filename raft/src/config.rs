//! Raft timing and limits: plain settings with etcd-like defaults for a noisy shared machine, validated
//! once into a [`RaftConfig`] that cannot be invalid. mesh runs its own election timer (decision
//! 0328, `crate::elect`): each voter draws its election timeout, afresh for every election, from its
//! own slice of the campaign window ([`RaftConfig::election_window`], decision 0110), so two
//! survivors of a failover never campaign together; openraft's timer is off and openraft keeps only
//! the vote lease ([`RaftConfig::vote_lease`]).

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
    /// How long a follower refuses every vote, its own campaign included, after the last heartbeat
    /// it accepted (openraft's "leader lease", [`RaftConfig::vote_lease`]); also the base of the
    /// lease (G3). No voter campaigns before `election_timeout_min_ms + heartbeat_ms`.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomised election timeout. Each voter gets its own slice of the
    /// campaign window `election_timeout_min_ms + heartbeat_ms .. election_timeout_max_ms` and
    /// draws from it again for every election (decision 0328).
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
            // Decision 0328: a vote lease of 300 ms, a 200 ms lease (G3), and a follower that
            // campaigns 350-470 ms after the leader's last heartbeat, in its voter's slice.
            heartbeat_ms: 50,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 470,
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
        // The campaign window starts a heartbeat after the vote lease, so the survivor that
        // campaigns first finds the other's lease of the dead leader ended (decision 0328).
        if s.election_timeout_max_ms <= s.election_timeout_min_ms.saturating_add(s.heartbeat_ms) {
            return Err(invalid(
                "election_timeout_max_ms",
                s.election_timeout_max_ms,
                format!(
                    "must be above election_timeout_min_ms + heartbeat_ms ({} + {}): voters campaign between the two",
                    s.election_timeout_min_ms, s.heartbeat_ms
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

    /// openraft's config. openraft 0.9.25 takes `election_timeout_max` as the lease a follower
    /// keeps for the leader it heard (`EngineConfig::new`: `leader_lease`; `Engine::handle_vote_req`
    /// refuses every vote until it has passed since the last heartbeat): that is
    /// `election_timeout_min_ms`, the vote lease. Its own election timer is off (`enable_elect`):
    /// `crate::elect` campaigns instead. `election_timeout_min` is then only the timeout of a vote
    /// request (`RaftCore`, `SendVote`) and the bound of a draw nobody reads.
    fn openraft_config(&self) -> openraft::Config {
        openraft::Config {
            cluster_name: "mesh".to_string(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms - 1,
            election_timeout_max: self.election_timeout_min_ms,
            enable_elect: false,
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

    /// The openraft configuration (the same for every replica: its vote lease is
    /// [`RaftConfig::vote_lease`], its election timer is off).
    pub fn openraft(&self) -> Arc<openraft::Config> {
        self.openraft.clone()
    }

    /// How long a follower refuses every vote after the last heartbeat it accepted:
    /// `election_timeout_min`, openraft's `leader_lease` (the `election_timeout_max` it is given).
    /// mesh's election timer campaigns only through a vote openraft grants under that same rule
    /// (`crate::elect`), so no voter votes for anyone, itself included, within it (decision 0328).
    pub fn vote_lease(&self) -> Duration {
        Duration::from_millis(self.openraft.election_timeout_max)
    }

    /// The election window of voter `id` among `voters`: the `k`-th of `n` equal, disjoint slices
    /// of the campaign window `election_timeout_min + heartbeat .. election_timeout_max`, `k` being
    /// `id`'s place among the sorted ids. With one window for all, two survivors that drew close
    /// timeouts campaign together and split the vote. Every slice starts a heartbeat after the vote
    /// lease, so the first candidate finds the other survivor's lease of the dead leader ended,
    /// and above the lease (decision 0030). A node outside `voters`, or slices under 1 ms, get the
    /// whole campaign window.
    pub fn election_window(&self, id: u64, voters: &BTreeSet<u64>) -> (u64, u64) {
        let (min, max) = (
            self.settings.election_timeout_min_ms + self.settings.heartbeat_ms,
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

    /// A fresh election timeout for voter `id` of `voters`, drawn from its slice
    /// ([`RaftConfig::election_window`]) with `rng` (the runtime's, so the simulator replays it).
    pub fn draw_election_timeout(
        &self,
        id: u64,
        voters: &BTreeSet<u64>,
        rng: &mut impl rand::Rng,
    ) -> Duration {
        let (min, max) = self.election_window(id, voters);
        Duration::from_millis(rng.gen_range(min..max))
    }

    /// The leader's heartbeat interval.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.settings.heartbeat_ms)
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
            heartbeat_ms: 100,
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
            election_timeout_max_ms: 300,
            ..RaftSettings::default()
        };
        assert!(s.validate().is_err());
    }

    /// Checks, for `config`, every timing fact the lease (G3, decisions 0030, 0071, 0328) rests on,
    /// for voters `voters`; returns the voters' campaign windows.
    fn assert_no_vote_inside_the_lease(
        config: &RaftConfig,
        voters: &BTreeSet<u64>,
    ) -> Vec<(u64, u64)> {
        let s = config.settings().clone();
        let lease = config.lease_window().as_millis() as u64;
        let openraft = config.openraft();
        // openraft refuses every vote for `leader_lease` = its `election_timeout_max` after the
        // last heartbeat (`Engine::handle_vote_req`); that is the vote lease, at or above
        // `election_timeout_min`, which is above the lease by the margin.
        assert_eq!(
            config.vote_lease().as_millis() as u64,
            openraft.election_timeout_max
        );
        assert!(
            openraft.election_timeout_max >= s.election_timeout_min_ms,
            "a follower grants votes {} ms after a heartbeat, before election_timeout_min ({} ms)",
            openraft.election_timeout_max,
            s.election_timeout_min_ms
        );
        assert!(
            lease < openraft.election_timeout_max,
            "a vote could be granted inside the lease ({lease} ms)"
        );
        // openraft's own timer would campaign without our guard vote: it must be off.
        assert!(!openraft.enable_elect, "openraft's election timer is on");
        assert!(openraft.as_ref().clone().validate().is_ok());
        let windows: Vec<(u64, u64)> = voters
            .iter()
            .map(|id| config.election_window(*id, voters))
            .collect();
        let whole = (
            s.election_timeout_min_ms + s.heartbeat_ms,
            s.election_timeout_max_ms,
        );
        // A window too narrow for a slice per voter is shared whole.
        if (whole.1 - whole.0) / voters.len() as u64 == 0 {
            assert!(windows.iter().all(|w| *w == whole), "{windows:?}");
        }
        for pair in windows.windows(2).filter(|p| p[0] != p[1]) {
            assert!(pair[0].1 <= pair[1].0, "overlapping windows {windows:?}");
        }
        for (min, max) in &windows {
            assert!(min < max && *max <= s.election_timeout_max_ms);
            assert!(
                *min > lease && *min >= openraft.election_timeout_max + s.heartbeat_ms,
                "a follower could campaign inside the vote lease or the lease: {windows:?}"
            );
        }
        windows
    }

    #[test]
    fn each_voter_campaigns_in_its_own_slice_of_the_election_window() {
        // Liveness (decisions 0110, 0328): voters' windows are disjoint, so two survivors never
        // draw the same timeout; safety (decisions 0030, 0328): every slice starts a heartbeat
        // after the vote lease, which is above the lease, and openraft's timer is off.
        let config = RaftConfig::default();
        let s = config.settings().clone();
        let voters: BTreeSet<u64> = [1, 2, 3].into();
        let windows = assert_no_vote_inside_the_lease(&config, &voters);
        assert_eq!(windows, vec![(350, 390), (390, 430), (430, 470)]);
        assert_eq!(config.vote_lease(), Duration::from_millis(300));
        assert_eq!(config.lease_window(), Duration::from_millis(200));
        let stranger = config.election_window(9, &voters);
        assert_eq!(
            stranger,
            (
                s.election_timeout_min_ms + s.heartbeat_ms,
                s.election_timeout_max_ms
            )
        );
        // Every draw stays in the voter's own slice.
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
        for (id, (min, max)) in voters.iter().zip(&windows) {
            for _ in 0..100 {
                let drawn = config.draw_election_timeout(*id, &voters, &mut rng);
                let drawn = drawn.as_millis() as u64;
                assert!(
                    *min <= drawn && drawn < *max,
                    "{drawn} outside {min}..{max}"
                );
            }
        }
    }

    #[test]
    fn every_valid_timing_keeps_votes_out_of_the_lease() {
        // G3 (decision 0328): whatever timings pass validation, no voter grants a vote or
        // campaigns before the lease has ended since it last heard the leader.
        let mut checked = 0;
        for heartbeat_ms in [1, 10, 50, 99] {
            for election_timeout_min_ms in [300, 400, 1_000] {
                for election_timeout_max_ms in [301, 351, 470, 700, 2_000] {
                    for lease_margin_ms in [1, 60, 100, 299] {
                        let s = RaftSettings {
                            heartbeat_ms,
                            election_timeout_min_ms,
                            election_timeout_max_ms,
                            lease_margin_ms,
                            ..RaftSettings::default()
                        };
                        let Ok(config) = s.validate() else { continue };
                        for voters in [vec![1], vec![1, 2, 3], vec![1, 2, 3, 4, 5]] {
                            assert_no_vote_inside_the_lease(&config, &voters.into_iter().collect());
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 50, "only {checked} timings validated");
    }

    #[test]
    fn a_campaign_window_not_a_heartbeat_past_the_vote_lease_is_refused() {
        // Liveness: the first candidate must find the other survivor's vote lease ended.
        let s = RaftSettings {
            election_timeout_max_ms: 350,
            ..RaftSettings::default()
        };
        assert!(matches!(
            s.validate(),
            Err(ConfigError::Invalid {
                name: "election_timeout_max_ms",
                ..
            })
        ));
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
