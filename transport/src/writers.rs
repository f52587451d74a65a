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
