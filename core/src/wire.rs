//! The answers that travel back over QUIC between replicas and hosts: a host's answer to an
//! envelope, a replica's answer to a report. Pure types; both sides encode them with `mesh_codec`.
//!
//! Contract (the controller codes against it, decision 0044):
//! - `MessageKind::Envelope` request: body = the bytes `core::envelope::seal` made, exactly.
//!   Answer: an encoded [`EnvelopeReply`]. A transport-level refusal (an `Err` from the handler)
//!   means the host could not keep its state and is stopping: the envelope is not applied.
//! - `MessageKind::Report { machine }` request: body = `mesh_codec::encode("report", &Report)`,
//!   whose `machine` must equal the frame's ([`check_report_machine`]). Answer: an encoded
//!   [`ReportReply`]. A replica refuses at the transport level (handler `Err`) only a report that
//!   will never be taken, whoever is asked (undecodable, wrong machine); the host drops it. Anything
//!   that may pass (no leader yet, not the leader, store busy) is a [`ReportReply::NotLeader`].
//! - `MessageKind::Logs` request (replicas only, G10): body = an encoded [`LogsAsk`]. Answer: an
//!   encoded [`LogsAnswer`], bounded by [`log_lines_max`] lines and [`log_answer_bytes_max`]
//!   bytes; a handler `Err` names what is wrong (no such module) in one line.

use serde::{Deserialize, Serialize};

use super::declaration::Digest;
use super::envelope::Position;
use super::report::Report;

/// Codec label of an encoded [`EnvelopeReply`].
pub const envelope_reply_what: &str = "envelope reply";
/// Codec label of an encoded [`ReportReply`].
pub const report_reply_what: &str = "report reply";
/// Codec label of a report body.
pub const report_what: &str = "report";

/// A host's answer to an envelope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnvelopeReply {
    /// Verified, high-water mark raised on disk, declaration applied.
    Applied { position: Position, digest: Digest },
    /// Not applied. `refusal` says why (never a secret value); `older` is true when the envelope is
    /// not newer than what the host already accepted, i.e. a deposed or replayed sender (G2).
    Refused { refusal: String, older: bool },
}

/// A replica's answer to a report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReportReply {
    /// The leader filed it in the machine's account; `accepted` is false when the account already
    /// holds something at or after it (G5), so the host must not send it again either way.
    Filed { accepted: bool },
    /// This replica is not the leader; `leader` is the leader's address (`host:port`) if known.
    NotLeader { leader: Option<String> },
    /// The leader will not file it (an epoch above its floor without a valid proof, G9); sending
    /// it again changes nothing.
    Refused { reason: String },
}

/// A report whose body names another machine than its frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "report frame is for machine {frame} but its body is for machine {body}; the sender is broken or forging, drop the report"
)]
pub struct MachineMismatch {
    pub frame: String,
    pub body: String,
}

/// The frame's machine (checked against the sender's certificate by the writers table) must be the
/// report's own, or a host could file a report about another machine under its own name (G10).
pub fn check_report_machine(frame_machine: &str, report: &Report) -> Result<(), MachineMismatch> {
    if report.machine == frame_machine {
        return Ok(());
    }
    Err(MachineMismatch {
        frame: frame_machine.to_string(),
        body: report.machine.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(machine: &str) -> Report {
        Report {
            machine: machine.into(),
            epoch: 1,
            sequence: 2,
            report_sequence: 3,
            applied: Some(Digest([7; 32])),
            modules: vec![],
            refused_older: 0,
            last_refusal: None,
            proof: None,
        }
    }

    #[test]
    fn replies_round_trip_through_the_codec() {
        let applied = EnvelopeReply::Applied {
            position: Position {
                epoch: 4,
                sequence: 9,
            },
            digest: Digest([1; 32]),
        };
        let refused = EnvelopeReply::Refused {
            refusal: "older".into(),
            older: true,
        };
        for reply in [applied, refused] {
            let bytes = mesh_codec::encode(envelope_reply_what, &reply).expect("encode");
            let back: EnvelopeReply =
                mesh_codec::decode(envelope_reply_what, &bytes).expect("decode");
            assert_eq!(back, reply);
        }
        let redirect = ReportReply::NotLeader {
            leader: Some("10.0.0.2:7443".into()),
        };
        for reply in [ReportReply::Filed { accepted: false }, redirect] {
            let bytes = mesh_codec::encode(report_reply_what, &reply).expect("encode");
            let back: ReportReply = mesh_codec::decode(report_reply_what, &bytes).expect("decode");
            assert_eq!(back, reply);
        }
    }

    #[test]
    fn g10_a_report_body_for_another_machine_than_its_frame_is_refused() {
        // G10: the frame's machine is the one the writers table checked; the body must agree.
        assert!(check_report_machine("ace", &report("ace")).is_ok());
        let err = check_report_machine("ace", &report("g14")).expect_err("mismatch");
        assert_eq!(err.frame, "ace");
        assert!(err.to_string().contains("g14"), "{err}");
    }
}

/// Codec label of an encoded [`LogsAsk`].
pub const logs_ask_what: &str = "logs request";
/// Codec label of an encoded [`LogsAnswer`].
pub const logs_answer_what: &str = "logs answer";
/// Most lines one answer carries per module stream.
pub const log_lines_max: u32 = 10_000;
/// Most bytes of log text one answer carries, over all its chunks.
pub const log_answer_bytes_max: u64 = 1024 * 1024;
/// A longer line is cut here (at a character boundary) and marked with `…`.
pub const log_line_bytes_max: usize = 16 * 1024;
/// Most cursors one ask may carry (two streams of each module a machine may run).
pub const log_cursors_max: usize = 1024;

/// Which output of a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LogStream {
    Stdout,
    Stderr,
}

impl LogStream {
    /// `stdout` or `stderr`, as in the log file's name.
    pub fn word(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

/// Where a reader got to in one module stream: the byte offset after the last line it has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCursor {
    pub module: String,
    pub stream: LogStream,
    pub offset: u64,
}

/// What a replica asks a host for on behalf of `meshctl logs`: the last `lines` of each stream
/// of `module` (every module when `None`), or, for a stream that has a cursor in `from`, the
/// lines after it (`--follow`), at most `lines` of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsAsk {
    pub module: Option<String>,
    pub lines: u32,
    pub from: Vec<LogCursor>,
}

/// Complete lines of one module stream, from byte `start` to byte `end` of its log file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    pub module: String,
    pub stream: LogStream,
    pub start: u64,
    /// The cursor for the next ask.
    pub end: u64,
    pub lines: Vec<String>,
    /// More complete lines follow `end` already: ask again at once.
    pub more: bool,
    /// The file was rotated (or truncated) since the cursor: these lines start the new file, and
    /// what the old one got after the cursor is not shown.
    pub rotated: bool,
}

/// A host's answer: a chunk per module stream asked about, in module then stream order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsAnswer {
    pub machine: String,
    pub chunks: Vec<LogChunk>,
}
