//! Contract tests of the wire (decision 0240): for every message kind, at every version the
//! table in `transport/src/version.rs` says this build speaks, the request and the answer frames
//! committed in `tests/fixtures/wire/<kind>-v<N>-{request,answer}.bin` must still decode to the
//! values built here and those values must still encode to exactly the committed bytes. A change
//! of any body format (a field added, removed, reordered or retyped, a variant moved) fails its
//! kind's test until the kind gets a new version: raise its `newest`, add its values here and
//! write its fixtures; the old version's fixtures stay and keep being decoded.
//!
//! A fixture file is what crosses the wire, frame after frame: a 4-byte big-endian length, then a
//! `mesh/2` request header (version, kind, body) or a one-shot answer. Fixtures are written only
//! when asked (`MESH_WRITE_WIRE_FIXTURES=1 cargo test --test wire_contract`), and only where none
//! exists: a committed fixture is never overwritten, whatever the variable says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{CommittedLeaderId, EntryPayload, SnapshotMeta, StoredMembership, Vote};
use serde::Serialize;
use serde::de::DeserializeOwned;

use mesh::controller::api::{
    Answer, ApiError, Body, Call, Chunk, Forwarded, PushTarget, Request, RequestId, UploadId,
};
use mesh::core::declaration::{Declaration, Digest};
use mesh::core::envelope::{Envelope, Position, open, seal};
use mesh::core::report::{Exit, ModuleState, ModuleStatus, Report};
use mesh::core::settings::Scope;
use mesh::core::wire::{
    EnvelopeReply, LogChunk, LogCursor, LogStream, LogsAnswer, LogsAsk, ReportReply,
};
use mesh_raft::LogId;
use mesh_raft::network::{Probed, RaftCall, RaftReply, RaftRequest, Role};
use mesh_transport::frame::{self, Header};
use mesh_transport::version;
use mesh_transport::writers::MessageKind;

/// Asking for fixtures to be written where none exists.
const write_var: &str = "MESH_WRITE_WIRE_FIXTURES";

/// The machine every host-side fixture is about.
const machine: &str = "ace";

/// One direction of one kind at one version: the body of each frame, and how to read one back
/// (decode as the body's type, then encode again).
struct Direction {
    bodies: Vec<Vec<u8>>,
    reread: fn(&[u8]) -> Result<Vec<u8>, String>,
}

fn direction<T: Serialize + DeserializeOwned>(what: &'static str, values: &[T]) -> Direction {
    Direction {
        bodies: values
            .iter()
            .map(|v| mesh_codec::encode(what, v).expect("a contract value encodes"))
            .collect(),
        reread: |bytes| reread_as::<T>(bytes),
    }
}

fn reread_as<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let value: T = mesh_codec::decode("contract body", bytes).map_err(|e| e.to_string())?;
    mesh_codec::encode("contract body", &value).map_err(|e| e.to_string())
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn signing_key() -> SigningKey {
    // ed25519 signatures are deterministic: the same envelope seals to the same bytes.
    SigningKey::from_bytes(&[7u8; 32])
}

/// The timings the committed raft fixtures carry: fixed values, not the defaults of the day, so a
/// change of the default timings (decision 0328 moved them) is not taken for a change of the
/// wire format. The format is what the fixtures pin.
fn example_timings() -> mesh_raft::Timings {
    mesh_raft::Timings {
        heartbeat_ms: 100,
        election_timeout_min_ms: 400,
        election_timeout_max_ms: 700,
        lease_margin_ms: 100,
    }
}

fn raft_requests() -> Vec<RaftRequest> {
    let timings = example_timings();
    let entries = vec![
        mesh_raft::Entry {
            log_id: log_id(4, 11),
            payload: EntryPayload::Blank,
        },
        mesh_raft::Entry {
            log_id: log_id(4, 12),
            payload: EntryPayload::Normal(mesh_raft::Command(vec![b"first".to_vec(), vec![]])),
        },
    ];
    vec![
        RaftRequest {
            from: 1,
            timings,
            call: RaftCall::AppendEntries(AppendEntriesRequest {
                vote: Vote::new_committed(4, 1),
                prev_log_id: Some(log_id(3, 10)),
                entries,
                leader_commit: Some(log_id(3, 10)),
            }),
        },
        RaftRequest {
            from: 2,
            timings,
            call: RaftCall::Vote(VoteRequest::new(Vote::new(5, 2), Some(log_id(4, 12)))),
        },
        RaftRequest {
            from: 1,
            timings,
            call: RaftCall::InstallSnapshot(InstallSnapshotRequest {
                vote: Vote::new_committed(4, 1),
                meta: SnapshotMeta {
                    last_log_id: Some(log_id(2, 9)),
                    last_membership: StoredMembership::default(),
                    snapshot_id: "2-9-0".into(),
                },
                offset: 1 << 20,
                data: vec![9; 16],
                done: false,
            }),
        },
        RaftRequest {
            from: 3,
            timings,
            call: RaftCall::Probe,
        },
        RaftRequest {
            from: 1,
            timings,
            call: RaftCall::ElectNow,
        },
    ]
}

fn raft_replies() -> Vec<RaftReply> {
    vec![
        RaftReply::AppendEntries(Ok(AppendEntriesResponse::Success)),
        RaftReply::AppendEntries(Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(
            4, 11,
        ))))),
        RaftReply::AppendEntries(Ok(AppendEntriesResponse::HigherVote(Vote::new(6, 3)))),
        RaftReply::Vote(Ok(VoteResponse {
            vote: Vote::new(5, 2),
            vote_granted: true,
            last_log_id: Some(log_id(4, 12)),
        })),
        RaftReply::InstallSnapshot(Ok(InstallSnapshotResponse {
            vote: Vote::new_committed(4, 1),
        })),
        RaftReply::Probe(Probed {
            id: 3,
            role: Role::Follower,
            term: 4,
            leader: Some(1),
            last_log_index: Some(12),
            applied_index: Some(11),
        }),
        RaftReply::ElectNow(Err("not the leader this replica knows".into())),
        RaftReply::TimingsDiffer {
            replica: 2,
            timings: example_timings(),
        },
    ]
}

fn envelope() -> Envelope {
    let mut revoked = BTreeMap::new();
    revoked.insert("principal:operator:old".to_string(), "left".to_string());
    let mut declaration = Declaration {
        machine: machine.into(),
        modules: vec![
            mesh_testkit::declared::sleeper("db"),
            mesh_testkit::declared::shell("app", "echo hi"),
        ],
        revoked,
        signers: BTreeMap::new(),
    };
    declaration.modules[1]
        .env
        .insert("MODE".into(), "contract".into());
    declaration.modules[1]
        .files
        .insert("conf/app.toml".into(), "port = 80\n".into());
    Envelope {
        machine: machine.into(),
        epoch: 4,
        sequence: 17,
        signer: 1,
        moves: vec!["db".into()],
        declaration,
    }
}

fn envelope_replies() -> Vec<EnvelopeReply> {
    vec![
        EnvelopeReply::Applied {
            position: Position {
                epoch: 4,
                sequence: 17,
            },
            digest: Digest([3; 32]),
        },
        EnvelopeReply::Refused {
            refusal: "not newer than epoch 4 sequence 17".into(),
            older: true,
        },
    ]
}

fn reports() -> Vec<Report> {
    vec![Report {
        machine: machine.into(),
        epoch: 4,
        sequence: 17,
        report_sequence: 41,
        applied: Some(Digest([3; 32])),
        modules: vec![
            ModuleStatus {
                name: "db".into(),
                state: ModuleState::Running,
                restarts: 2,
                pid: Some(4242),
                last_exit: Some(Exit::Code(1)),
                drift: Vec::new(),
            },
            ModuleStatus {
                name: "app".into(),
                state: ModuleState::Running,
                restarts: 0,
                pid: None,
                last_exit: None,
                drift: Vec::new(),
            },
        ],
        refused_older: 1,
        last_refusal: Some("older envelope".into()),
        proof: None,
    }]
}

fn report_replies() -> Vec<ReportReply> {
    vec![
        ReportReply::Filed { accepted: true },
        ReportReply::NotLeader {
            leader: Some("10.0.0.1:7000".into()),
        },
        ReportReply::Refused {
            reason: "epoch 9 above the floor without a proof".into(),
        },
    ]
}

fn logs_ask() -> LogsAsk {
    LogsAsk {
        module: Some("app".into()),
        lines: 100,
        from: vec![LogCursor {
            module: "app".into(),
            stream: LogStream::Stderr,
            offset: 4096,
        }],
    }
}

fn logs_answers() -> Vec<LogsAnswer> {
    vec![LogsAnswer {
        machine: machine.into(),
        chunks: vec![
            LogChunk {
                module: "app".into(),
                stream: LogStream::Stdout,
                start: 0,
                end: 12,
                lines: vec!["hello".into(), "world".into()],
                more: false,
                rotated: true,
            },
            LogChunk {
                module: "app".into(),
                stream: LogStream::Stderr,
                start: 4096,
                end: 4100,
                lines: vec!["oops".into()],
                more: true,
                rotated: false,
            },
        ],
    }]
}

/// Operator requests, each field with a value of its own so that swapped fields show: among them
/// the one a follower relays (Push), the one relayed to a host (Logs) and the model (Apply).
fn operator_requests() -> Vec<Request> {
    vec![
        Request::Status,
        Request::Push {
            target: PushTarget::Machine(machine.into()),
            why: "contract".into(),
            moves: vec!["db".into()],
            plan: None,
        },
        Request::SettingsClear {
            scope: Scope::Placement {
                module: "app".into(),
                machine: machine.into(),
            },
            why: "contract".into(),
        },
        Request::SnapshotChunk {
            snapshot: Some(7),
            offset: 1 << 20,
        },
        Request::CertsRevoke {
            target: "principal:operator:old".into(),
            why: "left".into(),
        },
        Request::Logs {
            machine: machine.into(),
            ask: logs_ask(),
        },
        // The model as a whole travels in Apply: its format is pinned here too (so is the
        // testkit model's content: change that fixture model and this fixture must be rewritten).
        Request::Apply {
            mesh: mesh_testkit::model::provider_consumer_mesh(),
            why: "contract".into(),
            drain: true,
        },
        Request::ApplyChunk {
            upload: UploadId([8; 16]),
            index: 1,
            chunks_total: 3,
            bytes_total: 5_000_000,
            bytes: Chunk(Arc::new(vec![1, 2, 3, 4])),
        },
        Request::ApplyUpload {
            upload: UploadId([8; 16]),
            digest: [9; 32],
            why: "large".into(),
            drain: false,
        },
        Request::Genesis {
            machine: "g14".into(),
            why: "new machine".into(),
        },
        Request::CertsList,
        Request::ReplicasRemove { id: 3 },
    ]
}

fn operator_answers() -> Vec<Answer> {
    vec![
        Answer {
            replica: 1,
            forwarded_by: Some(2),
            body: Ok(Body::CertsRevoked {
                target: "principal:operator:old".into(),
                entries: 3,
            }),
        },
        Answer {
            replica: 1,
            forwarded_by: None,
            body: Ok(Body::ChunkStaged {
                upload: UploadId([4; 16]),
                received: 2,
                chunks_total: 5,
            }),
        },
        Answer {
            replica: 2,
            forwarded_by: None,
            body: Ok(Body::Logs(logs_answers().remove(0))),
        },
        Answer {
            replica: 1,
            forwarded_by: Some(3),
            body: Ok(Body::Applied {
                revision: 12,
                changes: vec!["ace".into()],
                settings_ignored: vec!["module/app".into()],
                draining: vec!["old".into()],
            }),
        },
        Answer {
            replica: 1,
            forwarded_by: None,
            body: Ok(Body::SettingsSet {
                scope: Scope::Machine(machine.into()),
                added: vec!["a".into()],
                changed: vec!["c".into()],
                removed: vec!["r".into()],
            }),
        },
        Answer {
            replica: 2,
            forwarded_by: None,
            body: Ok(Body::SnapshotChunk {
                snapshot: 7,
                total: 9_000_000,
                offset: 1 << 20,
                bytes: vec![5; 8],
                epoch_floor: 4,
            }),
        },
        Answer {
            replica: 3,
            forwarded_by: None,
            body: Err(ApiError::NoLeader {
                replica: 3,
                waited_ms: 2000,
                reason: "no replica answered".into(),
            }),
        },
        Answer {
            replica: 3,
            forwarded_by: None,
            body: Err(ApiError::BadRequest {
                reason: "not a request this replica reads".into(),
            }),
        },
    ]
}

/// The contract of `kind` at `version`: its request and its answer frames. `None` for a version
/// nobody wrote values for, which the table test reports.
fn contract(kind: &MessageKind, version: u16) -> Option<(Direction, Direction)> {
    match (version::word(kind), version) {
        ("raft", 1) => Some((
            direction("raft request", &raft_requests()),
            direction("raft reply", &raft_replies()),
        )),
        ("envelope", 1) => {
            let key = signing_key();
            let sealed = seal(&envelope(), &key).expect("seal");
            let request = Direction {
                bodies: vec![sealed],
                reread: reread_envelope,
            };
            Some((request, direction("envelope reply", &envelope_replies())))
        }
        ("report", 1) => Some((
            direction("report", &reports()),
            direction("report reply", &report_replies()),
        )),
        ("command", 1) => {
            let calls: Vec<Call> = operator_requests()
                .into_iter()
                .enumerate()
                .map(|(i, request)| Call {
                    id: RequestId([i as u8 + 1; 16]),
                    request,
                })
                .collect();
            Some((
                direction("call", &calls),
                direction("answer", &operator_answers()),
            ))
        }
        ("forward", 1) => {
            let forwarded: Vec<Forwarded> = operator_requests()
                .into_iter()
                .enumerate()
                .map(|(i, request)| Forwarded {
                    actor: "operator:alice".into(),
                    via: 2,
                    id: RequestId([i as u8 + 1; 16]),
                    request,
                })
                .collect();
            Some((
                direction("forwarded", &forwarded),
                direction("answer", &operator_answers()),
            ))
        }
        ("logs", 1) => Some((
            direction("logs ask", &[logs_ask()]),
            direction("logs answer", &logs_answers()),
        )),
        _ => None,
    }
}

/// An envelope is read as a host reads it: opened with the signer's key (which decodes the
/// declaration inside), then sealed again.
fn reread_envelope(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let key = signing_key();
    let trusted = BTreeMap::from([(1u64, key.verifying_key())]);
    let envelope = open(bytes, &trusted, machine, None).map_err(|e| e.to_string())?;
    seal(&envelope, &key).map_err(|e| e.to_string())
}

/// The kind as it goes in a header (a report names its machine).
fn header_kind(kind: &MessageKind) -> MessageKind {
    match kind {
        MessageKind::Report { .. } => MessageKind::Report {
            machine: machine.into(),
        },
        other => other.clone(),
    }
}

fn fixture_path(kind: &MessageKind, version: u16, side: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/wire")
        .join(format!("{}-v{version}-{side}.bin", version::word(kind)))
}

fn frames_of(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut frames = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_at_checked(frame::length_prefix_bytes)
            .ok_or("a length prefix cut short")?;
        let len = u32::from_be_bytes(len.try_into().map_err(|_| "prefix")?) as usize;
        let (frame, tail) = tail.split_at_checked(len).ok_or("a frame cut short")?;
        frames.push(frame.to_vec());
        rest = tail;
    }
    Ok(frames)
}

fn framed(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for frame in frames {
        out.extend_from_slice(&(frame.len() as u32).to_be_bytes());
        out.extend_from_slice(frame);
    }
    out
}

/// Reads the fixture at `path`, or writes `fresh` there when asked and none exists. Never
/// overwrites.
fn fixture(path: &PathBuf, fresh: &[u8]) -> Vec<u8> {
    match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && std::env::var_os(write_var).is_some() =>
        {
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            // Whole or not at all: the table test writes the same files beside the kinds' tests.
            let tmp = path.with_extension(format!("tmp-{:?}", std::thread::current().id()));
            std::fs::write(&tmp, fresh).expect("write fixture");
            std::fs::rename(&tmp, path).expect("move fixture in place");
            eprintln!("wrote {}", path.display());
            fresh.to_vec()
        }
        Err(e) => panic!(
            "{}: {e}; a new version's fixtures are written with {write_var}=1 (existing ones never are)",
            path.display()
        ),
    }
}

/// The contract of one kind at every version it speaks: each committed frame still decodes to
/// the value built here, and each value still encodes to the committed bytes.
fn check_kind(kind: MessageKind) {
    let word = version::word(&kind);
    let speaks = version::speaks(&kind);
    for v in speaks.oldest..=speaks.newest {
        let Some((request, answer)) = contract(&kind, v) else {
            panic!(
                "{word} v{v} is in the version table but has no contract: add its values to contract() and write its fixtures with {write_var}=1"
            );
        };
        let format_changed = |side: &str, what: String| -> String {
            format!(
                "{word} v{v} {side}: {what}. The wire format of {word} changed: a peer of this version would misread it. Keep v{v} as it is and add {word} v{} (transport/src/version.rs, its values in contract(), its fixtures with {write_var}=1)",
                v + 1
            )
        };
        // Requests: mesh/2 headers of this kind and version.
        let headers: Vec<Vec<u8>> = request
            .bodies
            .iter()
            .map(|body| {
                let header = Header {
                    version: v,
                    kind: header_kind(&kind),
                    body: body.clone(),
                };
                frame::encode_header(&header).expect("encode header")
            })
            .collect();
        let path = fixture_path(&kind, v, "request");
        let committed = frames_of(&fixture(&path, &framed(&headers)))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            committed.len(),
            headers.len(),
            "{}",
            format_changed(
                "request",
                format!(
                    "{} frames committed, {} built",
                    committed.len(),
                    headers.len()
                )
            )
        );
        for (i, (committed, built)) in committed.iter().zip(&headers).enumerate() {
            let header = frame::decode_header(committed).unwrap_or_else(|e| {
                panic!(
                    "{}",
                    format_changed("request", format!("frame {i}'s header: {e}"))
                )
            });
            assert_eq!(header.version, v, "{word} request frame {i}");
            assert_eq!(header.kind, header_kind(&kind), "{word} request frame {i}");
            let reread = (request.reread)(&header.body).unwrap_or_else(|e| {
                panic!(
                    "{}",
                    format_changed("request", format!("frame {i} no longer decodes: {e}"))
                )
            });
            assert!(
                reread == header.body,
                "{}",
                format_changed(
                    "request",
                    format!("frame {i} decodes but encodes again to other bytes")
                )
            );
            assert!(
                committed == built,
                "{}",
                format_changed(
                    "request",
                    format!("frame {i} as built now differs from the committed bytes")
                )
            );
        }
        // Answers: one-shot responses carrying the answer's body.
        let responses: Vec<Vec<u8>> = answer
            .bodies
            .iter()
            .map(|body| frame::encode_response(&Ok(body.clone())).expect("encode response"))
            .collect();
        let path = fixture_path(&kind, v, "answer");
        let committed = frames_of(&fixture(&path, &framed(&responses)))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            committed.len(),
            responses.len(),
            "{}",
            format_changed(
                "answer",
                format!(
                    "{} frames committed, {} built",
                    committed.len(),
                    responses.len()
                )
            )
        );
        for (i, (committed, built)) in committed.iter().zip(&responses).enumerate() {
            let body = match frame::decode_response(committed) {
                Ok(Ok(body)) => body,
                other => panic!(
                    "{}",
                    format_changed("answer", format!("frame {i} is not an answer: {other:?}"))
                ),
            };
            let reread = (answer.reread)(&body).unwrap_or_else(|e| {
                panic!(
                    "{}",
                    format_changed("answer", format!("frame {i} no longer decodes: {e}"))
                )
            });
            assert!(
                reread == body,
                "{}",
                format_changed(
                    "answer",
                    format!("frame {i} decodes but encodes again to other bytes")
                )
            );
            assert!(
                committed == built,
                "{}",
                format_changed(
                    "answer",
                    format!("frame {i} as built now differs from the committed bytes")
                )
            );
        }
    }
}

#[test]
fn g_wire_raft_v1_requests_and_replies_decode_from_the_committed_fixtures() {
    check_kind(MessageKind::Raft);
}

#[test]
fn g_wire_envelope_v1_sealed_envelopes_and_replies_decode_from_the_committed_fixtures() {
    check_kind(MessageKind::Envelope);
}

#[test]
fn g_wire_report_v1_reports_and_replies_decode_from_the_committed_fixtures() {
    check_kind(MessageKind::Report {
        machine: machine.into(),
    });
}

#[test]
fn g_wire_command_v1_calls_and_answers_decode_from_the_committed_fixtures() {
    check_kind(MessageKind::Command);
}

#[test]
fn g_wire_forward_v1_forwarded_requests_and_answers_decode_from_the_committed_fixtures() {
    check_kind(MessageKind::Forward);
}

#[test]
fn g_wire_logs_v1_asks_and_answers_decode_from_the_committed_fixtures() {
    check_kind(MessageKind::Logs);
}

#[test]
fn g_wire_every_kind_and_version_in_the_table_has_a_contract_and_no_fixture_is_left_over() {
    // A kind or version added to the table without values and fixtures fails here (and in its
    // kind's test); a fixture of a version the table no longer speaks is named too, so dropping
    // an old version is a decision, not an accident.
    let mut expected = BTreeSet::new();
    for kind in version::every_kind() {
        // Each kind's own check first, so a run asked to write fixtures has written them all.
        check_kind(kind.clone());
        let speaks = version::speaks(&kind);
        for v in speaks.oldest..=speaks.newest {
            assert!(
                contract(&kind, v).is_some(),
                "{} v{v} has no contract",
                version::word(&kind)
            );
            for side in ["request", "answer"] {
                expected.insert(format!("{}-v{v}-{side}.bin", version::word(&kind)));
            }
        }
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire");
    let found: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; write the fixtures with {write_var}=1",
                dir.display()
            )
        })
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let missing: Vec<_> = expected.difference(&found).collect();
    let extra: Vec<_> = found.difference(&expected).collect();
    assert!(
        missing.is_empty(),
        "fixtures missing in {}: {missing:?}; write them with {write_var}=1",
        dir.display()
    );
    assert!(
        extra.is_empty(),
        "fixtures of versions the table does not speak in {}: {extra:?}; remove them when a version is dropped on purpose",
        dir.display()
    );
}
