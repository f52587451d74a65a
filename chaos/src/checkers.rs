//! The checkers: pure functions from a run's history and the store's final state to the violations
//! they found. Each one is named after the guarantee it checks; docs/chaos.md says how each was
//! broken by hand once and seen to fail.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use mesh::core::report::ReportPosition;
use mesh::store::command::SendRecord;

use crate::history::{Answered, Event, History, Op, OpId, Tick};

/// The checkers, by name, in the order they run.
pub const checker_names: [&str; 12] = [
    "history complete",
    "no stale epoch written",
    "no host applies at or below its mark",
    "every applied envelope has its send record",
    "no push runs twice",
    "a push names the machines it recorded",
    "accounts never regress",
    "each refusal counted once",
    "acknowledged writes survive",
    "converged after heal",
    "no epoch reused after a restore",
    "replicas agree at the end",
];

/// One broken guarantee, with the tick it was seen at (when there is one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub checker: &'static str,
    pub tick: Option<Tick>,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tick {
            Some(t) => write!(f, "{} at #{t:06}: {}", self.checker, self.what),
            None => write!(f, "{}: {}", self.checker, self.what),
        }
    }
}

fn violation(checker: &'static str, tick: Option<Tick>, what: String) -> Violation {
    Violation {
        checker,
        tick,
        what,
    }
}

/// What the store held at the end of a run (read from the leader once every replica caught up,
/// after the hosts stopped).
#[derive(Clone, Debug, Default)]
pub struct Final {
    /// Every send record ever committed (the `sends` table).
    pub sends: Vec<SendRecord>,
    /// `module/db` settings.
    pub settings: BTreeMap<String, String>,
    /// `CHAOS_APPLY` of module `worker` in the model.
    pub apply_tag: Option<u64>,
    /// Per machine: the account's last position and its refusal count.
    pub accounts: BTreeMap<String, (Option<ReportPosition>, u64)>,
    /// Machines that did not apply their should-be within the deadline after the heal, and why.
    pub not_converged: Vec<String>,
    /// Replicas whose state or sends differ from the leader's at the same applied index.
    pub disagree: Vec<String>,
}

/// Runs every checker.
pub fn check_all(history: &History, last: &Final) -> Vec<Violation> {
    let mut out = complete(history);
    out.extend(no_stale_epoch_written(history));
    out.extend(no_apply_at_or_below_mark(history));
    out.extend(applied_has_send_record(history, last));
    out.extend(no_push_runs_twice(last));
    out.extend(push_names_recorded_machines(history, last));
    out.extend(accounts_never_regress(history));
    out.extend(each_refusal_counted_once(history, last));
    out.extend(acknowledged_writes_survive(history, last));
    out.extend(converged(last));
    out.extend(no_epoch_reused_after_restore(history));
    out.extend(replicas_agree(last));
    out
}

/// Every replica holds the same state and sends once all applied the same index (a store
/// rebuilt from the leader's snapshot, restored from a backup or restarted from its files).
pub fn replicas_agree(last: &Final) -> Vec<Violation> {
    last.disagree
        .iter()
        .map(|why| violation(checker_names[11], None, why.clone()))
        .collect()
}

/// The tick of the last whole-cluster restore, if any: what the store holds at the end was
/// written after it (or is in the backup), so the store-based checks look only after it.
pub fn last_restore(history: &History) -> Option<Tick> {
    history
        .ticked()
        .filter(|(_, e)| matches!(e, Event::Restored { .. }))
        .map(|(t, _)| t)
        .last()
}

/// G9: after a restore from an older backup, every envelope written is of an epoch above every
/// epoch any host applied before the restore (hosts keep their marks: a reused epoch would be
/// refused, or accepted as a duplicate position).
pub fn no_epoch_reused_after_restore(history: &History) -> Vec<Violation> {
    let mut applied_max: Option<(u64, &str, Tick)> = None;
    let mut floor: Option<(u64, &str, Tick)> = None;
    let mut out = Vec::new();
    for (tick, e) in history.ticked() {
        match e {
            Event::HostApplied { machine, epoch, .. }
                if applied_max.is_none_or(|(m, _, _)| *epoch > m) =>
            {
                applied_max = Some((*epoch, machine, tick));
            }
            Event::Restored { .. } => floor = applied_max,
            Event::WriteAllowed {
                replica,
                machine,
                epoch,
                sequence,
            } => {
                if let Some((max, by, at)) = floor
                    && *epoch <= max
                {
                    out.push(violation(
                        checker_names[10],
                        Some(tick),
                        format!(
                            "replica {replica} wrote envelope {epoch}.{sequence} to {machine} after the restore, but {by} had applied epoch {max} before it (#{at:06})"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// A history that dropped events cannot be checked.
pub fn complete(history: &History) -> Vec<Violation> {
    if history.dropped == 0 {
        return vec![];
    }
    vec![violation(
        checker_names[0],
        None,
        format!(
            "{} events dropped: the history is incomplete",
            history.dropped
        ),
    )]
}

/// G3: once a lease of term e was granted to any replica, no write gate lets an envelope of an
/// epoch below e leave.
pub fn no_stale_epoch_written(history: &History) -> Vec<Violation> {
    let mut granted: Option<(u64, u64, Tick)> = None;
    let mut out = Vec::new();
    for (tick, e) in history.ticked() {
        match e {
            // Terms after a restore are the restored cluster's: "no epoch reused after a
            // restore" checks them against what came before.
            Event::Restored { .. } => granted = None,
            Event::LeaseGranted { replica, term } => {
                if granted.is_none_or(|(t, _, _)| *term > t) {
                    granted = Some((*term, *replica, tick));
                }
            }
            Event::WriteAllowed {
                replica,
                machine,
                epoch,
                sequence,
            } => {
                if let Some((term, by, at)) = granted
                    && *epoch < term
                {
                    out.push(violation(
                        checker_names[1],
                        Some(tick),
                        format!(
                            "replica {replica} wrote envelope {epoch}.{sequence} to {machine} after replica {by} was granted a lease in term {term} (#{at:06})"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// G2: each machine applies strictly increasing `(epoch, sequence)`, across its restarts.
pub fn no_apply_at_or_below_mark(history: &History) -> Vec<Violation> {
    let mut marks: BTreeMap<&str, (u64, u64, Tick)> = BTreeMap::new();
    let mut out = Vec::new();
    for (tick, e) in history.ticked() {
        if let Event::HostApplied {
            machine,
            epoch,
            sequence,
            ..
        } = e
        {
            if let Some((me, ms, at)) = marks.get(machine.as_str())
                && (*epoch, *sequence) <= (*me, *ms)
            {
                let how = if epoch < me {
                    "an older epoch after a newer one"
                } else {
                    "at or below its mark"
                };
                out.push(violation(
                    checker_names[2],
                    Some(tick),
                    format!(
                        "{machine} applied {epoch}.{sequence}, {how} ({me}.{ms} applied at #{at:06})"
                    ),
                ));
                continue;
            }
            marks.insert(machine, (*epoch, *sequence, tick));
        }
    }
    out
}

/// G4: every envelope a host applied was recorded first: a committed send record of the same
/// machine, epoch and sequence with the same digest.
pub fn applied_has_send_record(history: &History, last: &Final) -> Vec<Violation> {
    let records: BTreeMap<(&str, u64), &SendRecord> = last
        .sends
        .iter()
        .map(|s| ((s.machine.as_str(), s.sequence), s))
        .collect();
    let mut out = Vec::new();
    // The sends between an older backup and its restore are gone from the store.
    let from = last_restore(history).unwrap_or(0);
    for (tick, e) in history.ticked().filter(|(t, _)| *t >= from) {
        let Event::HostApplied {
            machine,
            epoch,
            sequence,
            digest,
        } = e
        else {
            continue;
        };
        match records.get(&(machine.as_str(), *sequence)) {
            None => out.push(violation(
                checker_names[3],
                Some(tick),
                format!("{machine} applied {epoch}.{sequence} but the store has no send record of it"),
            )),
            Some(r) if r.epoch != *epoch || r.digest.short() != *digest => out.push(violation(
                checker_names[3],
                Some(tick),
                format!(
                    "{machine} applied {epoch}.{sequence} digest {digest}; the send record says {}.{} digest {}",
                    r.epoch,
                    r.sequence,
                    r.digest.short()
                ),
            )),
            Some(_) => {}
        }
    }
    out
}

/// One push (one `why`, unique per request) sends each machine at most once: a push that ran
/// again (a retried or relayed request run twice) records a machine twice.
pub fn no_push_runs_twice(last: &Final) -> Vec<Violation> {
    let mut seen: BTreeMap<(&str, &str), &SendRecord> = BTreeMap::new();
    let mut out = Vec::new();
    for s in &last.sends {
        if let Some(first) = seen.insert((s.why.as_str(), s.machine.as_str()), s) {
            out.push(violation(
                checker_names[4],
                None,
                format!(
                    "push {:?} recorded {} twice: {}.{} and {}.{}",
                    s.why, s.machine, first.epoch, first.sequence, s.epoch, s.sequence
                ),
            ));
        }
    }
    out
}

/// A push's answer names every machine the store recorded a send for under it, with the same
/// sequence and digest; it claims no send the store does not have; a refused push recorded nothing.
pub fn push_names_recorded_machines(history: &History, last: &Final) -> Vec<Violation> {
    let mut pushes: BTreeMap<OpId, &str> = BTreeMap::new();
    let mut out = Vec::new();
    // A push before a restore from an older backup may have recorded sends the store lost.
    let from = last_restore(history).unwrap_or(0);
    for (tick, e) in history.ticked() {
        match e {
            Event::Invoked {
                op,
                what: Op::Push { why, .. },
                ..
            } if tick >= from => {
                pushes.insert(*op, why);
            }
            Event::Done { op, answer } => {
                let Some(why) = pushes.get(op) else { continue };
                let recorded: BTreeMap<&str, &SendRecord> = last
                    .sends
                    .iter()
                    .filter(|s| s.why == *why)
                    .map(|s| (s.machine.as_str(), s))
                    .collect();
                match answer {
                    Answered::Ok { lines } => {
                        let named: BTreeMap<&str, &Option<(u64, String)>> =
                            lines.iter().map(|(m, s)| (m.as_str(), s)).collect();
                        for (m, r) in &recorded {
                            match named.get(m) {
                                None => out.push(violation(
                                    checker_names[5],
                                    Some(tick),
                                    format!("push {why:?} recorded a send to {m} its answer does not name"),
                                )),
                                Some(Some((seq, digest)))
                                    if *seq > 0 && (*seq != r.sequence || *digest != r.digest.short()) =>
                                {
                                    out.push(violation(
                                        checker_names[5],
                                        Some(tick),
                                        format!(
                                            "push {why:?} answered {m} sent as {seq} {digest}; the record is {} {}",
                                            r.sequence,
                                            r.digest.short()
                                        ),
                                    ))
                                }
                                Some(_) => {}
                            }
                        }
                        for (m, sent) in &named {
                            if sent.is_some() && !recorded.contains_key(m) {
                                out.push(violation(
                                    checker_names[5],
                                    Some(tick),
                                    format!("push {why:?} answered a send to {m} the store never recorded"),
                                ));
                            }
                        }
                    }
                    Answered::Refused(reason) if !recorded.is_empty() => out.push(violation(
                        checker_names[5],
                        Some(tick),
                        format!(
                            "push {why:?} was refused ({reason}) yet recorded sends to {:?}",
                            recorded.keys().collect::<Vec<_>>()
                        ),
                    )),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    out
}

/// G5: on every replica, each machine's account position and refusal count never move back.
pub fn accounts_never_regress(history: &History) -> Vec<Violation> {
    let mut seen: BTreeMap<(u64, &str), (Option<ReportPosition>, u64, Tick)> = BTreeMap::new();
    let mut out = Vec::new();
    for (tick, e) in history.ticked() {
        // A store lost or restored starts its accounts again (from a snapshot or the backup).
        match e {
            Event::StoreWiped { replica } => seen.retain(|(r, _), _| r != replica),
            Event::Restored { .. } => seen.clear(),
            _ => {}
        }
        let Event::AccountSeen {
            replica,
            machine,
            last,
            refused_older,
        } = e
        else {
            continue;
        };
        if let Some((before, refused, at)) = seen.get(&(*replica, machine.as_str()))
            && (*last < *before || refused_older < refused)
        {
            out.push(violation(
                checker_names[6],
                Some(tick),
                format!(
                    "replica {replica}'s account of {machine} moved back from {before:?} (refused {refused}, #{at:06}) to {last:?} (refused {refused_older})"
                ),
            ));
        }
        seen.insert((*replica, machine), (*last, *refused_older, tick));
    }
    out
}

/// G5: every report the leader refused as not newer is counted once. A report delivered after
/// one at or past it was delivered must have been refused (the lower bound); the count may exceed
/// those only by deliveries whose outcome is unknown (failed ones, and ones after a failed
/// delivery at or past them).
pub fn each_refusal_counted_once(history: &History, last: &Final) -> Vec<Violation> {
    let mut best: BTreeMap<&str, ReportPosition> = BTreeMap::new();
    let mut failed_best: BTreeMap<&str, ReportPosition> = BTreeMap::new();
    let mut low: BTreeMap<&str, u64> = BTreeMap::new();
    let mut high: BTreeMap<&str, u64> = BTreeMap::new();
    // The most refusals any replica's account showed: after a restore the account counts on
    // from the backup's count, which is at most that.
    let mut seen_refused: BTreeMap<&str, u64> = BTreeMap::new();
    for (_, e) in history.ticked() {
        match e {
            Event::AccountSeen {
                machine,
                refused_older,
                ..
            } => {
                let r = seen_refused.entry(machine.as_str()).or_default();
                *r = (*r).max(*refused_older);
            }
            Event::Restored { .. } => {
                best.clear();
                failed_best.clear();
                low.clear();
                high = seen_refused.clone();
            }
            _ => {}
        }
        let Event::ReportDelivered {
            machine,
            position,
            ok,
        } = e
        else {
            continue;
        };
        let m = machine.as_str();
        if !ok {
            *high.entry(m).or_default() += 1;
            let f = failed_best.entry(m).or_insert(*position);
            *f = (*f).max(*position);
            continue;
        }
        if best.get(m).is_some_and(|b| *position <= *b) {
            *low.entry(m).or_default() += 1;
            *high.entry(m).or_default() += 1;
        } else if failed_best.get(m).is_some_and(|f| *position <= *f) {
            *high.entry(m).or_default() += 1;
        }
        let b = best.entry(m).or_insert(*position);
        *b = (*b).max(*position);
    }
    let mut out = Vec::new();
    for (m, (_, counted)) in &last.accounts {
        let (l, h) = (
            low.get(m.as_str()).copied().unwrap_or(0),
            high.get(m.as_str()).copied().unwrap_or(0),
        );
        if *counted < l || *counted > h {
            out.push(violation(
                checker_names[7],
                None,
                format!(
                    "{m}'s account counts {counted} refused reports; the deliveries allow {l} to {h}"
                ),
            ));
        }
    }
    out
}

/// Every acknowledged operator write survives: each settings key and the model end as the last
/// acknowledged write left them, or as a later write whose outcome is unknown; a refused write
/// never shows.
pub fn acknowledged_writes_survive(history: &History, last: &Final) -> Vec<Violation> {
    // Per thing written ("setting <key>" or "model"): (value, op, answer) in invoke order.
    let mut invoked: BTreeMap<OpId, (String, String)> = BTreeMap::new();
    let mut writes: BTreeMap<String, Vec<(String, Option<Answered>)>> = BTreeMap::new();
    let mut index: BTreeMap<OpId, (String, usize)> = BTreeMap::new();
    // Values any write before the last restore may have left in the backup.
    let mut before_restore: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    for (_, e) in history.ticked() {
        match e {
            Event::Restored { .. } => {
                for (thing, list) in std::mem::take(&mut writes) {
                    let kept = before_restore.entry(thing).or_default();
                    kept.insert(None);
                    kept.extend(list.into_iter().map(|(v, _)| Some(v)));
                }
                index.clear();
            }
            Event::Invoked { op, what, .. } => {
                let (thing, value) = match what {
                    Op::Set { key, value } => (format!("setting {key}"), value.clone()),
                    Op::Apply { tag } => ("model".to_string(), tag.to_string()),
                    Op::Push { .. } => continue,
                };
                let list = writes.entry(thing.clone()).or_default();
                index.insert(*op, (thing.clone(), list.len()));
                list.push((value.clone(), None));
                invoked.insert(*op, (thing, value));
            }
            Event::Done { op, answer } => {
                if let Some((thing, i)) = index.get(op)
                    && let Some(w) = writes.get_mut(thing).and_then(|l| l.get_mut(*i))
                {
                    w.1 = Some(answer.clone());
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (thing, list) in &writes {
        let now = match thing.strip_prefix("setting ") {
            Some(key) => last.settings.get(key).cloned(),
            None => last.apply_tag.map(|t| t.to_string()),
        };
        let acked = list
            .iter()
            .rposition(|(_, a)| matches!(a, Some(Answered::Ok { .. })));
        let mut allowed: BTreeSet<Option<String>> = BTreeSet::new();
        match acked {
            Some(i) => {
                allowed.insert(Some(list[i].0.clone()));
            }
            // Nothing acknowledged since a restore: whatever the backup held.
            None if before_restore.contains_key(thing) => {
                allowed.extend(before_restore[thing].iter().cloned());
            }
            // Nothing acknowledged: the value before the run, or any write that may have happened.
            None => {
                allowed.insert(None);
            }
        }
        let from = acked.map_or(0, |i| i + 1);
        for (value, answer) in &list[from..] {
            if !matches!(answer, Some(Answered::Refused(_))) {
                allowed.insert(Some(value.clone()));
            }
        }
        if !allowed.contains(&now) {
            out.push(violation(
                checker_names[8],
                None,
                format!(
                    "{thing} ends as {now:?}; the last acknowledged write {} leaves only {allowed:?}",
                    acked.map_or("(none)".to_string(), |i| list[i].0.clone())
                ),
            ));
        }
    }
    out
}

/// After the heal every machine applied its should-be within the deadline.
pub fn converged(last: &Final) -> Vec<Violation> {
    last.not_converged
        .iter()
        .map(|why| violation(checker_names[9], None, why.clone()))
        .collect()
}
