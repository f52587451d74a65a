//! The push engine's guarantees as unit tests on the actions it emits (G3, G4, G8, the stop rules,
//! sequence order): no socket, no clock; every `now` is handed in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_testkit::model::{machine, mount_mesh, provider_consumer_mesh, sleeper};

use super::*;
use crate::core::compose::World;
use crate::core::model::{Mesh, Mount};
use crate::store::command::{Applied, Command};

const window: Duration = Duration::from_millis(300);

fn lease_at(epoch: u64, started: Instant) -> Lease {
    Lease {
        epoch,
        started,
        until: started + window,
    }
}

fn state_of(mesh: Mesh) -> DomainState {
    DomainState {
        revision: 3,
        mesh,
        ..DomainState::default()
    }
}

/// `count` machines `m000`… each running one module: a `push --all` of them.
fn many(count: usize) -> Mesh {
    let mut mesh = Mesh::default();
    for i in 0..count {
        let name = format!("m{i:03}");
        mesh.machines.insert(name.clone(), machine(&name));
        let module = format!("w{i:03}");
        mesh.modules.insert(module.clone(), sleeper(&module, &name));
    }
    mesh
}

fn job(target: PushTarget) -> PushJob {
    PushJob {
        target,
        why: "test".into(),
        moves: vec![],
        saved: None,
        keep: None,
        request: None,
    }
}

fn named(m: &str) -> PushTarget {
    PushTarget::Machine(m.into())
}

/// Starts a push of `job` on `state` at `now` under `lease`.
fn begin(
    state: &DomainState,
    job: PushJob,
    lease: Lease,
    now: Instant,
) -> (PushEngine, Vec<Action>) {
    begin_framed(state, job, lease, now, 16 * 1024 * 1024)
}

/// [`begin`] with the transport's frame limit at `frame_bytes_max`.
fn begin_framed(
    state: &DomainState,
    job: PushJob,
    lease: Lease,
    now: Instant,
    frame_bytes_max: usize,
) -> (PushEngine, Vec<Action>) {
    let state = Arc::new(state.clone());
    let mut work = Work::default();
    work.refresh(&state).expect("the fixture composes");
    let mut n = 0;
    let mut secret = |_: &MintRequest| {
        n += 1;
        Some(format!("secret-{n}"))
    };
    let begin = Begin {
        job,
        actor: "operator:test",
        signer: 1,
        lease,
        wall_ms: 1_000,
        state: &state,
        work: &work,
        reveal: &Reveal::none(),
        secret: &mut secret,
        frame_bytes_max,
    };
    PushEngine::begin(now, begin)
}

fn proposals(actions: &[Action]) -> Vec<(u64, Option<u64>, &Command)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Propose {
                epoch,
                expect,
                command,
            } => Some((*epoch, *expect, command)),
            _ => None,
        })
        .collect()
}

fn sends(actions: &[Action]) -> Vec<(&Envelope, Instant)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send { envelope, deadline } => Some((envelope, *deadline)),
            _ => None,
        })
        .collect()
}

fn answer(actions: &[Action]) -> Option<&Result<PushView, ApiError>> {
    actions.iter().find_map(|a| match a {
        Action::Answer(answer) => Some(answer),
        _ => None,
    })
}

fn lines(view: &PushView) -> BTreeMap<String, PushOutcome> {
    view.lines
        .iter()
        .map(|l| (l.machine.clone(), l.outcome.clone()))
        .collect()
}

fn committed(revision: u64) -> Event {
    Event::Committed(Applied::Minted {
        revision,
        ids: vec![],
    })
}

fn records_committed() -> Event {
    Event::Committed(Applied::Sent { sequences: vec![] })
}

fn applied(machine: &str) -> Event {
    Event::Answered {
        machine: machine.into(),
        answer: HostAnswer::Applied,
    }
}

/// Drives a push with no mints and no holds through its send records: the actions of the commit.
fn through_records(engine: &mut PushEngine, first: &[Action], now: Instant) -> Vec<Action> {
    let p = proposals(first);
    assert!(
        matches!(p.as_slice(), [(_, _, Command::RecordSends { .. })]),
        "{first:?}"
    );
    engine.handle(now, records_committed())
}

#[test]
fn g4_every_proposal_carries_the_leases_epoch_and_records_come_before_any_send() {
    // G4: mints, then send records, each proposed in the lease's epoch with the plan's revision
    // (then the mints') as the compare-and-set; no envelope is handed out before the records
    // commit.
    let t0 = Instant::now();
    let state = state_of(provider_consumer_mesh());
    let (mut engine, first) = begin(&state, job(named("g14")), lease_at(7, t0), t0);
    let p = proposals(&first);
    assert!(
        matches!(p.as_slice(), [(7, Some(3), Command::Mint { provisions })] if provisions.len() == 1),
        "{first:?}"
    );
    assert!(sends(&first).is_empty());
    let after_mints = engine.handle(t0, committed(4));
    let p = proposals(&after_mints);
    let [(7, Some(4), Command::RecordSends { sends: records })] = p.as_slice() else {
        panic!("expected the send records at revision 4: {after_mints:?}");
    };
    let machines: BTreeSet<&str> = records.iter().map(|r| r.machine.as_str()).collect();
    assert_eq!(
        machines,
        BTreeSet::from(["ace", "g14"]),
        "the grant cascades"
    );
    assert!(records.iter().all(|r| r.epoch == 7));
    assert!(sends(&after_mints).is_empty(), "nothing leaves unrecorded");
    let out = engine.handle(t0, records_committed());
    let sent = sends(&out);
    assert_eq!(sent.len(), 2);
    for (envelope, deadline) in sent {
        assert_eq!(envelope.epoch, 7);
        assert_eq!(deadline, t0 + window, "the deadline is the lease's end");
        let record = records.iter().find(|r| r.machine == envelope.machine);
        assert_eq!(record.map(|r| r.sequence), Some(envelope.sequence));
    }
    engine.handle(t0, applied("ace"));
    let done = engine.handle(t0, applied("g14"));
    let view = answer(&done).expect("answers").as_ref().expect("ok");
    assert_eq!(view.epoch, 7);
    assert!(
        lines(view)
            .values()
            .all(|o| matches!(o, PushOutcome::Applied { .. }))
    );
    assert!(engine.is_done());
}

#[test]
fn an_envelope_over_the_frame_limit_is_never_recorded_and_its_line_says_why() {
    // Issue 23: a send the transport would refuse is not recorded (a recorded send that can
    // never arrive leaves its machine behind for good); its line fails naming the size, the
    // limit and the largest module, and the other machines go out as usual. A genesis of such
    // a machine answers an error and proposes nothing.
    let t0 = Instant::now();
    let mut mesh = Mesh::default();
    for m in ["ace", "g14"] {
        mesh.machines.insert(m.into(), machine(m));
    }
    mesh.modules.insert("small".into(), sleeper("small", "ace"));
    let mut big = sleeper("big", "g14");
    big.files.insert("blob".into(), "x".repeat(4096));
    mesh.modules.insert("big".into(), big);
    let state = state_of(mesh);
    let limit = 2048;
    let (mut engine, first) =
        begin_framed(&state, job(PushTarget::All), lease_at(7, t0), t0, limit);
    let p = proposals(&first);
    let [(7, Some(3), Command::RecordSends { sends: records })] = p.as_slice() else {
        panic!("expected the send records: {first:?}");
    };
    let recorded: Vec<&str> = records.iter().map(|r| r.machine.as_str()).collect();
    assert_eq!(recorded, ["ace"], "g14's send is not recorded");
    let out = engine.handle(t0, records_committed());
    let sent: Vec<&str> = sends(&out)
        .iter()
        .map(|(e, _)| e.machine.as_str())
        .collect();
    assert_eq!(sent, ["ace"]);
    let done = engine.handle(t0, applied("ace"));
    let view = answer(&done).expect("answers").as_ref().expect("ok");
    let got = lines(view);
    assert!(
        matches!(got.get("ace"), Some(PushOutcome::Applied { .. })),
        "{got:?}"
    );
    let Some(PushOutcome::Failed { error, .. }) = got.get("g14") else {
        panic!("g14's line fails: {got:?}");
    };
    assert!(
        error.starts_with("not recorded: its envelope would be a frame of ")
            && error.contains(&format!(
                "bytes, over the limit of {limit} bytes (frame_bytes_max)"
            ))
            && error.contains("module `big` is its largest part"),
        "{error}"
    );

    let genesis = PushJob {
        keep: Some("g14".into()),
        ..job(named("g14"))
    };
    let (_, out) = begin_framed(&state, genesis, lease_at(7, t0), t0, limit);
    assert!(
        matches!(answer(&out), Some(Err(ApiError::Push(PushError::EnvelopeTooLarge { machine, .. }))) if machine == "g14"),
        "{out:?}"
    );
    assert!(proposals(&out).is_empty());
}

#[test]
fn g4_records_that_do_not_commit_send_nothing() {
    // G4: a record proposal that fails (leadership lost under it) or is refused leaves no
    // envelope: every machine of the push is named as not sent.
    let t0 = Instant::now();
    let state = state_of(many(3));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(2, t0), t0);
    assert_eq!(proposals(&first).len(), 1);
    let out = engine.handle(t0, Event::Failed("not the leader any more".into()));
    assert!(sends(&out).is_empty());
    let view = answer(&out)
        .expect("answers")
        .as_ref()
        .expect("a stopped view");
    assert_eq!(view.lines.len(), 3);
    for line in &view.lines {
        let PushOutcome::Failed { error, .. } = &line.outcome else {
            panic!("{line:?}");
        };
        assert!(error.contains("not the leader any more"), "{error}");
    }
}

#[test]
fn a_refused_compare_and_set_sends_nothing() {
    // A moved revision refuses the mints or the records: the push fails with the store's reason
    // and says nothing was sent; no send action is ever emitted.
    let t0 = Instant::now();
    let state = state_of(provider_consumer_mesh());
    let (mut engine, _) = begin(&state, job(named("g14")), lease_at(1, t0), t0);
    let out = engine.handle(t0, Event::Refused("revision moved from 3 to 4".into()));
    let Some(Err(ApiError::Push(PushError::StoreRefused { what, reason }))) = answer(&out) else {
        panic!("{out:?}");
    };
    let e = answer(&out)
        .and_then(|a| a.as_ref().err())
        .map(ToString::to_string);
    assert!(
        what == "mints" && reason.contains("revision moved"),
        "{e:?}"
    );
    assert!(e.is_some_and(|e| e.contains("nothing was sent")));
    assert!(sends(&out).is_empty());
    assert!(engine.handle(t0, Event::Tick).is_empty(), "done means done");

    let state = state_of(many(2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(1, t0), t0);
    assert_eq!(proposals(&first).len(), 1);
    let out = engine.handle(t0, Event::Refused("revision moved from 3 to 5".into()));
    let Some(Err(ApiError::Push(PushError::StoreRefused { what, .. }))) = answer(&out) else {
        panic!("{out:?}");
    };
    assert_eq!(what, "send records");
    assert!(sends(&out).is_empty());
}

#[test]
fn g3_no_step_starts_after_the_lease_and_renewal_is_asked_before_its_end() {
    // G3: the engine asks for a new quorum round from the lease's half-way point on, before its
    // end; while the round is out nothing new is proposed, a send goes out only on the lease
    // still open (its write waits on the renewal's extension, decision 0221), none after the
    // lease's end, and every send's deadline is the end of the lease it was handed out under.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 6));
    let lease = lease_at(4, t0);
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease, t0);
    assert_eq!(engine.wake_at(), Some(t0 + window / 2));
    assert!(
        engine.wake_at() < Some(lease.until),
        "renewal is asked before the end"
    );
    let out = through_records(&mut engine, &first, t0);
    assert_eq!(sends(&out).len(), sends_in_flight_max, "bounded in flight");
    // Half the window gone with sends still queued: a round is asked, nothing new leaves.
    let half = t0 + window / 2;
    let out = engine.handle(half, Event::Tick);
    assert_eq!(out, vec![Action::ConfirmLease]);
    assert_eq!(engine.wake_at(), None, "one round at a time");
    let out = engine.handle(half, applied("m000"));
    let sent = sends(&out);
    assert_eq!(
        sent.len(),
        1,
        "the freed slot is used on the lease still open"
    );
    assert_eq!(sent[0].1, lease.until);
    let out = engine.handle(lease.until, applied("m001"));
    assert!(sends(&out).is_empty(), "no send after the lease's end");
    // Renewed in the same term: the queued sends go, under the new lease's end.
    let renewed = lease_at(4, half + window / 4);
    let out = engine.handle(lease.until, Event::Lease(Ok(renewed)));
    let sent = sends(&out);
    assert_eq!(sent.len(), 1, "one slot freed");
    assert_eq!(sent[0].1, renewed.until);
    assert_eq!(extends(&out), vec![renewed.until]);
    assert_eq!(engine.wake_at(), Some(renewed.started + window / 2));
}

#[test]
fn g3_lease_refused_stops_the_push_naming_every_machine_not_sent() {
    // G3: when the renewal finds leadership lost, the sends not yet handed out are not sent and
    // each is named with the reason; the sends already out finish; the answer waits for them.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 6));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    let out = through_records(&mut engine, &first, t0);
    let in_flight: Vec<String> = sends(&out).iter().map(|(e, _)| e.machine.clone()).collect();
    let half = t0 + window / 2;
    assert_eq!(engine.handle(half, Event::Tick), vec![Action::ConfirmLease]);
    let lost = NoLease::Lost("this replica is not the leader".into());
    let out = engine.handle(half, Event::Lease(Err(lost)));
    assert!(sends(&out).is_empty());
    assert!(out.iter().any(|a| matches!(
        a,
        Action::Stopped {
            epoch: 4,
            reason: StopReason::LeaseLost(_)
        }
    )));
    assert!(answer(&out).is_none(), "sends in flight still answer");
    let mut last = Vec::new();
    for m in &in_flight {
        last = engine.handle(half, applied(m));
        assert!(sends(&last).is_empty());
    }
    let view = answer(&last).expect("answers").as_ref().expect("ok");
    let lines = lines(view);
    assert_eq!(lines.len(), sends_in_flight_max + 6);
    let stopped: Vec<&String> = lines
        .iter()
        .filter(|(_, o)| {
            matches!(o, PushOutcome::Failed { error, .. }
                if error.contains("stopped: lease could not be renewed: this replica is not the leader"))
        })
        .map(|(m, _)| m)
        .collect();
    assert_eq!(stopped.len(), 6, "{lines:?}");
    assert!(stopped.iter().all(|m| !in_flight.contains(m)));
}

#[test]
fn g3_a_leader_paused_past_its_lease_proposes_nothing_until_a_lease_of_its_term() {
    // G3 (decision 0270): a lease found closed (the replica was paused past it; another leader
    // may exist) is not acted on: the push proposes nothing and asks for a fresh quorum round.
    // Answered in a newer term, it stops before its mints and names every machine.
    let t0 = Instant::now();
    let state = state_of(provider_consumer_mesh());
    let late = t0 + window * 3;
    let (mut engine, out) = begin(&state, job(named("g14")), lease_at(5, t0), late);
    assert_eq!(out, vec![Action::ConfirmLease]);
    let out = engine.handle(late, Event::Lease(Ok(lease_at(6, late))));
    assert!(proposals(&out).is_empty());
    let view = answer(&out)
        .expect("answers")
        .as_ref()
        .expect("a stopped view");
    assert_eq!(view.lines.len(), 2);
    for line in &view.lines {
        assert!(
            matches!(&line.outcome, PushOutcome::Failed { error, .. } if error.contains("from term 5 to term 6")),
            "{line:?}"
        );
    }
}

#[test]
fn g3_paused_past_the_lease_between_records_and_sends_sends_nothing_until_a_new_lease() {
    // G3 (decision 0270): records committed, then the replica was paused past its lease: no send
    // action, only a quorum round; the sends leave under the lease it confirms in the same term.
    let t0 = Instant::now();
    let state = state_of(many(2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(5, t0), t0);
    let p = proposals(&first);
    assert_eq!(p.len(), 1);
    let late = t0 + window * 2;
    let out = engine.handle(late, records_committed());
    assert_eq!(out, vec![Action::ConfirmLease]);
    let again = lease_at(5, late);
    let out = engine.handle(late, Event::Lease(Ok(again)));
    let sent = sends(&out);
    assert_eq!(sent.len(), 2, "{out:?}");
    assert!(
        sent.iter()
            .all(|(e, deadline)| e.epoch == 5 && *deadline == again.until)
    );
}

#[test]
fn g3_renewed_in_another_term_or_deposed_stops_the_rest() {
    // G3: a renewal that comes back in a newer term, or leadership lost (the driver's metrics),
    // stops every send not yet handed out.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 1));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    let half = t0 + window / 2;
    engine.handle(half, Event::Tick);
    let out = engine.handle(half, Event::Lease(Ok(lease_at(5, half))));
    assert!(sends(&out).is_empty());
    assert!(out.iter().any(|a| matches!(a, Action::Line(l)
        if matches!(&l.outcome, PushOutcome::Failed { error, .. } if error.contains("from term 4 to term 5")))));

    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    let out = engine.handle(
        t0,
        Event::Deposed("leadership lost: term 4 is now 5".into()),
    );
    assert!(sends(&out).is_empty());
    let stopped = out
        .iter()
        .filter(
            |a| matches!(a, Action::Line(l) if matches!(&l.outcome, PushOutcome::Failed { .. })),
        )
        .count();
    assert_eq!(stopped, 1, "the one send not handed out is named at once");
}

#[test]
fn g3_a_send_stopped_at_the_write_stops_the_rest() {
    // G3: the gate at the write closed for one envelope (the lease ran out on its way out): its
    // line says so, and nothing more is handed out.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    let out = engine.handle(
        t0,
        Event::Answered {
            machine: "m000".into(),
            answer: HostAnswer::Gated("not sent to 10.0.0.1:7444: lease closed".into()),
        },
    );
    assert!(sends(&out).is_empty(), "the freed slot is not used");
    let failed: Vec<&PushLine> = out
        .iter()
        .filter_map(|a| match a {
            Action::Line(l) => Some(l),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 3);
    assert!(matches!(&failed[0].outcome,
        PushOutcome::Failed { error, .. } if error.starts_with("stopped at the write:") && error.contains("lease")));
}

fn extends(actions: &[Action]) -> Vec<Instant> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Extend { until } => Some(*until),
            _ => None,
        })
        .collect()
}

#[test]
fn g3_sends_on_their_way_are_extended_only_by_a_renewal_in_the_same_term() {
    // G3 (decision 0221): with every envelope handed out but not answered, the engine still asks
    // for the lease from its half on, and a renewal in the push's term extends the sends on their
    // way to the new lease's end; a renewal in another term, or one that comes back after the push
    // stopped, extends nothing.
    let t0 = Instant::now();
    let state = state_of(many(3));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    let out = through_records(&mut engine, &first, t0);
    assert_eq!(sends(&out).len(), 3, "all handed out");
    assert!(extends(&out).is_empty());
    let half = t0 + window / 2;
    assert_eq!(
        engine.wake_at(),
        Some(half),
        "sends on their way keep the lease"
    );
    assert_eq!(engine.handle(half, Event::Tick), vec![Action::ConfirmLease]);
    let renewed = lease_at(4, half);
    let out = engine.handle(half, Event::Lease(Ok(renewed)));
    assert_eq!(extends(&out), vec![renewed.until]);
    assert!(sends(&out).is_empty());
    // Each answer settles its line; once none is on its way nothing more is asked.
    engine.handle(half, applied("m000"));
    engine.handle(half, applied("m001"));
    assert_eq!(engine.wake_at(), Some(half + window / 2));
    let out = engine.handle(half, applied("m002"));
    assert!(answer(&out).is_some());
    assert_eq!(engine.wake_at(), None);

    // Renewed in another term: the push stops and nothing on its way is extended.
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    engine.handle(half, Event::Tick);
    let out = engine.handle(half, Event::Lease(Ok(lease_at(5, half))));
    assert!(extends(&out).is_empty(), "{out:?}");

    // Deposed while the round was out: the round's late answer extends nothing.
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    engine.handle(half, Event::Tick);
    engine.handle(
        half,
        Event::Deposed("leadership lost: term 4 is now 5".into()),
    );
    let out = engine.handle(half, Event::Lease(Ok(lease_at(4, half))));
    assert!(extends(&out).is_empty(), "{out:?}");
}

fn gated(machine: &str) -> Event {
    Event::Answered {
        machine: machine.into(),
        answer: HostAnswer::Gated("not sent to 10.0.0.1:7444: lease closed".into()),
    }
}

#[test]
fn g3_a_send_stopped_at_the_write_during_a_renewal_leaves_again_under_the_renewed_lease() {
    // G3 (decision 0221): a send stopped at the write while its lease was being renewed wrote
    // nothing; it goes back to the queue, leaves again under the renewed lease, and only a
    // refusal under that lease stops the push.
    let t0 = Instant::now();
    let state = state_of(many(2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    let half = t0 + window / 2;
    let end = t0 + window;
    assert_eq!(engine.handle(half, Event::Tick), vec![Action::ConfirmLease]);
    // The round is slow: the lease ends before it answers, and m000's write comes after.
    let out = engine.handle(end, gated("m000"));
    assert!(
        out.iter()
            .all(|a| !matches!(a, Action::Line(_) | Action::Stopped { .. })),
        "{out:?}"
    );
    let renewed = lease_at(4, half + window / 4);
    let out = engine.handle(end, Event::Lease(Ok(renewed)));
    let again = sends(&out);
    assert_eq!(again.len(), 1, "{out:?}");
    assert_eq!(again[0].0.machine, "m000");
    assert_eq!(again[0].1, renewed.until);
    let out = engine.handle(end, gated("m000"));
    assert!(
        out.iter().any(
            |a| matches!(a, Action::Stopped { reason: StopReason::Gated(why), .. } if why.contains("lease closed"))
        ),
        "{out:?}"
    );
    let out = engine.handle(end, applied("m001"));
    let view = answer(&out).expect("answers").as_ref().expect("ok");
    assert!(matches!(&lines(view)["m000"],
        PushOutcome::Failed { error, .. } if error.starts_with("stopped at the write:")));
}

#[test]
fn g2_a_host_holding_a_newer_envelope_stops_the_rest() {
    // G2/G3: a host refusing an envelope as older than one it accepted has seen a newer leader:
    // that line is a refusal and the rest of the push stops; any other refusal is that
    // machine's alone.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    let bad_key = Event::Answered {
        machine: "m001".into(),
        answer: HostAnswer::Refused {
            refusal: "envelope signed by replica 1, which this host does not trust".into(),
            older: false,
            proven: None,
        },
    };
    let out = engine.handle(t0, bad_key);
    assert_eq!(sends(&out).len(), 1, "the push goes on");
    let older = Event::Answered {
        machine: "m002".into(),
        answer: HostAnswer::Refused {
            refusal: "envelope at (4, 1) is not newer than (5, 1)".into(),
            older: true,
            proven: Some(Position {
                epoch: 5,
                sequence: 1,
            }),
        },
    };
    let out = engine.handle(t0, older);
    assert!(sends(&out).is_empty());
    assert!(
        out.iter().any(
            |a| matches!(a, Action::Stopped { reason: StopReason::NewerEnvelope { machine, held, .. }, .. }
                if machine == "m002" && held.epoch == 5)
        )
    );
}

fn older_refusal(machine: &str, proven: Option<(u64, u64)>) -> Event {
    Event::Answered {
        machine: machine.into(),
        answer: HostAnswer::Refused {
            refusal: "envelope at epoch 4 sequence 1 is not newer than epoch 9 sequence 1".into(),
            older: true,
            proven: proven.map(|(epoch, sequence)| Position { epoch, sequence }),
        },
    }
}

#[test]
fn g2_g9_an_unproven_older_refusal_fails_its_line_and_the_push_goes_on_after_a_fresh_quorum_round()
{
    // Issue 27 part 4: one host's claim that nothing signed (a mark edited on its disk) must not
    // stop every push. Its line fails and an alarm is raised; nothing more is sent until a quorum
    // round that began after the refusal confirms the push's term, then the rest goes on. A
    // proof of a position below the envelope's proves nothing either.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    let t1 = t0 + Duration::from_millis(10);
    for (machine, proven) in [("m000", None), ("m001", Some((3, 9)))] {
        let out = engine.handle(t1, older_refusal(machine, proven));
        assert!(sends(&out).is_empty(), "sent before a fresh round: {out:?}");
        assert!(
            !out.iter().any(|a| matches!(a, Action::Stopped { .. })),
            "one host's unproven word stopped the push: {out:?}"
        );
        assert!(
            out.iter()
                .any(|a| matches!(a, Action::Unproven { machine: m, .. } if m == machine)),
            "no alarm for {machine}: {out:?}"
        );
    }
    // A round that began before the refusals does not count.
    let out = engine.handle(t1, Event::Lease(Ok(lease_at(4, t0))));
    assert!(sends(&out).is_empty(), "{out:?}");
    assert!(out.contains(&Action::ConfirmLease), "{out:?}");
    let out = engine.handle(t1, Event::Lease(Ok(lease_at(4, t1))));
    assert_eq!(sends(&out).len(), 2, "the push goes on: {out:?}");
    let mut last = out;
    for i in 2..sends_in_flight_max + 2 {
        last = engine.handle(t1, applied(&format!("m{i:03}")));
    }
    let view = answer(&last).expect("answers").as_ref().expect("ok");
    let lines = lines(view);
    for machine in ["m000", "m001"] {
        assert!(
            matches!(&lines[machine], PushOutcome::Failed { error, .. } if error.contains("nothing signed")),
            "{machine}: {:?}",
            lines[machine]
        );
    }
    assert!(
        matches!(lines["m002"], PushOutcome::Applied { .. }),
        "{:?}",
        lines["m002"]
    );
}

#[test]
fn sequences_follow_each_machines_last_send() {
    // G2/G4: every record takes its machine's next sequence from the committed state, and the
    // envelope carries exactly its record's epoch and sequence; the next push goes on from there.
    let t0 = Instant::now();
    let mut state = state_of(many(2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(3, t0), t0);
    let p = proposals(&first);
    let [(3, Some(3), Command::RecordSends { sends: records })] = p.as_slice() else {
        panic!("{first:?}");
    };
    assert!(
        records.iter().all(|r| r.sequence == 1),
        "never sent: sequence 1"
    );
    let mut record = records[0].clone();
    record.sequence = 7;
    state
        .last_sends
        .insert(record.machine.clone(), record.clone());
    let out = engine.handle(t0, records_committed());
    assert!(
        sends(&out)
            .iter()
            .all(|(e, _)| e.sequence == 1 && e.epoch == 3)
    );

    let (_, first) = begin(&state, job(PushTarget::All), lease_at(9, t0), t0);
    let p = proposals(&first);
    let [(9, _, Command::RecordSends { sends: records })] = p.as_slice() else {
        panic!("{first:?}");
    };
    let by: BTreeMap<&str, u64> = records
        .iter()
        .map(|r| (r.machine.as_str(), r.sequence))
        .collect();
    assert_eq!(by.get(record.machine.as_str()), Some(&8));
    assert_eq!(by.len(), 2);
}

/// `broker` on ace was last sent with its mount at `/srv/a` (and is running); the model now says
/// `new_dir`. A second module `cache` with a mount moves the same way when `two`.
fn moved_mount(new_dir: &str, two: bool) -> DomainState {
    let mut before = mount_mesh("/srv/a");
    let mut now = mount_mesh(new_dir);
    if two {
        for (mesh, dir) in [(&mut before, "/srv/a"), (&mut now, new_dir)] {
            let mut cache = sleeper("cache", "ace");
            cache.mounts.push(Mount {
                name: "spool".into(),
                host_dir: format!("{dir}/spool"),
                target: "spool".into(),
            });
            mesh.modules.insert("cache".into(), cache);
        }
    }
    let world = World::new(before, []);
    let composed = crate::core::compose::compose(&world, "ace").expect("composes");
    let mut state = state_of(now);
    state.last_sends.insert(
        "ace".into(),
        SendRecord {
            machine: "ace".into(),
            epoch: 1,
            sequence: 1,
            digest: crate::core::compose::digest(&composed.declaration),
            summary: std::sync::Arc::new(summarize(&composed.declaration)),
            why: "first".into(),
            actor: "operator:test".into(),
            time_ms: 0,
            moves: vec![],
        },
    );
    state
}

#[test]
fn g8_a_held_mount_move_emits_no_send_for_that_machine() {
    // G8: a running module's mount would move: the machine is held (recorded with SetHolds,
    // naming module, mount and both directories) and no record or envelope is made for it.
    let t0 = Instant::now();
    let state = moved_mount("/srv/b", false);
    let (mut engine, first) = begin(&state, job(named("ace")), lease_at(2, t0), t0);
    let p = proposals(&first);
    let [(2, None, Command::SetHolds { machine, holds })] = p.as_slice() else {
        panic!("{first:?}");
    };
    assert_eq!(machine, "ace");
    assert_eq!(holds.len(), 1);
    assert_eq!(
        (
            holds[0].module.as_str(),
            holds[0].mount.as_str(),
            holds[0].old_dir.as_str(),
            holds[0].new_dir.as_str()
        ),
        ("broker", "data", "/srv/a", "/srv/b")
    );
    let out = engine.handle(
        t0,
        Event::Committed(Applied::Holds {
            machine: "ace".into(),
        }),
    );
    assert!(proposals(&out).is_empty(), "no record for a held machine");
    assert!(sends(&out).is_empty());
    let view = answer(&out).expect("answers").as_ref().expect("ok");
    assert!(matches!(
        lines(view).get("ace"),
        Some(PushOutcome::Held { holds, .. }) if holds.len() == 1
    ));
}

#[test]
fn g8_move_releases_only_the_named_module() {
    // G8: `--move broker` accepts broker's move alone: with cache's mount moving too the machine
    // stays held, now for cache only; with broker the only one moving, it is sent.
    let t0 = Instant::now();
    let mut moving = job(named("ace"));
    moving.moves = vec!["broker".into()];
    let state = moved_mount("/srv/b", true);
    let (_, first) = begin(&state, moving, lease_at(2, t0), t0);
    let p = proposals(&first);
    let [(2, None, Command::SetHolds { holds, .. })] = p.as_slice() else {
        panic!("{first:?}");
    };
    let modules: Vec<&str> = holds.iter().map(|h| h.module.as_str()).collect();
    assert_eq!(modules, vec!["cache"]);

    let mut moving = job(named("ace"));
    moving.moves = vec!["broker".into()];
    let mut state = moved_mount("/srv/b", false);
    state.holds.insert("ace".into(), vec![]);
    let (mut engine, first) = begin(&state, moving, lease_at(2, t0), t0);
    let p = proposals(&first);
    assert!(
        matches!(p.as_slice(), [(2, None, Command::ReleaseHolds { machine })] if machine == "ace"),
        "{first:?}"
    );
    let out = engine.handle(
        t0,
        Event::Committed(Applied::Holds {
            machine: "ace".into(),
        }),
    );
    let p = proposals(&out);
    let [(2, Some(3), Command::RecordSends { sends: records })] = p.as_slice() else {
        panic!("{out:?}");
    };
    assert_eq!(records[0].moves, vec!["broker".to_string()]);
    let out = engine.handle(t0, records_committed());
    let sent = sends(&out);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0.moves, vec!["broker".to_string()]);
}

#[test]
fn genesis_keeps_its_machines_envelope_and_sends_the_cascade() {
    // G11: the kept machine's envelope is sealed for the answer (after the records, under the
    // lease) and never sent; its cascade is sent after it.
    let t0 = Instant::now();
    let state = state_of(provider_consumer_mesh());
    let mut kept = job(named("g14"));
    kept.keep = Some("g14".into());
    let (mut engine, _) = begin(&state, kept, lease_at(6, t0), t0);
    engine.handle(t0, committed(4));
    let out = engine.handle(t0, records_committed());
    assert!(sends(&out).is_empty(), "the genesis is sealed first");
    let [Action::Keep { envelope, deadline }] = out.as_slice() else {
        panic!("{out:?}");
    };
    assert_eq!((envelope.machine.as_str(), envelope.epoch), ("g14", 6));
    assert_eq!(*deadline, t0 + window);
    let out = engine.handle(t0, Event::Kept(Ok(())));
    let sent = sends(&out);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0.machine, "ace");
    let done = engine.handle(t0, applied("ace"));
    let view = answer(&done).expect("answers").as_ref().expect("ok");
    assert_eq!(view.lines.len(), 1, "the kept machine has no line");
}

#[test]
fn bad_input_and_a_failed_random_source_propose_nothing() {
    let t0 = Instant::now();
    let state = state_of(provider_consumer_mesh());
    let mut no_why = job(named("g14"));
    no_why.why = "  ".into();
    let (_, out) = begin(&state, no_why, lease_at(1, t0), t0);
    assert!(matches!(
        answer(&out),
        Some(Err(ApiError::Push(PushError::NoReason)))
    ));
    let (_, out) = begin(&state, job(named("nope")), lease_at(1, t0), t0);
    assert!(matches!(answer(&out),
        Some(Err(ApiError::Push(PushError::UnknownMachine { machine }))) if machine == "nope"));
    assert!(proposals(&out).is_empty());

    let state = Arc::new(state);
    let mut work = Work::default();
    work.refresh(&state).expect("composes");
    let mut broken = |_: &MintRequest| None;
    let begin = Begin {
        job: job(named("g14")),
        actor: "operator:test",
        signer: 1,
        lease: lease_at(1, t0),
        wall_ms: 0,
        state: &state,
        work: &work,
        reveal: &Reveal::none(),
        secret: &mut broken,
        frame_bytes_max: 16 * 1024 * 1024,
    };
    let (_, out) = PushEngine::begin(t0, begin);
    assert!(
        matches!(answer(&out), Some(Err(ApiError::Random { what })) if what.contains("secrets"))
    );
    assert!(proposals(&out).is_empty());
}

#[test]
fn the_engine_reads_no_clock_does_no_io_and_draws_no_randomness() {
    // The engine decides; the driver moves bytes and time. A clock read, an await, a socket, a
    // file or a random draw in the engine would put a decision back into the driver's world.
    let sources = [
        ("engine/mod.rs", include_str!("mod.rs")),
        ("engine/cache.rs", include_str!("cache.rs")),
    ];
    crate::controller::purity::assert_names_none(&sources, &[]);
}

#[test]
fn a_push_whose_request_already_recorded_other_sends_sends_nothing() {
    // Nothing runs twice: a push's records are proposed as its request (`Command::Once`); when the
    // store answers with the first outcome of that request — other machines or sequences, because
    // the same request already ran — the engine sends nothing. With its own records it sends.
    let t0 = Instant::now();
    let state = state_of(many(2));
    let id = crate::store::command::RequestId([9; 16]);
    let with_id = || PushJob {
        request: Some(id),
        ..job(PushTarget::All)
    };
    let (mut engine, first) = begin(&state, with_id(), lease_at(2, t0), t0);
    let p = proposals(&first);
    let [(_, _, Command::Once { request, command })] = p.as_slice() else {
        panic!("records are proposed as the request: {first:?}");
    };
    assert_eq!(*request, id);
    let Command::RecordSends { sends: records } = command.as_ref() else {
        panic!("{command:?}");
    };
    let earlier = Event::Committed(Applied::Sent {
        sequences: vec![("m0".into(), 1)],
    });
    let out = engine.handle(t0, earlier);
    assert!(
        sends(&out).is_empty(),
        "another run's records licence no send"
    );
    assert!(
        matches!(
            answer(&out),
            Some(Err(ApiError::Push(PushError::AlreadyRan { machines, .. }))) if machines == &["m0".to_string()]
        ),
        "{out:?}"
    );

    let (mut engine, _) = begin(&state, with_id(), lease_at(2, t0), t0);
    let own = Event::Committed(Applied::Sent {
        sequences: records
            .iter()
            .map(|r| (r.machine.clone(), r.sequence))
            .collect(),
    });
    let out = engine.handle(t0, own);
    assert_eq!(sends(&out).len(), 2, "its own records send");
}

/// Whether `actions` write nothing and let nothing be written: no proposal, send, kept
/// envelope or extension of the sends on their way.
fn writes_nothing(actions: &[Action]) -> bool {
    actions.iter().all(|a| {
        !matches!(
            a,
            Action::Propose { .. }
                | Action::Send { .. }
                | Action::Keep { .. }
                | Action::Extend { .. }
        )
    })
}

fn unconfirmed() -> Event {
    Event::Lease(Err(NoLease::Unconfirmed(
        "leadership in term 4 was not confirmed by a quorum: got {1}".into(),
    )))
}

#[test]
fn g3_a_push_whose_lease_closed_continues_under_a_lease_of_the_same_term() {
    // G3 (decision 0270): the renewal's wake-up came after the lease's end. The push does not
    // stop: it asks for a fresh quorum round, and once the round confirms a lease of the push's
    // term the queued sends leave under it, the sends on their way are extended to it, and every
    // machine is applied.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 6));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    let out = through_records(&mut engine, &first, t0);
    let mut on_their_way: Vec<String> =
        sends(&out).iter().map(|(e, _)| e.machine.clone()).collect();
    let late = t0 + window + Duration::from_millis(40);
    let out = engine.handle(late, Event::Tick);
    assert_eq!(out, vec![Action::ConfirmLease], "taken again, not stopped");
    let again = lease_at(4, late);
    let out = engine.handle(late, Event::Lease(Ok(again)));
    assert_eq!(extends(&out), vec![again.until]);
    assert!(sends(&out).is_empty(), "the window is full");
    let mut last = Vec::new();
    while let Some(machine) = on_their_way.pop() {
        last = engine.handle(late, applied(&machine));
        for (envelope, deadline) in sends(&last) {
            assert_eq!(deadline, again.until, "under the lease taken again");
            assert_eq!(envelope.epoch, 4);
            on_their_way.push(envelope.machine.clone());
        }
    }
    let view = answer(&last).expect("answers").as_ref().expect("ok");
    assert_eq!(view.epoch, 4);
    assert_eq!(view.lines.len(), sends_in_flight_max + 6);
    assert!(
        lines(view)
            .values()
            .all(|o| matches!(o, PushOutcome::Applied { .. })),
        "{view:?}"
    );
}

#[test]
fn g3_a_push_whose_lease_closed_stops_on_a_higher_term_seen() {
    // G3 (decision 0270): the round that would take the lease again answers a newer term, finds
    // the replica no longer leading, or the driver sees it deposed while the round is out: the
    // push stops, sends nothing more, and names every machine not sent.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 2));
    let late = t0 + window * 2;
    let endings: [(Event, StopReason); 3] = [
        (
            Event::Lease(Ok(lease_at(5, late))),
            StopReason::LeadershipMoved { from: 4, to: 5 },
        ),
        (
            Event::Lease(Err(NoLease::Lost(
                "the term moved from 4 to 5 during the quorum round".into(),
            ))),
            StopReason::LeaseLost("the term moved from 4 to 5 during the quorum round".into()),
        ),
        (
            Event::Deposed("leadership lost: term 4 is now 5".into()),
            StopReason::Deposed("leadership lost: term 4 is now 5".into()),
        ),
    ];
    for (ending, why) in endings {
        let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
        let out = through_records(&mut engine, &first, t0);
        let on_their_way: Vec<String> =
            sends(&out).iter().map(|(e, _)| e.machine.clone()).collect();
        assert_eq!(engine.handle(late, Event::Tick), vec![Action::ConfirmLease]);
        let out = engine.handle(late, ending);
        assert!(writes_nothing(&out), "{why}: {out:?}");
        assert!(
            out.iter()
                .any(|a| matches!(a, Action::Stopped { epoch: 4, reason } if *reason == why)),
            "{why}: {out:?}"
        );
        // A round still out answering in the push's term after that extends and sends nothing.
        let out = engine.handle(late, Event::Lease(Ok(lease_at(4, late))));
        assert!(writes_nothing(&out), "{why}: {out:?}");
        let mut last = Vec::new();
        for m in &on_their_way {
            last = engine.handle(late, applied(m));
            assert!(writes_nothing(&last), "{why}: {last:?}");
        }
        let view = answer(&last).expect("answers").as_ref().expect("ok");
        let stopped = lines(view)
            .into_values()
            .filter(|o| matches!(o, PushOutcome::Failed { error, .. } if error == &format!("stopped: {why}")))
            .count();
        assert_eq!(stopped, 2, "{why}: {view:?}");
    }
}

#[test]
fn g3_a_push_whose_lease_closed_stops_after_n_failed_rounds() {
    // G3 (decision 0270): rounds that do not confirm the term are asked again, but only
    // `lease_rounds_failed_max` in a row: then the push stops with the last round's error. A
    // round that confirms the term in between starts the count again.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    let out = through_records(&mut engine, &first, t0);
    let on_their_way: Vec<String> = sends(&out).iter().map(|(e, _)| e.machine.clone()).collect();
    let half = t0 + window / 2;
    assert_eq!(engine.handle(half, Event::Tick), vec![Action::ConfirmLease]);
    for _ in 1..lease_rounds_failed_max {
        assert_eq!(
            engine.handle(half, unconfirmed()),
            vec![Action::ConfirmLease]
        );
    }
    let renewed = lease_at(4, half);
    let out = engine.handle(half, Event::Lease(Ok(renewed)));
    assert_eq!(extends(&out), vec![renewed.until], "the count starts again");
    let late = renewed.until + Duration::from_millis(10);
    assert_eq!(engine.handle(late, Event::Tick), vec![Action::ConfirmLease]);
    for _ in 1..lease_rounds_failed_max {
        assert_eq!(
            engine.handle(late, unconfirmed()),
            vec![Action::ConfirmLease]
        );
    }
    let out = engine.handle(late, unconfirmed());
    assert!(writes_nothing(&out), "{out:?}");
    assert!(
        !out.contains(&Action::ConfirmLease),
        "no round after the last: {out:?}"
    );
    assert!(
        out.iter().any(
            |a| matches!(a, Action::Stopped { epoch: 4, reason: StopReason::LeaseUnconfirmed {
                last: RoundFailure::Unconfirmed(why), rounds: 3 } }
            if why.contains("not confirmed by a quorum"))
        ),
        "{out:?}"
    );
    assert_eq!(engine.wake_at(), None);
    let mut last = Vec::new();
    for m in &on_their_way {
        last = engine.handle(late, applied(m));
        assert!(writes_nothing(&last), "{last:?}");
    }
    let view = answer(&last).expect("answers").as_ref().expect("ok");
    let stopped = lines(view)
        .into_values()
        .filter(|o| {
            matches!(o, PushOutcome::Failed { error, .. }
            if error.starts_with("stopped: lease could not be renewed:"))
        })
        .count();
    assert_eq!(stopped, 2, "{view:?}");

    // A round that confirms the term but whose lease closed before it answered (a replica
    // paused again and again) gave nothing to act under: it counts as failed too.
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    let mut now = t0 + window * 2;
    assert_eq!(engine.handle(now, Event::Tick), vec![Action::ConfirmLease]);
    for round in 1..=lease_rounds_failed_max {
        let confirmed = lease_at(4, now);
        now += window * 2;
        let out = engine.handle(now, Event::Lease(Ok(confirmed)));
        assert!(sends(&out).is_empty(), "{out:?}");
        if round < lease_rounds_failed_max {
            assert!(out.contains(&Action::ConfirmLease), "{out:?}");
        } else {
            assert!(
                out.iter().any(|a| matches!(
                    a,
                    Action::Stopped {
                        reason: StopReason::LeaseUnconfirmed {
                            last: RoundFailure::ClosedBeforeAnswer { term: 4, .. },
                            rounds: 3
                        },
                        ..
                    }
                )),
                "{out:?}"
            );
        }
    }
}

#[test]
fn g3_nothing_written_between_the_close_and_the_new_lease() {
    // G3 (decision 0270): from the lease's end until a round confirms a new one, nothing is
    // proposed, sent or extended, whatever comes back meanwhile (answers, sends stopped at the
    // write, rounds that fail); the sends stopped at the write wrote nothing and leave first
    // under the new lease. The same holds for the push's proposals.
    let t0 = Instant::now();
    let state = state_of(many(sends_in_flight_max + 2));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    let out = through_records(&mut engine, &first, t0);
    let on_their_way: Vec<String> = sends(&out).iter().map(|(e, _)| e.machine.clone()).collect();
    let end = t0 + window;
    let out = engine.handle(end, Event::Tick);
    assert_eq!(out, vec![Action::ConfirmLease]);
    let gap = [
        engine.handle(end, applied(&on_their_way[0])),
        engine.handle(end, gated(&on_their_way[1])),
        engine.handle(end + Duration::from_millis(5), unconfirmed()),
        engine.handle(end + Duration::from_millis(6), gated(&on_their_way[2])),
        engine.handle(end + Duration::from_millis(7), Event::Tick),
    ];
    for out in &gap {
        assert!(writes_nothing(out), "{out:?}");
        assert!(
            out.iter().all(|a| !matches!(a, Action::Stopped { .. })),
            "{out:?}"
        );
    }
    assert!(
        gap.iter()
            .flatten()
            .all(|a| !matches!(a, Action::Line(l) if l.machine != on_their_way[0])),
        "a send stopped at the write is not settled: {gap:?}"
    );
    let again = lease_at(4, end + Duration::from_millis(20));
    let out = engine.handle(again.started, Event::Lease(Ok(again)));
    let sent: Vec<(String, Instant)> = sends(&out)
        .iter()
        .map(|(e, d)| (e.machine.clone(), *d))
        .collect();
    assert_eq!(
        sent,
        vec![
            (on_their_way[2].clone(), again.until),
            (on_their_way[1].clone(), again.until),
            ("m064".to_string(), again.until),
        ],
        "{out:?}"
    );

    // Proposals too: the mints committed after the lease's end; the records wait for a lease.
    let state = state_of(provider_consumer_mesh());
    let (mut engine, first) = begin(&state, job(named("g14")), lease_at(4, t0), t0);
    assert_eq!(proposals(&first).len(), 1);
    let out = engine.handle(end, committed(4));
    assert_eq!(out, vec![Action::ConfirmLease]);
    assert!(writes_nothing(&engine.handle(end, unconfirmed())));
    let out = engine.handle(again.started, Event::Lease(Ok(again)));
    let p = proposals(&out);
    assert!(
        matches!(p.as_slice(), [(4, Some(4), Command::RecordSends { .. })]),
        "{out:?}"
    );
}

#[test]
fn g3_a_send_stopped_at_the_write_under_every_lease_stops_the_push_after_n_resends() {
    // G3 (decisions 0221, 0270): a send stopped at the write after its lease ended goes back to
    // the queue at most `gated_resends_max` times; stopped once more, it stops the push, so a
    // push whose writes never get through ends.
    let t0 = Instant::now();
    let state = state_of(many(1));
    let (mut engine, first) = begin(&state, job(PushTarget::All), lease_at(4, t0), t0);
    through_records(&mut engine, &first, t0);
    let mut lease = lease_at(4, t0);
    for round in 0..gated_resends_max {
        let out = engine.handle(lease.until, gated("m000"));
        assert!(
            out.iter()
                .all(|a| !matches!(a, Action::Line(_) | Action::Stopped { .. })),
            "resend {round}: {out:?}"
        );
        assert!(sends(&out).is_empty());
        assert!(out.contains(&Action::ConfirmLease), "{out:?}");
        lease = lease_at(4, lease.until);
        let out = engine.handle(lease.started, Event::Lease(Ok(lease)));
        assert_eq!(sends(&out).len(), 1, "resend {round}: {out:?}");
    }
    let out = engine.handle(lease.until, gated("m000"));
    assert!(
        out.iter().any(
            |a| matches!(a, Action::Stopped { reason: StopReason::Gated(why), .. } if why.contains("lease closed"))
        ),
        "{out:?}"
    );
    let view = answer(&out).expect("answers").as_ref().expect("ok");
    assert!(matches!(&lines(view)["m000"],
        PushOutcome::Failed { error, .. } if error.starts_with("stopped at the write:")));
}

/// [`begin`] under a floor unproven since a restore at term floor `restored`, with the marks
/// this leader heard in its term (decision 0274).
fn begin_unproven(
    state: &DomainState,
    job: PushJob,
    lease: Lease,
    restored: u64,
    marks: &[(&str, u64)],
) -> (PushEngine, Vec<Action>) {
    let marks: BTreeMap<String, u64> = marks.iter().map(|(m, e)| (m.to_string(), *e)).collect();
    let state = Arc::new(state.clone());
    let mut work = Work::default();
    work.refresh(&state).expect("the fixture composes");
    let mut secret = |_: &MintRequest| Some("secret".to_string());
    let begin = Begin {
        job,
        actor: "operator:test",
        signer: 1,
        lease,
        wall_ms: 1_000,
        state: &state,
        work: &work,
        reveal: &Reveal::none(),
        secret: &mut secret,
        frame_bytes_max: 16 * 1024 * 1024,
    };
    let unproven = floor::UnprovenFloor {
        restored,
        marks: &marks,
    };
    PushEngine::begin_under(lease.started, begin, Some(unproven))
}

/// Every line of a floor-held answer: all held, with one reason; nothing proposed or sent.
fn held_reason(actions: &[Action]) -> String {
    assert!(proposals(actions).is_empty(), "{actions:?}");
    assert!(sends(actions).is_empty(), "{actions:?}");
    let Some(Ok(view)) = answer(actions) else {
        panic!("a held push answers: {actions:?}");
    };
    let mut reasons = BTreeSet::new();
    for line in &view.lines {
        let PushOutcome::Held { reason, holds } = &line.outcome else {
            panic!("{line:?}");
        };
        assert!(holds.is_empty());
        reasons.insert(reason.clone());
    }
    assert_eq!(view.lines.len(), 3, "every machine of the push: {view:?}");
    assert_eq!(reasons.len(), 1);
    reasons.into_iter().next().unwrap_or_default()
}

#[test]
fn g9_an_unproven_floor_holds_every_machine_until_every_machine_showed_its_epoch() {
    // G9 (decision 0274): a leader restored without its floor file sends nothing while a machine
    // of the model has not shown this leader the epoch it holds; the reason names it.
    let t0 = Instant::now();
    let state = state_of(many(3));
    let marks = [("m000", 1), ("m001", 1)];
    let (engine, out) = begin_unproven(&state, job(PushTarget::All), lease_at(2, t0), 1, &marks);
    let reason = held_reason(&out);
    assert!(
        reason.contains("not heard yet in term 2: m002."),
        "{reason}"
    );
    assert!(engine.held_by_floor());
    assert!(!out.iter().any(|a| matches!(a, Action::FloorProven(_))));
    // A genesis' own machine cannot report before it: not waited for.
    let genesis = PushJob {
        keep: Some("m002".into()),
        ..job(PushTarget::All)
    };
    let (engine, out) = begin_unproven(&state, genesis, lease_at(2, t0), 1, &marks);
    assert!(!engine.held_by_floor(), "{out:?}");
}

#[test]
fn g9_every_mark_below_the_term_proves_the_floor_and_the_push_goes_on() {
    // G9 (decision 0274): the term is new to every host; the marker goes and the push plans.
    let t0 = Instant::now();
    let state = state_of(many(3));
    let marks = [("m000", 1), ("m001", 0), ("m002", 1)];
    let (engine, out) = begin_unproven(&state, job(PushTarget::All), lease_at(2, t0), 1, &marks);
    assert_eq!(
        out.first(),
        Some(&Action::FloorProven(floor::FloorProof::EveryMachineBelow {
            term: 2
        }))
    );
    assert!(!engine.held_by_floor());
    assert_eq!(
        proposals(&out).len(),
        1,
        "the records are proposed: {out:?}"
    );
    assert!(answer(&out).is_none());
    // A store that recorded a send of a term above the restore's is proven without a mark.
    let mut recorded = state.clone();
    let p = proposals(&out);
    let [(2, _, Command::RecordSends { sends: records })] = p.as_slice() else {
        panic!("{out:?}");
    };
    recorded
        .last_sends
        .insert(records[0].machine.clone(), records[0].clone());
    let (_, out) = begin_unproven(&recorded, job(PushTarget::All), lease_at(3, t0), 1, &[]);
    assert!(
        matches!(
            out.first(),
            Some(Action::FloorProven(floor::FloorProof::Recorded {
                epoch: 2,
                restored: 1,
                ..
            }))
        ),
        "{out:?}"
    );
}

#[test]
fn g9_a_host_holding_the_term_raises_the_floor_above_it_then_holds_every_machine() {
    // G9 (decisions 0272, 0274): a mark at or above the leader's term is a term used before: the
    // floor goes above it (the leader moves past it) and nothing is sent in this term.
    let t0 = Instant::now();
    let state = state_of(many(3));
    let marks = [("m000", 2), ("m001", 1)];
    let (mut engine, out) =
        begin_unproven(&state, job(PushTarget::All), lease_at(2, t0), 1, &marks);
    assert_eq!(
        out,
        vec![
            Action::LeaveTerm {
                machine: "m000".into(),
                epoch: 2,
                floor: 3
            },
            Action::RaiseFloor {
                epoch: 2,
                floor: 3,
                machine: "m000".into()
            },
        ]
    );
    assert!(engine.held_by_floor());
    assert_eq!(engine.wake_at(), None, "no lease round for a held push");
    // Nothing but the raise's answer settles it.
    assert!(engine.handle(t0, Event::Tick).is_empty());
    let out = engine.handle(t0, Event::Committed(Applied::EpochFloor { floor: 3 }));
    let reason = held_reason(&out);
    assert!(
        reason.contains("m000 holds an envelope of epoch 2"),
        "{reason}"
    );
    assert!(reason.contains("the floor is raised to 3"), "{reason}");
    assert!(engine.is_done());
    // The raise failed: said so, still held.
    let (mut engine, _) = begin_unproven(&state, job(PushTarget::All), lease_at(2, t0), 1, &marks);
    let out = engine.handle(t0, Event::Failed("no quorum".into()));
    let reason = held_reason(&out);
    assert!(
        reason.contains("raising the floor to 3 failed (no quorum)"),
        "{reason}"
    );
    // The floor already above the mark: held at once, nothing proposed.
    let mut raised = state.clone();
    raised.epoch_floor = 5;
    let (_, out) = begin_unproven(&raised, job(PushTarget::All), lease_at(2, t0), 1, &marks);
    let reason = held_reason(&out);
    assert!(reason.contains("the floor is 5"), "{reason}");
    assert!(!out.iter().any(|a| matches!(a, Action::RaiseFloor { .. })));
}
