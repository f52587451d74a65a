//! The checkers: pure functions from a run's history and the store's final state to the violations
//! they found. Each one is named after the guarantee it checks; docs/chaos.md says how each was
//! broken by hand once and seen to fail.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use mesh::core::report::ReportPosition;
use mesh::store::command::SendRecord;

use crate::history::{Answered, Event, History, Op, OpId, Tick};
use crate::linear::{self, Kind, RegisterOp, Stuck, Verdict};

/// The checkers, by name, in the order they run.
pub const checker_names: [&str; 16] = [
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
    "the history of operator writes is linearizable",
    "every other host's reports are filed within the usual bound",
    "memory stays under its bound",
    "no hostile message is taken",
];

/// How long a host's report may take from its sink's first try to its filing while the hostile
/// peer plays and no other fault does: one attempt of the host's sink
/// (`report_request_timeout_ms`, 2,000 ms: past it the host gives the attempt up), which is also
/// how long a run waits for a push's reports before it pushes again (`run::settle_ms`).
/// Unloaded, a report is filed in one commit round (about 10–60 ms here).
pub const report_filed_ms_max: u64 = mesh::host::sink::report_request_timeout_ms;

/// The most resident memory a run's process may hold, in bytes (768 MiB). Measured (debug
/// build, runs one after another in one process, the hostile peer's own copies included): 197–327
/// MiB over hostile seeds 1–6, 440 MiB at most with the per-host report quota removed and a flood
/// of 64 reports of 500 KiB at once. The bounds let a hostile host hold little: frames of at most
/// `report_frame_bytes_max` (1 MiB), at most `reports_in_flight_per_host_max` (4) of its reports
/// queued, a report decoded with at most 1,024 modules. 768 MiB leaves room for a loaded machine's
/// slower runs without hiding a leak of hundreds of MiB.
pub const rss_bytes_max: u64 = 768 * 1024 * 1024;

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
    /// The revision of every model apply in the store's history, with the apply's `why`. The
    /// revision also counts settings changes, mints and revocations: the model at revision r is
    /// the one of the last apply at or below r.
    pub model_whys: BTreeMap<u64, String>,
    /// The store's revision.
    pub revision: u64,
    /// Per machine: the account's last position and its refusal count.
    pub accounts: BTreeMap<String, (Option<ReportPosition>, u64)>,
    /// Machines that did not apply their should-be within the deadline after the heal, and why.
    pub not_converged: Vec<String>,
    /// Replicas whose state or sends differ from the leader's at the same applied index.
    pub disagree: Vec<String>,
}

/// Every checker's violations, and the keys the linearizability search could not decide.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    pub violations: Vec<Violation>,
    pub undecided: Vec<String>,
}

/// Runs every checker; the violations only (see [`check_run`] for the undecided keys too).
pub fn check_all(history: &History, last: &Final) -> Vec<Violation> {
    check_run(history, last).violations
}

/// Runs every checker.
pub fn check_run(history: &History, last: &Final) -> Checked {
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
    out.extend(reports_filed_within_bound(history));
    out.extend(memory_within_bound(history));
    out.extend(no_hostile_message_taken(history));
    let linearized = operator_writes_linearizable(history, last);
    out.extend(linearized.violations);
    Checked {
        violations: out,
        undecided: linearized.undecided,
    }
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
            Event::LeaseGranted { replica, term } if granted.is_none_or(|(t, _, _)| *term > t) => {
                granted = Some((*term, *replica, tick));
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

/// G5: every report the leader refused as not newer is counted once. The lower bound is the
/// deliveries a replica must have refused: one at or below a report the same replica took earlier
/// while no lease of a newer term was granted since (its heard positions are still its own), or
/// below what that replica's store had already filed (strictly: the delivery's own filing may be
/// seen before the delivery is recorded, which is when its answer came). The count may exceed those only by
/// deliveries that may have been refused: after another delivery at or past them (taken by
/// another replica, or by one whose leadership may have changed since: decision 0216 keeps heard
/// positions in the leader's memory for its term only), and deliveries whose outcome is unknown.
pub fn each_refusal_counted_once(history: &History, last: &Final) -> Vec<Violation> {
    // Per machine, the best position any replica took.
    let mut best: BTreeMap<&str, ReportPosition> = BTreeMap::new();
    // Per (machine, replica that took it, newest lease term when it did): the best position.
    let mut taken: BTreeMap<(&str, u64, u64), ReportPosition> = BTreeMap::new();
    // Per (machine, replica): the best position that replica's store filed.
    let mut filed: BTreeMap<(&str, u64), ReportPosition> = BTreeMap::new();
    let mut failed_best: BTreeMap<&str, ReportPosition> = BTreeMap::new();
    let mut low: BTreeMap<&str, u64> = BTreeMap::new();
    let mut high: BTreeMap<&str, u64> = BTreeMap::new();
    let mut term = 0;
    // The most refusals any replica's account showed: after a restore the account counts on
    // from the backup's count, which is at most that.
    let mut seen_refused: BTreeMap<&str, u64> = BTreeMap::new();
    for (_, e) in history.ticked() {
        match e {
            Event::AccountSeen {
                replica,
                machine,
                last,
                refused_older,
            } => {
                let r = seen_refused.entry(machine.as_str()).or_default();
                *r = (*r).max(*refused_older);
                if let Some(last) = last {
                    let f = filed.entry((machine.as_str(), *replica)).or_insert(*last);
                    *f = (*f).max(*last);
                }
            }
            Event::LeaseGranted { term: t, .. } => term = term.max(*t),
            Event::StoreWiped { replica } => filed.retain(|(_, r), _| r != replica),
            Event::Restored { .. } => {
                best.clear();
                taken.clear();
                filed.clear();
                failed_best.clear();
                low.clear();
                high = seen_refused.clone();
                term = 0;
            }
            _ => {}
        }
        let Event::ReportDelivered {
            machine,
            position,
            ok,
            by,
            ..
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
        let must = by.is_some_and(|r| {
            taken.get(&(m, r, term)).is_some_and(|t| *position <= *t)
                || filed.get(&(m, r)).is_some_and(|f| *position < *f)
        });
        if must {
            *low.entry(m).or_default() += 1;
            *high.entry(m).or_default() += 1;
        } else if best.get(m).is_some_and(|b| *position <= *b)
            || failed_best.get(m).is_some_and(|f| *position <= *f)
        {
            *high.entry(m).or_default() += 1;
        }
        let b = best.entry(m).or_insert(*position);
        *b = (*b).max(*position);
        if let Some(r) = by {
            let t = taken.entry((m, *r, term)).or_insert(*position);
            *t = (*t).max(*position);
        }
    }
    let mut out = Vec::new();
    for (m, (_, counted)) in &last.accounts {
        // The hostile peer's machine: its deliveries are not recorded (it is no host of the
        // bed), and its replays are refused and counted on purpose.
        if m == crate::hostile::hostile_machine {
            continue;
        }
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

/// Every acknowledged operator write survives: each settings key and the model end as a write
/// left them that no acknowledged write followed in real time (one invoked after it was
/// answered), or as a write whose outcome is unknown (it may take effect at any time after it was
/// invoked); a refused write never shows. With one writer per key this is "the last acknowledged
/// write, or a later one of unknown outcome"; with several, any acknowledged write that no other
/// acknowledged write strictly followed may end last.
pub fn acknowledged_writes_survive(history: &History, last: &Final) -> Vec<Violation> {
    struct Write {
        value: String,
        invoked: Tick,
        done: Option<(Tick, Answered)>,
    }
    // Per thing written ("setting <key>" or "model"), in invoke order.
    let mut writes: BTreeMap<String, Vec<Write>> = BTreeMap::new();
    let mut index: BTreeMap<OpId, (String, usize)> = BTreeMap::new();
    // Values any write before the last restore may have left in the backup.
    let mut before_restore: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    for (tick, e) in history.ticked() {
        match e {
            Event::Restored { .. } => {
                for (thing, list) in std::mem::take(&mut writes) {
                    let kept = before_restore.entry(thing).or_default();
                    kept.insert(None);
                    kept.extend(list.into_iter().map(|w| Some(w.value)));
                }
                index.clear();
            }
            Event::Invoked { op, what, .. } => {
                let (thing, value) = match what {
                    Op::Set { key, value } => (format!("setting {key}"), value.clone()),
                    Op::Apply { tag } => ("model".to_string(), tag.to_string()),
                    Op::Push { .. } | Op::Read | Op::ReadModel => continue,
                };
                let list = writes.entry(thing.clone()).or_default();
                index.insert(*op, (thing, list.len()));
                list.push(Write {
                    value,
                    invoked: tick,
                    done: None,
                });
            }
            Event::Done { op, answer } => {
                if let Some((thing, i)) = index.get(op)
                    && let Some(w) = writes.get_mut(thing).and_then(|l| l.get_mut(*i))
                {
                    w.done = Some((tick, answer.clone()));
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
        let acked: Vec<&Write> = list
            .iter()
            .filter(|w| matches!(w.done, Some((_, Answered::Ok { .. }))))
            .collect();
        let mut allowed: BTreeSet<Option<String>> = BTreeSet::new();
        if acked.is_empty() {
            match before_restore.get(thing) {
                // Nothing acknowledged since a restore: whatever the backup held.
                Some(kept) => allowed.extend(kept.iter().cloned()),
                // Nothing acknowledged: the value before the run.
                None => {
                    allowed.insert(None);
                }
            }
        }
        for w in list {
            let answered_at = match &w.done {
                Some((_, Answered::Refused(_))) => continue,
                Some((t, Answered::Ok { .. })) => Some(*t),
                // Unknown (or no answer at all): it may take effect any time after its invocation.
                _ => None,
            };
            let followed = answered_at.is_some_and(|t| acked.iter().any(|a| a.invoked > t));
            if !followed {
                allowed.insert(Some(w.value.clone()));
            }
        }
        if !allowed.contains(&now) {
            out.push(violation(
                checker_names[8],
                None,
                format!(
                    "{thing} ends as {now:?}; the acknowledged writes (the last invoked: {}) leave only {allowed:?}",
                    acked
                        .last()
                        .map_or("(none)".to_string(), |w| w.value.clone())
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

/// States the linearizability search explores per key at most; a key whose search reaches it is
/// reported undecided (neither passed nor failed).
pub const linearizable_states_max: u64 = 1_000_000;

/// What "the history of operator writes is linearizable" found: violations, and the keys whose
/// search hit [`linearizable_states_max`] (undecided: counted apart, never passed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Linearized {
    pub violations: Vec<Violation>,
    pub undecided: Vec<String>,
}

/// Each settings key of `module/db`, and the model, as registers, are linearizable over the
/// operators' writes and reads and the store's value at the end (a read after every operation
/// ended). A settings key is read by `settings show module/db`; the model by `plan cor`, whose
/// revision names the apply through the store's model history (its `why` carries the apply's
/// tag). An acknowledged write takes effect once between its invocation and its answer; a write of
/// unknown outcome at any point after its invocation, or never; a refused one never (the API's
/// promise for the refused and invalid classes); a read that failed constrains nothing. Registers
/// are checked one at a time (P-compositionality). After a restore from an older backup only what
/// was invoked after the last restore is checked, from any value written before it (or none): the
/// backup may hold any of them.
pub fn operator_writes_linearizable(history: &History, last: &Final) -> Linearized {
    let from = last_restore(history);
    let mut invoked: BTreeMap<OpId, (Tick, u64, &Op)> = BTreeMap::new();
    // Per register ("setting <key>", "model"): the writes and their answers since the last restore.
    let mut writes: BTreeMap<String, Vec<RegisterOp>> = BTreeMap::new();
    let mut refused: BTreeMap<(String, String), OpId> = BTreeMap::new();
    let mut reads: Vec<(RegisterOp, &BTreeMap<String, String>)> = Vec::new();
    let mut model_reads: Vec<RegisterOp> = Vec::new();
    let mut before: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    // The newest lease granted so far (replica, term, tick), and the one when each read began:
    // a failure message says which replica held it when a read was answered elsewhere.
    let mut lease: Option<(u64, u64, Tick)> = None;
    let mut lease_at: BTreeMap<OpId, Option<(u64, u64, Tick)>> = BTreeMap::new();
    let read_about = |op: &OpId, via: u64, replica: u64, lease_at: &BTreeMap<_, _>| {
        format!(
            "read via replica {via}, answered by replica {replica}{}",
            match lease_at.get(op).copied().flatten() {
                Some((r, t, at)) if r != replica =>
                    format!("; replica {r} was granted the newest lease, term {t}, at #{at:06}"),
                _ => String::new(),
            }
        )
    };
    for (tick, e) in history.ticked() {
        match e {
            Event::Restored { .. } => lease = None,
            Event::LeaseGranted { replica, term } if lease.is_none_or(|(_, t, _)| *term > t) => {
                lease = Some((*replica, *term, tick));
            }
            Event::Invoked { op, via, what } => {
                invoked.insert(*op, (tick, *via, what));
                lease_at.insert(*op, lease);
            }
            Event::Done { op, answer } => {
                let Some((at, via, what)) = invoked.remove(op) else {
                    continue;
                };
                let since = from.is_none_or(|r| at > r);
                if let Some((register, value, what)) = written(what) {
                    match answer {
                        Answered::Refused(_) => {
                            refused.insert((register, value), *op);
                        }
                        _ if !since => {
                            before.entry(register).or_default().insert(Some(value));
                        }
                        answer => {
                            let acked = matches!(answer, Answered::Ok { .. });
                            writes.entry(register).or_default().push(RegisterOp {
                                op: *op,
                                invoked: at,
                                done: acked.then_some(tick),
                                kind: Kind::Write(value),
                                about: format!(
                                    "{what} via replica {via}, {}",
                                    if acked {
                                        "acknowledged".to_string()
                                    } else {
                                        format!("outcome unknown ({answer:?})")
                                    }
                                ),
                            });
                        }
                    }
                    continue;
                }
                match (what, answer) {
                    (Op::Read, Answered::Read { replica, values }) if since => {
                        let read = RegisterOp {
                            op: *op,
                            invoked: at,
                            done: Some(tick),
                            kind: Kind::Read(None),
                            about: read_about(op, via, *replica, &lease_at),
                        };
                        reads.push((read, values));
                    }
                    (Op::ReadModel, Answered::Model { replica, revision }) if since => {
                        model_reads.push(RegisterOp {
                            op: *op,
                            invoked: at,
                            done: Some(tick),
                            kind: Kind::Read(model_value(*revision, last)),
                            about: format!(
                                "plan of revision {revision} {}",
                                read_about(op, via, *replica, &lease_at)
                            ),
                        });
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    // Writes never answered (the run ended first): outcome unknown.
    for (op, (at, via, what)) in invoked {
        if let Some((register, value, what)) = written(what)
            && from.is_none_or(|r| at > r)
        {
            writes.entry(register).or_default().push(RegisterOp {
                op,
                invoked: at,
                done: None,
                kind: Kind::Write(value),
                about: format!("{what} via replica {via}, never answered"),
            });
        }
    }
    let mut keys: BTreeSet<String> = writes
        .keys()
        .filter_map(|r| r.strip_prefix("setting ").map(String::from))
        .collect();
    keys.extend(
        before
            .keys()
            .filter_map(|r| r.strip_prefix("setting ").map(String::from)),
    );
    keys.extend(last.settings.keys().cloned());
    for (_, values) in &reads {
        keys.extend(values.keys().cloned());
    }
    let end = history.events.len() as Tick;
    let at_end = |value: Option<String>| RegisterOp {
        op: 0,
        invoked: end,
        done: Some(end + 1),
        kind: Kind::Read(value),
        about: "the store's value at the end (read from the leader once all replicas agreed)"
            .to_string(),
    };
    let mut registers: Vec<(String, Vec<RegisterOp>)> = Vec::new();
    for key in keys {
        let register = format!("setting {key}");
        let mut ops = writes.get(&register).cloned().unwrap_or_default();
        for (read, values) in &reads {
            let mut read = read.clone();
            read.kind = Kind::Read(values.get(&key).cloned());
            ops.push(read);
        }
        ops.push(at_end(last.settings.get(&key).cloned()));
        registers.push((register, ops));
    }
    let mut model = writes.get("model").cloned().unwrap_or_default();
    model.extend(model_reads);
    model.push(at_end(last.apply_tag.map(|t| t.to_string())));
    registers.push(("model".to_string(), model));
    let mut out = Linearized::default();
    for (register, ops) in registers {
        let mut initial: BTreeSet<Option<String>> = BTreeSet::from([None]);
        if from.is_some() {
            initial.extend(before.get(&register).cloned().unwrap_or_default());
        }
        let initial: Vec<Option<String>> = initial.into_iter().collect();
        if let Some(v) = never_written(&register, &ops, &initial, &refused, from) {
            out.violations.push(v);
            continue;
        }
        match linear::check(&ops, &initial, linearizable_states_max) {
            Verdict::Linearizable => {}
            Verdict::Undecided { states } => out.undecided.push(format!(
                "{register}: {} operations, no answer after {states} states",
                ops.len()
            )),
            Verdict::Not(stuck) => out
                .violations
                .push(not_linearizable(&register, &stuck, from)),
        }
    }
    out
}

/// The register an operator write writes, the value, and how a message names the write.
fn written(what: &Op) -> Option<(String, String, String)> {
    match what {
        Op::Set { key, value } => Some((
            format!("setting {key}"),
            value.clone(),
            format!("set {key}={value}"),
        )),
        Op::Apply { tag } => Some(("model".to_string(), tag.to_string(), format!("apply {tag}"))),
        Op::Read | Op::ReadModel | Op::Push { .. } => None,
    }
}

/// The model register's value at `revision`: the tag of the last apply at or below it, from the
/// store's model history (`None` before the first). A revision above the store's reads as a value
/// nobody wrote, so a plan of a model the store lost is flagged.
fn model_value(revision: u64, last: &Final) -> Option<String> {
    if revision > last.revision {
        return Some(format!(
            "revision {revision}, above the store's last revision {}",
            last.revision
        ));
    }
    let (at, why) = last.model_whys.range(..=revision).next_back()?;
    Some(match why.strip_prefix("chaos apply ") {
        Some(tag) => tag.to_string(),
        None => format!("revision {at} ({why:?}, not an operator's apply)"),
    })
}

/// A read (or the end) showing a value of `register` that no write which may have taken effect
/// wrote: never written, written by a refused write, or only before the last restore.
fn never_written(
    register: &str,
    ops: &[RegisterOp],
    initial: &[Option<String>],
    refused: &BTreeMap<(String, String), OpId>,
    from: Option<Tick>,
) -> Option<Violation> {
    let written: BTreeSet<&str> = ops
        .iter()
        .filter_map(|o| match &o.kind {
            Kind::Write(v) => Some(v.as_str()),
            Kind::Read(_) => None,
        })
        .collect();
    for o in ops {
        let Kind::Read(Some(v)) = &o.kind else {
            continue;
        };
        if written.contains(v.as_str()) || initial.contains(&Some(v.clone())) {
            continue;
        }
        let why = match refused.get(&(register.to_string(), v.clone())) {
            Some(w) => format!("only op {w} wrote it, and it was refused (nothing written)"),
            None if from.is_some() => {
                "no operator wrote it since the last restore, nor before it".to_string()
            }
            None => "no operator wrote it".to_string(),
        };
        let at = (o.op != 0).then_some(o.invoked);
        let who = if o.op == 0 {
            o.about.clone()
        } else {
            format!("op {} ({})", o.op, o.about)
        };
        return Some(violation(
            checker_names[12],
            at,
            format!("{register}: {who} read {v:?}, but {why}"),
        ));
    }
    None
}

fn not_linearizable(register: &str, stuck: &Stuck, from: Option<Tick>) -> Violation {
    let b = &stuck.blocked;
    let what = match &b.kind {
        Kind::Read(v) => format!("read {v:?}"),
        Kind::Write(v) => format!("wrote {v:?}"),
    };
    let by = stuck.written_by.map_or(
        "no write since: the value it started from".to_string(),
        |w| format!("written by op {w}"),
    );
    let since = from.map_or(String::new(), |r| {
        format!(" (since the restore at #{r:06})")
    });
    let who = if b.op == 0 {
        b.about.clone()
    } else {
        format!(
            "op {} ({}, #{:06}–{})",
            b.op,
            b.about,
            b.invoked,
            done_at(b.done)
        )
    };
    violation(
        checker_names[12],
        (b.op != 0).then_some(b.invoked),
        format!(
            "{register}: no order of its {} operations{since} fits their real-time order: at best {} take effect, leaving {:?} ({by}), and then {who} {what}, which no order allows",
            stuck.of, stuck.taken, stuck.value
        ),
    )
}

fn done_at(done: Option<Tick>) -> String {
    match done {
        Some(t) => format!("#{t:06}"),
        None => "unanswered".to_string(),
    }
}

/// Every other host's reports are filed within [`report_filed_ms_max`] while the hostile peer
/// plays (issue 23 part 5): a delivery is judged when a hostile step was on during it, no other
/// fault was on, nothing restarted, lost or restored its store during it, and a lease was granted
/// after the last such disturbance before it began (the cluster was serving). A judged delivery
/// that failed, or took longer than the bound, is a violation: the hostile peer slowed the others.
pub fn reports_filed_within_bound(history: &History) -> Vec<Violation> {
    // Per tick: whether a hostile step and another step were on, and whether it disturbed.
    let n = history.events.len();
    let mut hostile_on = vec![false; n];
    let mut other_on = vec![false; n];
    let mut disturbs = vec![false; n];
    // The last disturbance and whether a lease was granted since, at each tick.
    let mut settled = vec![false; n];
    let (mut hostile, mut other) = (0_i64, 0_i64);
    let mut leased_since_disturbance = false;
    for (tick, e) in history.ticked() {
        let t = tick as usize;
        match e {
            Event::Nemesis { fault, on, .. } => {
                let is_hostile = crate::nemesis::Fault::all
                    .iter()
                    .any(|f| f.hostile() && f.name() == fault);
                let count = if is_hostile { &mut hostile } else { &mut other };
                *count += if *on { 1 } else { -1 };
                if !is_hostile {
                    disturbs[t] = true;
                }
            }
            Event::Restart { .. } | Event::StoreWiped { .. } | Event::Restored { .. } => {
                disturbs[t] = true;
            }
            _ => {}
        }
        if disturbs[t] {
            leased_since_disturbance = false;
        }
        settled[t] = leased_since_disturbance;
        if matches!(e, Event::LeaseGranted { .. }) {
            leased_since_disturbance = true;
        }
        hostile_on[t] = hostile > 0;
        other_on[t] = other > 0 || disturbs[t];
    }
    let mut out = Vec::new();
    for (tick, e) in history.ticked() {
        let Event::ReportDelivered {
            machine,
            position,
            ok,
            started,
            took_ms,
            ..
        } = e
        else {
            continue;
        };
        let (from, to) = (*started as usize, tick as usize);
        if from > to || to >= n {
            continue;
        }
        let judged = settled[from]
            && hostile_on[from..=to].iter().any(|on| *on)
            && !other_on[from..=to].iter().any(|on| *on);
        if !judged {
            continue;
        }
        if !ok {
            out.push(violation(
                checker_names[13],
                Some(tick),
                format!(
                    "{machine}'s report {position} was not filed (its delivery failed after {took_ms} ms) while only the hostile peer played"
                ),
            ));
        } else if *took_ms > report_filed_ms_max {
            out.push(violation(
                checker_names[13],
                Some(tick),
                format!(
                    "{machine}'s report {position} took {took_ms} ms to be filed while only the hostile peer played; the bound is {report_filed_ms_max} ms (report_filed_ms_max)"
                ),
            ));
        }
    }
    out
}

/// The process's resident memory stays under [`rss_bytes_max`] through the run.
pub fn memory_within_bound(history: &History) -> Vec<Violation> {
    let peak = history
        .ticked()
        .filter_map(|(t, e)| match e {
            Event::Memory { rss_bytes } => Some((*rss_bytes, t)),
            _ => None,
        })
        .max();
    match peak {
        Some((rss, tick)) if rss > rss_bytes_max => vec![violation(
            checker_names[14],
            Some(tick),
            format!(
                "the process held {} MiB resident; the bound is {} MiB (rss_bytes_max)",
                rss / (1024 * 1024),
                rss_bytes_max / (1024 * 1024)
            ),
        )],
        _ => vec![],
    }
}

/// Nothing the hostile peer forged is taken: no oversized, replayed or self-contradicting report
/// filed as newer (another machine's report not filed at all), no Raft call claiming another id
/// or a term above `term_max` answered.
pub fn no_hostile_message_taken(history: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for (tick, e) in history.ticked() {
        if let Event::HostileSent {
            fault,
            sent,
            taken,
            example,
        } = e
            && *taken > 0
        {
            out.push(violation(
                checker_names[15],
                Some(tick),
                format!(
                    "{fault}: {taken} of {sent} forged messages were taken, e.g. {}",
                    crate::history::shown(example)
                ),
            ));
        }
    }
    out
}
