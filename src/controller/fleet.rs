//! The leader's fleet-state gauges on `/metrics` (issue 25 item 6, decision 0311): how many
//! machines of the model are up to date, behind, held, failing, silent, drifted (decision 0305),
//! and how long the
//! longest-unheard one has gone unheard — counts, never a per-machine label, so the series stay
//! as few however many machines there are. Counted from the very machine views `status` shows
//! (one rule, [`FleetCounts::of`]), and only by a leader a quorum confirmed within an election
//! timeout: every other replica, a deposed leader cut off from the rest included, says 0, so a
//! sum or a max over the replicas is the leader's word and an alert never counts twice.

use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use super::api::{ApiError, MachineView};
use super::reports::HeardView;
use super::service::Service;
use crate::core::report::Health;

/// The machines of the model by what `status` says of them; several may hold for one machine
/// (silent and behind, say), so they are separate counts, not one labelled family to sum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetCounts {
    /// Machines in the model.
    pub machines: u64,
    /// Heard within `silent_after_ms`, last send confirmed, every module ready, nothing drifted:
    /// what `status` calls "up to date".
    pub up_to_date: u64,
    /// Behind: the should-be declaration differs from the last send, or the send is unconfirmed.
    pub behind: u64,
    /// With a push held (a mount would move).
    pub held: u64,
    /// Whose last report shows a module failed or stopped.
    pub failing: u64,
    /// SILENT (decision 0301).
    pub silent: u64,
    /// Whose last report says what they run differs from their declaration: DRIFTED (decision
    /// 0305).
    pub drifted: u64,
    /// The longest time any machine has gone unheard by this leader: since its last report
    /// (filed or only heard), or, for one not heard since this leader took office, how long it
    /// has led (a lower bound).
    pub oldest_report_age: Duration,
}

impl FleetCounts {
    /// Counts `machines` (the views `status` answers, heard times filled in by the leader), the
    /// longest unheard having gone unheard for `oldest_report_age`.
    pub fn of(machines: &[MachineView], oldest_report_age: Duration) -> FleetCounts {
        let mut c = FleetCounts {
            machines: machines.len() as u64,
            oldest_report_age,
            ..FleetCounts::default()
        };
        for m in machines {
            let silent = m.silent_for_ms.is_some();
            let failing = matches!(m.health, Some(Health::Failing { .. }));
            let ready = matches!(m.health, Some(Health::Ready) | None);
            let drifted = !m.drifted.is_empty();
            // As `meshctl status` words it (`cli::status::machine_state`, tested to agree).
            if !silent && m.heard_ago_ms.is_some() && !m.behind && !drifted && ready {
                c.up_to_date += 1;
            }
            c.drifted += u64::from(drifted);
            c.behind += u64::from(m.behind);
            c.held += u64::from(!m.holds.is_empty());
            c.failing += u64::from(failing);
            c.silent += u64::from(silent);
        }
        c
    }
}

impl Service {
    /// The fleet as this replica counts it now: the model's machines as `status` shows them,
    /// when it is a leader a quorum confirmed within an election timeout; all 0 otherwise (a
    /// follower hears no host; a leader cut off from the others may already be deposed).
    pub(crate) fn fleet_now(&self) -> Result<FleetCounts, ApiError> {
        let Some(leadership) = self
            .confirmed_leading_term()
            .and_then(|term| self.leadership_in(term))
        else {
            return Ok(FleetCounts::default());
        };
        let state = self.state()?;
        let machines = self.machine_views(&state)?;
        let now = std::time::Instant::now();
        let mut oldest = Duration::ZERO;
        for m in &machines {
            let quiet = match leadership.live.view(&m.name, now) {
                HeardView::Ago(d) | HeardView::NotSince(d) => d,
            };
            oldest = oldest.max(quiet);
        }
        Ok(FleetCounts::of(&machines, oldest))
    }

    /// The term this replica leads, if a quorum acknowledged it less than an election timeout
    /// ago (openraft's `millis_since_quorum_ack`); `None` otherwise.
    fn confirmed_leading_term(&self) -> Option<u64> {
        let within = self.replica.config().settings().election_timeout_min_ms;
        let m = self.replica.metrics();
        let m = m.borrow();
        let leads = m.state == openraft::ServerState::Leader && m.current_leader == Some(self.id);
        let confirmed = m.millis_since_quorum_ack.is_some_and(|ms| ms < within);
        (leads && confirmed).then_some(m.current_term)
    }
}

/// The gauges, registered once.
pub(crate) struct FleetGauges {
    machines: Gauge,
    up_to_date: Gauge,
    behind: Gauge,
    held: Gauge,
    failing: Gauge,
    silent: Gauge,
    drifted: Gauge,
    oldest_report_age: Gauge<f64, AtomicU64>,
}

impl FleetGauges {
    pub(crate) fn register(r: &mut Registry) -> FleetGauges {
        let g = FleetGauges {
            machines: Gauge::default(),
            up_to_date: Gauge::default(),
            behind: Gauge::default(),
            held: Gauge::default(),
            failing: Gauge::default(),
            silent: Gauge::default(),
            drifted: Gauge::default(),
            oldest_report_age: Gauge::default(),
        };
        let only = "; 0 on a replica that is not a leader a quorum confirmed within an election timeout, so the leader's word is the sum or the max over the replicas (decision 0311)";
        r.register(
            "mesh_hosts",
            format!("Machines in the model{only}"),
            g.machines.clone(),
        );
        r.register(
            "mesh_hosts_up_to_date",
            format!("Machines the leader heard within silent_after_ms, whose last send is confirmed and every module ready: what status calls up to date{only}"),
            g.up_to_date.clone(),
        );
        r.register(
            "mesh_hosts_behind",
            format!("Machines whose should-be declaration differs from their last send, or whose last send is not yet confirmed by a report (push --behind sends them){only}"),
            g.behind.clone(),
        );
        r.register(
            "mesh_hosts_held",
            format!("Machines with a push held because a running module's mount would move (push MACHINE --move MODULE releases it){only}"),
            g.held.clone(),
        );
        r.register(
            "mesh_hosts_failing",
            format!("Machines whose last report shows a module failed or stopped{only}"),
            g.failing.clone(),
        );
        r.register(
            "mesh_hosts_silent",
            format!("Machines the leader has not heard for silent_after_ms or longer (decision 0301; a host not heard since it took office counts once it has led that long); each reads SILENT in status{only}"),
            g.silent.clone(),
        );
        r.register(
            "mesh_hosts_drifted",
            format!("Machines whose last report says what they run differs from their declaration (decision 0305); each reads DRIFTED in status until a push restores it{only}"),
            g.drifted.clone(),
        );
        r.register(
            "mesh_hosts_oldest_report_age_seconds",
            format!("The longest any machine of the model has gone unheard by the leader, in seconds: since its last report (filed or only heard), or for one not heard since the leader took office, how long it has led{only}"),
            g.oldest_report_age.clone(),
        );
        g
    }

    pub(crate) fn set(&self, c: &FleetCounts) {
        let set = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        set(&self.machines, c.machines);
        set(&self.up_to_date, c.up_to_date);
        set(&self.behind, c.behind);
        set(&self.held, c.held);
        set(&self.failing, c.failing);
        set(&self.silent, c.silent);
        set(&self.drifted, c.drifted);
        self.oldest_report_age
            .set(c.oldest_report_age.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::command::HeldMount;

    fn heard(name: &str) -> MachineView {
        MachineView {
            name: name.into(),
            health: Some(Health::Ready),
            heard_ago_ms: Some(500),
            ..MachineView::default()
        }
    }

    #[test]
    fn fleet_counts_say_what_status_says_of_each_machine() {
        // Issue 25 item 6: "machines behind" and "host silent" as numbers an alert can compare,
        // counted by the rule status words them by.
        let mut behind = heard("behind");
        behind.behind = true;
        let mut held = heard("held");
        held.behind = true;
        held.holds = vec![HeldMount {
            module: "db".into(),
            mount: "data".into(),
            old_dir: "/a".into(),
            new_dir: "/b".into(),
        }];
        let mut failing = heard("failing");
        failing.health = Some(Health::Failing {
            modules: vec!["web".into()],
        });
        let mut silent = heard("silent");
        silent.heard_ago_ms = Some(9_000);
        silent.silent_for_ms = Some(9_000);
        let mut unheard = heard("unheard");
        unheard.heard_ago_ms = None;
        let mut drifted = heard("drifted");
        drifted.drifted = vec!["broker: conf/broker.conf changed".into()];
        let counts = FleetCounts::of(
            &[heard("ok"), behind, held, failing, silent, unheard, drifted],
            Duration::from_millis(9_000),
        );
        assert_eq!(
            counts,
            FleetCounts {
                machines: 7,
                up_to_date: 1,
                behind: 2,
                held: 1,
                failing: 1,
                silent: 1,
                drifted: 1,
                oldest_report_age: Duration::from_millis(9_000),
            }
        );
    }
}
