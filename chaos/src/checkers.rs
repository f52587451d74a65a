//! Checkers: pure functions over a [`History`] that name every way a run broke a guarantee.
//!
//! - [`no_acknowledged_write_lost`]: every acknowledged KV write is on every replica at the end, in
//!   log order.
//! - [`no_stale_epoch_applied`] (G2): a host never applies an envelope at or below one it accepted.
//! - [`no_stale_epoch_sent`] (G3): once a lease of term e was acquired, no envelope of an epoch below e
//!   leaves, and a machine's envelopes leave in increasing `(epoch, sequence)` order.
//! - [`accounts_never_regress`] (G5): reports filed in arrival order never move an account back.
//!
//! Each returns the violations it found; an empty list means the history passed.

use std::collections::BTreeMap;
use std::fmt;

use mesh::core::envelope::Position;
use mesh::core::report::{Account, Filed, Report, ReportPosition};
use mesh_raft::NodeId;

use crate::history::{Event, History, LogPosition, OpId, Tick, shown};

/// One broken promise found in a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The checker that found it.
    pub checker: &'static str,
    /// The event that shows it, if one does.
    pub at: Option<Tick>,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(t) => write!(f, "[{}] at #{t:06}: {}", self.checker, self.what),
            None => write!(f, "[{}] {}", self.checker, self.what),
        }
    }
}

fn violation(checker: &'static str, at: Option<Tick>, what: String) -> Violation {
    Violation { checker, at, what }
}

/// Runs every checker.
pub fn check_all(history: &History) -> Vec<Violation> {
    let mut found = complete(history);
    found.extend(no_acknowledged_write_lost(history));
    found.extend(no_stale_epoch_applied(history));
    found.extend(no_stale_epoch_sent(history));
    found.extend(accounts_never_regress(history));
    found
}

/// A history that dropped events cannot prove anything.
pub fn complete(history: &History) -> Vec<Violation> {
    if history.dropped == 0 {
        return Vec::new();
    }
    vec![violation(
        "complete",
        None,
        format!(
            "{} events were dropped (history full); shorten the run or raise events_max",
            history.dropped
        ),
    )]
}

/// A client write as the history tells it.
#[derive(Clone, Debug)]
struct Write {
    invoked: Tick,
    key: String,
    value: String,
    acked: Option<(Tick, LogPosition, Option<String>)>,
}

const writes_checker: &str = "no acknowledged write lost";

/// Every acknowledged write is readable on every replica at the end, in log order: per key, the final
/// value is the acknowledged write latest in the log or a write of unknown outcome not known to come
/// before it; each acknowledged write replaced the acknowledged write just before it in the log (or
/// a write of unknown outcome); no two acknowledged writes share a log position.
pub fn no_acknowledged_write_lost(history: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    let writes = collect_writes(history, &mut found);
    let by_key = acked_by_key(&writes);
    found.extend(log_positions_unique(&writes));
    found.extend(replaced_in_log_order(&writes, &by_key));
    found.extend(final_reads_hold_the_last_write(history, &writes, &by_key));
    found
}

fn collect_writes(history: &History, found: &mut Vec<Violation>) -> BTreeMap<OpId, Write> {
    let mut writes: BTreeMap<OpId, Write> = BTreeMap::new();
    let mut values: BTreeMap<(String, String), OpId> = BTreeMap::new();
    for (tick, event) in history.ticked() {
        match event {
            Event::WriteInvoked { op, key, value, .. } => {
                if let Some(other) = values.insert((key.clone(), value.clone()), *op) {
                    found.push(violation(
                        writes_checker,
                        Some(tick),
                        format!(
                            "ops {other} and {op} both write {key}={value}; values must be unique"
                        ),
                    ));
                }
                writes.insert(
                    *op,
                    Write {
                        invoked: tick,
                        key: key.clone(),
                        value: value.clone(),
                        acked: None,
                    },
                );
            }
            Event::WriteAcked { op, at, previous } => match writes.get_mut(op) {
                Some(w) => w.acked = Some((tick, *at, previous.clone())),
                None => found.push(violation(
                    writes_checker,
                    Some(tick),
                    format!("op {op} acknowledged but never invoked"),
                )),
            },
            _ => {}
        }
    }
    writes
}

/// Per key, the acknowledged writes in log order.
fn acked_by_key(writes: &BTreeMap<OpId, Write>) -> BTreeMap<String, Vec<&Write>> {
    let mut by_key: BTreeMap<String, Vec<&Write>> = BTreeMap::new();
    for w in writes.values() {
        if w.acked.is_some() {
            by_key.entry(w.key.clone()).or_default().push(w);
        }
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|w| w.acked.as_ref().map(|(_, at, _)| at.key()));
    }
    by_key
}

fn log_positions_unique(writes: &BTreeMap<OpId, Write>) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut seen: BTreeMap<(u64, u32), &Write> = BTreeMap::new();
    for w in writes.values() {
        let Some((tick, at, _)) = &w.acked else {
            continue;
        };
        if let Some(other) = seen.insert(at.key(), w) {
            found.push(violation(
                writes_checker,
                Some(*tick),
                format!(
                    "{}={} and {}={} were both acknowledged at {at}: one of them was overwritten in the log",
                    other.key, other.value, w.key, w.value
                ),
            ));
        }
    }
    found
}

/// Each acknowledged write's `previous` is the acknowledged write just before it in the log, or the
/// value of a write whose outcome is unknown (which may have landed in between).
fn replaced_in_log_order(
    writes: &BTreeMap<OpId, Write>,
    by_key: &BTreeMap<String, Vec<&Write>>,
) -> Vec<Violation> {
    let mut found = Vec::new();
    for (key, acked) in by_key {
        for (i, w) in acked.iter().enumerate() {
            let Some((tick, at, previous)) = &w.acked else {
                continue;
            };
            let before = i.checked_sub(1).map(|j| acked[j]);
            let fine = match (previous, before) {
                (None, None) => true,
                (None, Some(_)) => false,
                (Some(p), Some(b)) if *p == b.value => true,
                (Some(p), _) => is_unknown_write(writes, key, p),
            };
            if !fine {
                let expected = before.map(|b| b.value.as_str());
                found.push(violation(
                    writes_checker,
                    Some(*tick),
                    format!(
                        "{key}={} at {at} replaced {previous:?}, but the acknowledged write before it in the log is {expected:?}: applied out of log order or a write was lost",
                        w.value
                    ),
                ));
            }
        }
    }
    found
}

fn is_unknown_write(writes: &BTreeMap<OpId, Write>, key: &str, value: &str) -> bool {
    writes
        .values()
        .any(|w| w.key == key && w.value == value && w.acked.is_none())
}

/// On every replica that was read at the end, each key with acknowledged writes holds the last one
/// in the log, or a write of unknown outcome that no acknowledged write replaced.
fn final_reads_hold_the_last_write(
    history: &History,
    writes: &BTreeMap<OpId, Write>,
    by_key: &BTreeMap<String, Vec<&Write>>,
) -> Vec<Violation> {
    let mut reads: BTreeMap<NodeId, BTreeMap<&str, (Tick, Option<&str>)>> = BTreeMap::new();
    for (tick, event) in history.ticked() {
        if let Event::FinalRead {
            replica,
            key,
            value,
        } = event
        {
            reads
                .entry(*replica)
                .or_default()
                .insert(key, (tick, value.as_deref()));
        }
    }
    let mut found = Vec::new();
    if reads.is_empty() && !by_key.is_empty() {
        found.push(violation(
            writes_checker,
            None,
            "writes were acknowledged but no replica was read at the end".to_string(),
        ));
    }
    for (replica, held) in &reads {
        for (key, acked) in by_key {
            let Some(last) = acked.last() else { continue };
            let read = held.get(key.as_str()).copied();
            if let Some(what) = final_value_problem(writes, acked, last, read.map(|r| r.1)) {
                let at = read.map(|r| r.0);
                found.push(violation(
                    writes_checker,
                    at,
                    format!("replica {replica}, key {key}: {what}"),
                ));
            }
        }
    }
    found
}

fn final_value_problem(
    writes: &BTreeMap<OpId, Write>,
    acked: &[&Write],
    last: &Write,
    read: Option<Option<&str>>,
) -> Option<String> {
    let Some(read) = read else {
        return Some("never read at the end".to_string());
    };
    let Some(value) = read else {
        return Some(format!(
            "is empty, but {} was acknowledged",
            describe_ack(last)
        ));
    };
    if value == last.value {
        return None;
    }
    if let Some(w) = acked.iter().find(|w| w.value == value) {
        return Some(format!(
            "holds {} ({}), but the later {} is lost",
            value,
            describe_ack(w),
            describe_ack(last)
        ));
    }
    if !is_unknown_write(writes, &last.key, value) {
        return Some(format!("holds {value}, which no client wrote"));
    }
    let replaced_by = acked
        .iter()
        .find(|w| matches!(&w.acked, Some((_, _, Some(p))) if p == value));
    replaced_by.map(|w| {
        format!(
            "holds {value}, which {} replaced: that acknowledged write is lost",
            describe_ack(w)
        )
    })
}

fn describe_ack(w: &Write) -> String {
    match &w.acked {
        Some((tick, at, _)) => format!("{}={} (acked at #{tick:06}, {at})", w.key, w.value),
        None => format!("{}={} (invoked at #{:06})", w.key, w.value, w.invoked),
    }
}

const applied_checker: &str = "no stale epoch applied";

/// G2 at the host: per machine, each applied envelope is strictly above every one applied before it,
/// and once an envelope of epoch e was applied, nothing of an epoch below e is applied afterwards.
pub fn no_stale_epoch_applied(history: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut high: BTreeMap<&str, (Tick, Position)> = BTreeMap::new();
    for (tick, event) in history.ticked() {
        let Event::EnvelopeApplied {
            machine, position, ..
        } = event
        else {
            continue;
        };
        if let Some((then, accepted)) = high.get(machine.as_str()).copied() {
            if position.epoch < accepted.epoch {
                found.push(violation(
                    applied_checker,
                    Some(tick),
                    format!(
                        "host {machine} applied {position}, of an epoch older than {accepted} applied at #{then:06}"
                    ),
                ));
                continue;
            }
            if *position <= accepted {
                found.push(violation(
                    applied_checker,
                    Some(tick),
                    format!(
                        "host {machine} applied {position}, not above {accepted} applied at #{then:06}"
                    ),
                ));
                continue;
            }
        }
        high.insert(machine, (tick, *position));
    }
    found
}

const sent_checker: &str = "no stale epoch sent";

/// G3 at the leader: once any replica acquired a lease of term e, no envelope of an epoch below e is
/// sent afterwards; and per machine, each envelope sent is above every one sent before it (sequences
/// come from the log, so a new leader continues where the old one stopped).
pub fn no_stale_epoch_sent(history: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut newest_lease: Option<(Tick, NodeId, u64)> = None;
    let mut high: BTreeMap<&str, (Tick, Position)> = BTreeMap::new();
    for (tick, event) in history.ticked() {
        match event {
            Event::LeaseAcquired { replica, term }
                if newest_lease.is_none_or(|(_, _, t)| *term > t) =>
            {
                newest_lease = Some((tick, *replica, *term));
            }
            Event::EnvelopeSent {
                replica,
                machine,
                position,
            } => {
                if let Some((then, holder, term)) = newest_lease
                    && position.epoch < term
                {
                    found.push(violation(
                        sent_checker,
                        Some(tick),
                        format!(
                            "replica {replica} sent {machine} {position} after replica {holder} acquired a lease of term {term} at #{then:06}"
                        ),
                    ));
                }
                if let Some((then, sent)) = high.get(machine.as_str()).copied()
                    && *position <= sent
                {
                    found.push(violation(
                        sent_checker,
                        Some(tick),
                        format!(
                            "replica {replica} sent {machine} {position}, not above {sent} sent at #{then:06}"
                        ),
                    ));
                    continue;
                }
                high.insert(machine, (tick, *position));
            }
            _ => {}
        }
    }
    found
}

const accounts_checker: &str = "accounts never regress";

/// G5: per machine, feeding the reports through [`Account::file`] in arrival order gives the verdict
/// the controller recorded, and the controller's account position never decreases.
pub fn accounts_never_regress(history: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut replayed: BTreeMap<&str, Account> = BTreeMap::new();
    let mut recorded: BTreeMap<&str, (Tick, ReportPosition)> = BTreeMap::new();
    for (tick, event) in history.ticked() {
        let Event::ReportFiled {
            machine,
            got,
            accepted,
            account,
        } = event
        else {
            continue;
        };
        let model = replayed.entry(machine).or_default();
        let verdict = model.file(report_at(machine, *got));
        let model_accepted = verdict == Filed::Accepted;
        if model_accepted != *accepted {
            found.push(violation(
                accounts_checker,
                Some(tick),
                format!(
                    "report {machine} {got} was {} but filing in arrival order {} it",
                    if *accepted { "filed" } else { "refused" },
                    if model_accepted { "files" } else { "refuses" },
                ),
            ));
        }
        if let Some((then, before)) = recorded.get(machine.as_str()).copied()
            && account.is_none_or(|now| now < before)
        {
            found.push(violation(
                accounts_checker,
                Some(tick),
                format!(
                    "account of {machine} went back from {before} (#{then:06}) to {}",
                    shown(account)
                ),
            ));
        }
        if let Some(now) = account {
            recorded.insert(machine, (tick, *now));
        }
    }
    found
}

fn report_at(machine: &str, at: ReportPosition) -> Report {
    Report {
        machine: machine.to_string(),
        epoch: at.epoch,
        sequence: at.sequence,
        report_sequence: at.report_sequence,
        applied: None,
        modules: Vec::new(),
        refused_older: 0,
        last_refusal: None,
        proof: None,
    }
}
