//! The hostile peer (issue 23 part 5): endpoints holding valid certificates that send what the
//! product must bound or refuse. A host certificate for `eve`, a machine the CA certified that is
//! not in the model (a machine taken out of the model whose certificate was never revoked, or a
//! stolen one): it floods valid-looking reports, sends frames over its limit and reports over
//! their bounds, replays reports and sends self-contradicting ones. A second copy of replica
//! [`hostile_replica_id`]'s certificate on its own socket: Raft calls claiming another replica's
//! id, and terms above `term_max`. Each behaviour is one nemesis fault (`nemesis.rs`); what it
//! sent that must be refused, and how much of that was taken anyway, is recorded
//! ([`Event::HostileSent`], checked by "no hostile message is taken").

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mesh::core::envelope::{EnvelopeHeader, EpochProof};
use mesh::core::report::{ModuleState, ModuleStatus, Report};
use mesh::core::wire::{ReportReply, report_reply_what, report_what};
use mesh_raft::network::{RaftCall, RaftRequest};
use mesh_testkit::Pki;
use mesh_transport::{CheckedConfig, Endpoint, MessageKind, Principal, report_frame_bytes_max};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{LeaderId, Vote};
use tokio::task::JoinSet;

use crate::rng::Rng;

/// The machine of the hostile host certificate (not in the model).
pub const hostile_machine: &str = "eve";
/// The replica whose certificate the hostile peer holds a copy of.
pub const hostile_replica_id: u64 = 2;
/// Requests of a flood in flight at once: 64 times what a host ever has (one), within one
/// connection's 256 streams. Enough that, queued whole, they would hold the other hosts'
/// reports back by dozens of commit rounds (one report of this size fills a proposal).
pub const flood_streams: usize = 64;
/// Frames over the frame limit in flight at once (each 1.5–3 MiB, so a few).
pub const oversized_streams: usize = 4;
/// Frames within the frame limit but over a report's bounds in flight at once. At 32, in a
/// debug build on 2 loaded cores (the hostile peer shares them), the leader's reading and
/// bounded decoding of them kept the other hosts' reports waiting 2.3 s (docs/chaos.md).
pub const over_bound_streams: usize = 8;
/// Modules of a flood's report, at least and at most (`report_modules_max` is 1024): with a
/// 500-byte failure text each, 300–500 KiB on the wire, within every bound.
pub const flood_modules_min: u64 = 600;
pub const flood_modules_max: u64 = 1_000;
/// Bytes of each flood module's failure text (`report_text_bytes_max` is 512).
pub const flood_text_bytes: usize = 500;
/// How long one hostile request may wait for its answer.
pub const hostile_request_ms: u64 = 3_000;

/// What one behaviour sent and how it was answered.
#[derive(Debug, Default)]
pub struct Sent {
    /// Messages that must be refused.
    pub forged: AtomicU64,
    /// Of those, answered as taken.
    pub taken: AtomicU64,
    /// Legal messages of a flood, and how they were answered.
    pub legal: AtomicU64,
    pub filed: AtomicU64,
    pub busy: AtomicU64,
    pub failed: AtomicU64,
    /// One forged message that was taken, for the record.
    pub example: std::sync::Mutex<Option<String>>,
}

impl Sent {
    fn took(&self, what: String) {
        self.taken.fetch_add(1, Ordering::SeqCst);
        let mut example = self.example.lock().unwrap_or_else(|p| p.into_inner());
        if example.is_none() {
            *example = Some(what);
        }
    }

    /// A summary for the step's record.
    pub fn summary(&self) -> String {
        let n = |a: &AtomicU64| a.load(Ordering::SeqCst);
        format!(
            "legal {} (filed {}, told to try again {}, failed {}); forged {} (taken {})",
            n(&self.legal),
            n(&self.filed),
            n(&self.busy),
            n(&self.failed),
            n(&self.forged),
            n(&self.taken)
        )
    }
}

/// The hostile peer's endpoints.
pub struct Hostile {
    host: Endpoint,
    replica: Endpoint,
    /// The next report sequence of `eve`'s reports: increasing, as an honest host's counter.
    report_sequence: AtomicU64,
    /// The reports of eve already sent, for replays.
    sent_reports: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl Hostile {
    /// Binds the hostile host and replica endpoints on loopback.
    pub fn bind(pki: &Pki, transport: &CheckedConfig) -> Result<Hostile, String> {
        let host = Endpoint::bind(
            mesh_testkit::loopback(),
            &pki.identity(&Principal::Host(hostile_machine.into())),
            transport.clone(),
        )
        .map_err(|e| format!("bind the hostile host: {e}"))?;
        let replica = Endpoint::bind(
            mesh_testkit::loopback(),
            &pki.identity(&Principal::Replica(hostile_replica_id)),
            transport.clone(),
        )
        .map_err(|e| format!("bind the hostile replica: {e}"))?;
        Ok(Hostile {
            host,
            replica,
            report_sequence: AtomicU64::new(1),
            sent_reports: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Closes both endpoints.
    pub async fn close(&self) {
        self.host.close().await;
        self.replica.close().await;
    }

    fn next_report(&self, modules: Vec<ModuleStatus>) -> Report {
        Report {
            machine: hostile_machine.into(),
            epoch: 0,
            sequence: 0,
            report_sequence: self.report_sequence.fetch_add(1, Ordering::SeqCst),
            applied: None,
            modules,
            refused_older: 0,
            last_refusal: None,
            proof: None,
        }
    }

    /// Sends one report frame as `frame_machine` to `to`.
    async fn report(
        &self,
        to: std::net::SocketAddr,
        frame_machine: &str,
        body: Vec<u8>,
    ) -> Result<ReportReply, String> {
        let kind = MessageKind::Report {
            machine: frame_machine.into(),
        };
        let answer = self
            .host
            .request(to, kind, body, Duration::from_millis(hostile_request_ms))
            .await
            .map_err(|e| e.to_string())?;
        mesh_codec::decode::<ReportReply>(report_reply_what, &answer).map_err(|e| e.to_string())
    }

    /// Floods `to` with legal reports of eve for `time`: [`flood_streams`] requests at once,
    /// each sent again as soon as it is answered.
    pub async fn flood(
        self: &Arc<Self>,
        to: std::net::SocketAddr,
        time: Duration,
        rng: &mut Rng,
    ) -> Arc<Sent> {
        let sent = Arc::new(Sent::default());
        let modules = rng.between(flood_modules_min, flood_modules_max) as usize;
        let module = |i: usize| ModuleStatus {
            name: format!("flood-{i:04}"),
            state: ModuleState::Failed {
                error: "x".repeat(flood_text_bytes),
            },
            restarts: 1,
            pid: None,
            last_exit: None,
            drift: Vec::new(),
        };
        let template: Vec<ModuleStatus> = (0..modules).map(module).collect();
        let deadline = tokio::time::Instant::now() + time;
        let mut tasks = JoinSet::new();
        for _ in 0..flood_streams {
            let (me, sent, template) = (self.clone(), sent.clone(), template.clone());
            tasks.spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    let report = me.next_report(template.clone());
                    let Ok(body) = mesh_codec::encode(report_what, &report) else {
                        return;
                    };
                    sent.legal.fetch_add(1, Ordering::SeqCst);
                    match me.report(to, hostile_machine, body).await {
                        Ok(ReportReply::Filed { .. }) => sent.filed.fetch_add(1, Ordering::SeqCst),
                        Ok(ReportReply::NotLeader { .. }) => {
                            sent.busy.fetch_add(1, Ordering::SeqCst)
                        }
                        Ok(ReportReply::Refused { .. }) | Err(_) => {
                            sent.failed.fetch_add(1, Ordering::SeqCst)
                        }
                    };
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        sent
    }

    /// Frames over the host's frame limit, frames within it holding more module entries than any
    /// report may, and reports whose texts are over their bounds, for `time`: every one must be
    /// refused, none decoded whole.
    pub async fn oversized(
        self: &Arc<Self>,
        to: std::net::SocketAddr,
        time: Duration,
        rng: &mut Rng,
    ) -> Arc<Sent> {
        let sent = Arc::new(Sent::default());
        // Over the frame limit: 1.5–3 times it.
        let over_frame = report_frame_bytes_max + rng.between(512, 2_048) as usize * 1_024;
        let too_big = vec![0x5a_u8; over_frame];
        // Within the frame limit: empty module entries (5 bytes each on the wire, about 80 in
        // memory once decoded), as many as fit.
        let entries = (report_frame_bytes_max - 4_096) / 5;
        let empty = ModuleStatus {
            name: String::new(),
            state: ModuleState::Starting,
            restarts: 0,
            pid: None,
            last_exit: None,
            drift: Vec::new(),
        };
        let many = self.next_report(vec![empty; entries]);
        let Ok(many) = mesh_codec::encode(report_what, &many) else {
            return sent;
        };
        // Within the frame limit and the module count, but every text over its bound: a name
        // over `report_name_bytes_max`, a failure over `report_text_bytes_max`, a last refusal
        // over `report_refusal_bytes_max`.
        let long = Report {
            last_refusal: Some("r".repeat(8 * 1_024)),
            ..self.next_report(vec![ModuleStatus {
                name: "n".repeat(1_024),
                state: ModuleState::Failed {
                    error: "e".repeat(4 * 1_024),
                },
                restarts: 0,
                pid: None,
                last_exit: None,
                drift: Vec::new(),
            }])
        };
        let Ok(long) = mesh_codec::encode(report_what, &long) else {
            return sent;
        };
        let deadline = tokio::time::Instant::now() + time;
        let mut tasks = JoinSet::new();
        for stream in 0..oversized_streams + over_bound_streams {
            let (me, sent) = (self.clone(), sent.clone());
            let body = if stream < oversized_streams {
                too_big.clone()
            } else if stream % 2 == 0 {
                many.clone()
            } else {
                long.clone()
            };
            tasks.spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    sent.forged.fetch_add(1, Ordering::SeqCst);
                    let bytes = body.len();
                    if let Ok(reply @ ReportReply::Filed { .. }) =
                        me.report(to, hostile_machine, body.clone()).await
                    {
                        sent.took(format!("a {bytes}-byte frame answered {reply:?}"));
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        sent
    }

    /// Replays: eve's reports sent before (the same bytes) and its counter going backwards, which
    /// must be filed as not newer; and `stolen`, another host's report, sent as eve's (the body
    /// names another machine) and as that host's (a frame eve's certificate may not send), which
    /// must not be filed at all.
    pub async fn replay(
        self: &Arc<Self>,
        to: std::net::SocketAddr,
        time: Duration,
        stolen: Option<Report>,
    ) -> Arc<Sent> {
        let sent = Arc::new(Sent::default());
        // A fresh report first, so the account has something newer than what follows.
        let fresh = self.next_report(vec![]);
        let Ok(body) = mesh_codec::encode(report_what, &fresh) else {
            return sent;
        };
        sent.legal.fetch_add(1, Ordering::SeqCst);
        if let Ok(ReportReply::Filed { .. }) = self.report(to, hostile_machine, body.clone()).await
        {
            sent.filed.fetch_add(1, Ordering::SeqCst);
        }
        self.remember(body);
        let deadline = tokio::time::Instant::now() + time;
        let mut back = fresh.report_sequence;
        while tokio::time::Instant::now() < deadline {
            let old = self
                .sent_reports
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let mut frames: Vec<(String, Vec<u8>, bool)> = old
                .into_iter()
                .map(|b| (hostile_machine.to_string(), b, false))
                .collect();
            back = back.saturating_sub(1);
            let backwards = Report {
                report_sequence: back,
                ..fresh.clone()
            };
            if let Ok(b) = mesh_codec::encode(report_what, &backwards) {
                frames.push((hostile_machine.into(), b, false));
            }
            if let Some(theirs) = &stolen
                && let Ok(b) = mesh_codec::encode(report_what, theirs)
            {
                frames.push((hostile_machine.into(), b.clone(), true));
                frames.push((theirs.machine.clone(), b, true));
            }
            for (frame_machine, body, other_machine) in frames {
                sent.forged.fetch_add(1, Ordering::SeqCst);
                match self.report(to, &frame_machine, body).await {
                    Ok(ReportReply::Filed { accepted: true }) => sent.took(format!(
                        "a replayed or backward report framed as {frame_machine}'s filed as newer"
                    )),
                    Ok(ReportReply::Filed { accepted: false }) if other_machine => sent.took(
                        format!("another machine's report framed as {frame_machine}'s filed"),
                    ),
                    Ok(_) | Err(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sent
    }

    fn remember(&self, body: Vec<u8>) {
        let mut sent = self.sent_reports.lock().unwrap_or_else(|p| p.into_inner());
        if sent.len() < 8 {
            sent.push(body);
        }
    }

    /// Self-contradicting reports for `time`: an epoch above the cluster's term (so above the
    /// floor) without a proof, with another host's proof, with a forged signature; an epoch and
    /// counter beyond any a host reaches. Every one must be refused.
    pub async fn contradict(
        self: &Arc<Self>,
        to: std::net::SocketAddr,
        term: u64,
        time: Duration,
        stolen: Option<Report>,
    ) -> Arc<Sent> {
        let sent = Arc::new(Sent::default());
        let deadline = tokio::time::Instant::now() + time;
        while tokio::time::Instant::now() < deadline {
            let above = term.saturating_add(7);
            let base = Report {
                epoch: above,
                sequence: 3,
                ..self.next_report(vec![])
            };
            let forged_header = EnvelopeHeader {
                machine: hostile_machine.into(),
                epoch: above,
                sequence: 3,
                signer: 1,
                digest: mesh::core::declaration::Digest([7; 32]),
            };
            let mut lies = vec![
                ("an epoch above the floor without a proof", base.clone()),
                (
                    "an epoch above the floor with a forged signature",
                    Report {
                        proof: Some(EpochProof {
                            header: forged_header,
                            signature: vec![9; 64],
                        }),
                        ..base.clone()
                    },
                ),
                (
                    "an epoch and counter beyond any a host reaches",
                    Report {
                        epoch: u64::MAX,
                        sequence: u64::MAX,
                        report_sequence: u64::MAX,
                        ..base.clone()
                    },
                ),
            ];
            if let Some(proof) = stolen.as_ref().and_then(|r| r.proof.clone()) {
                lies.push((
                    "an epoch above the floor with another host's proof",
                    Report {
                        proof: Some(proof),
                        ..base.clone()
                    },
                ));
            }
            for (what, lie) in lies {
                let Ok(body) = mesh_codec::encode(report_what, &lie) else {
                    continue;
                };
                sent.forged.fetch_add(1, Ordering::SeqCst);
                if let Ok(reply @ ReportReply::Filed { .. }) =
                    self.report(to, hostile_machine, body).await
                {
                    sent.took(format!("{what}: answered {reply:?}"));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sent
    }

    /// Raft calls with replica [`hostile_replica_id`]'s certificate to `to` (the other replicas)
    /// for `time`: claiming to come from another replica, a vote for another candidate, entries
    /// as another leader, and votes and entries at a term above `term_max`. Every one must be
    /// refused before Raft sees it; an answer at all is taken.
    pub async fn replica_calls(
        self: &Arc<Self>,
        to: Vec<(u64, std::net::SocketAddr)>,
        term: u64,
        timings: mesh_raft::Timings,
        time: Duration,
    ) -> Arc<Sent> {
        let sent = Arc::new(Sent::default());
        let me = hostile_replica_id;
        let deadline = tokio::time::Instant::now() + time;
        while tokio::time::Instant::now() < deadline {
            for (id, addr) in &to {
                let next = term.saturating_add(1);
                let beyond = mesh_raft::term_max + 1;
                let calls = [
                    (
                        "a vote claiming to come from another replica",
                        *id,
                        vote(next, Some(*id)),
                    ),
                    ("a vote for another candidate", me, vote(next, Some(*id))),
                    ("entries as another leader", me, append(next, *id)),
                    ("a vote above term_max", me, vote(beyond, Some(me))),
                    ("entries above term_max", me, append(beyond, me)),
                ];
                for (what, from, call) in calls {
                    let request = RaftRequest {
                        from,
                        timings,
                        call,
                    };
                    let Ok(body) = mesh_codec::encode("raft request", &request) else {
                        continue;
                    };
                    sent.forged.fetch_add(1, Ordering::SeqCst);
                    let answer = self
                        .replica
                        .request(
                            *addr,
                            MessageKind::Raft,
                            body,
                            Duration::from_millis(hostile_request_ms),
                        )
                        .await;
                    // Refused (an error answer) or unanswered: not taken.
                    if answer.is_ok() {
                        sent.took(format!("{what} to replica {id} answered"));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sent
    }
}

fn vote(term: u64, candidate: Option<u64>) -> RaftCall {
    let vote = Vote {
        leader_id: LeaderId {
            term,
            voted_for: candidate,
        },
        committed: false,
    };
    RaftCall::Vote(VoteRequest::new(vote, None))
}

fn append(term: u64, leader: u64) -> RaftCall {
    RaftCall::AppendEntries(AppendEntriesRequest {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    })
}
