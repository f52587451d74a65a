//! The writers table (G10): which principal may send which kind of message. Every incoming
//! frame is checked here, in one place, before any handler sees it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::principal::Principal;

/// What a frame claims to be. The transport reads only this; bodies stay opaque bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MessageKind {
    /// Raft RPCs between replicas.
    Raft,
    /// A signed declaration from the leader replica to a machine.
    Envelope,
    /// A machine's report about itself.
    Report { machine: String },
    /// An operator command (meshctl).
    Command,
    /// An operator command relayed by a follower replica to the leader.
    Forward,
    /// A replica asking a host for its modules' output (`meshctl logs`, relayed: operators never
    /// dial hosts).
    Logs,
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageKind::Raft => write!(f, "raft"),
            MessageKind::Envelope => write!(f, "envelope"),
            MessageKind::Report { machine } => write!(f, "report for machine {machine}"),
            MessageKind::Command => write!(f, "command"),
            MessageKind::Forward => write!(f, "forward"),
            MessageKind::Logs => write!(f, "logs"),
        }
    }
}

/// A message refused by the writers table.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{principal} may not send {kind}: {why}")]
pub struct Denied {
    pub principal: Principal,
    pub kind: MessageKind,
    pub why: &'static str,
}

/// Largest frame a host may send, in bytes (1024 KiB). A host may send only its own reports, and
/// the largest legal report (`report_modules_max` modules with every text at its bound, in the
/// mesh crate's `core::report`) encodes to about 670 KiB; `tests/controller_reports.rs` checks
/// that it fits. Replicas and operators keep the configured `frame_bytes_max` (decision 0299).
pub const report_frame_bytes_max: usize = 1024 * 1024;

/// What one principal may send; obtained only from [`permissions_for`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permissions {
    principal: Principal,
}

/// The one place that decides who may say what.
pub fn permissions_for(principal: &Principal) -> Permissions {
    Permissions {
        principal: principal.clone(),
    }
}

impl Permissions {
    /// The principal these permissions belong to.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// The most bytes one frame from this principal may hold, known from its certificate before
    /// any byte of the frame is read: a host sends only reports, so [`report_frame_bytes_max`]
    /// (or `configured` if lower); replicas and operators `configured` (`frame_bytes_max`).
    pub fn frame_bytes_max(&self, configured: usize) -> usize {
        match &self.principal {
            Principal::Host(_) => report_frame_bytes_max.min(configured),
            Principal::Replica(_) | Principal::Operator(_) => configured,
        }
    }

    /// The refusal of a frame of `len` bytes over `max`, this principal's limit, naming it.
    pub fn frame_too_large(&self, len: u64, max: usize) -> String {
        let principal = &self.principal;
        match principal {
            Principal::Host(_) => format!(
                "frame of {len} bytes from {principal} is over report_frame_bytes_max ({} KiB): a host sends only its reports, and no legal report is that large; the host is broken or forging, fix or upgrade it",
                max / 1024
            ),
            Principal::Replica(_) | Principal::Operator(_) => format!(
                "frame of {len} bytes from {principal} is over the limit of {max} bytes (frame_bytes_max); send less or raise the limit on both ends"
            ),
        }
    }

    /// Allows or denies one message. The match lists every (principal, kind) pair with no
    /// wildcard, so a new kind or principal does not compile until someone decides its row.
    pub fn check(&self, kind: &MessageKind) -> Result<(), Denied> {
        use MessageKind as K;
        use Principal as P;
        let refusal: Option<&'static str> = match (&self.principal, kind) {
            (P::Replica(_), K::Raft | K::Envelope | K::Forward | K::Logs) => None,
            (P::Replica(_), K::Report { .. }) => Some("only a host writes its own reports"),
            (P::Replica(_), K::Command) => {
                Some("replicas relay operator commands as forward, never issue them")
            }
            (P::Host(name), K::Report { machine }) if name == machine => None,
            (P::Host(_), K::Report { .. }) => Some("a host writes only its own machine's reports"),
            (P::Host(_), K::Raft | K::Envelope | K::Forward | K::Command | K::Logs) => {
                Some("a host may only send its own reports")
            }
            (P::Operator(_), K::Command) => None,
            (P::Operator(_), K::Logs) => {
                Some("an operator asks a replica for logs (`meshctl logs`), which asks the host")
            }
            (P::Operator(_), K::Raft | K::Envelope | K::Forward | K::Report { .. }) => {
                Some("an operator may only send commands")
            }
        };
        match refusal {
            None => Ok(()),
            Some(why) => Err(Denied {
                principal: self.principal.clone(),
                kind: kind.clone(),
                why,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds() -> Vec<MessageKind> {
        vec![
            MessageKind::Raft,
            MessageKind::Envelope,
            MessageKind::Report {
                machine: "ace".into(),
            },
            MessageKind::Report {
                machine: "g14".into(),
            },
            MessageKind::Command,
            MessageKind::Forward,
            MessageKind::Logs,
        ]
    }

    #[test]
    fn a_hosts_frames_are_bounded_by_the_report_limit_and_others_keep_theirs() {
        // Issue 23 part 2: the limit comes from the principal, before the frame is read.
        let configured = 16 * 1024 * 1024;
        let host = permissions_for(&Principal::Host("ace".into()));
        assert_eq!(host.frame_bytes_max(configured), report_frame_bytes_max);
        assert_eq!(
            host.frame_bytes_max(2048),
            2048,
            "a lower configured limit holds"
        );
        for other in [Principal::Replica(1), Principal::Operator("alice".into())] {
            assert_eq!(
                permissions_for(&other).frame_bytes_max(configured),
                configured
            );
        }
        let refusal = host.frame_too_large(2 << 20, report_frame_bytes_max);
        assert!(refusal.contains("host:ace"), "{refusal}");
        assert!(
            refusal.contains("report_frame_bytes_max (1024 KiB)"),
            "{refusal}"
        );
    }

    #[test]
    fn writers_table_allows_exactly_each_principals_own_kinds() {
        // G10: one writer per subject, checked for every message kind against every principal kind.
        let expected_table = [
            // raft, envelope, report(ace), report(g14), command, forward, logs
            (
                Principal::Replica(1),
                [true, true, false, false, false, true, true],
            ),
            (
                Principal::Host("ace".into()),
                [false, false, true, false, false, false, false],
            ),
            (
                Principal::Operator("alice".into()),
                [false, false, false, false, true, false, false],
            ),
        ];
        for (principal, row) in &expected_table {
            let perms = permissions_for(principal);
            for (kind, want) in kinds().iter().zip(row) {
                let got = perms.check(kind);
                assert_eq!(got.is_ok(), *want, "{principal} sending {kind}: {got:?}");
                if let Err(denied) = got {
                    let text = denied.to_string();
                    assert!(text.contains(&principal.to_string()), "{text}");
                    assert!(text.contains(&kind.to_string()), "{text}");
                }
            }
        }
    }
}
