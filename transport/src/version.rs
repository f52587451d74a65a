//! Versions on the wire (decision 0240). Two layers, each with its own number:
//!
//! - The **framing** (length prefixes, the request header, the answer, the stream ask) is named by
//!   the ALPN protocol of the connection. `mesh/2` headers carry a version per message kind;
//!   `mesh/1` (every release before decision 0240) carried none, and every body it sends or
//!   takes is version 1 of its kind. An endpoint offers both, preferring `mesh/2`, so it still
//!   speaks to a `mesh/1` peer in that peer's framing; a peer with neither fails the handshake.
//! - The **body** of each message kind has a `u16` version in the `mesh/2` header. [`speaks`] is
//!   the one table of the versions this build reads and writes per kind; a receiver refuses a
//!   version outside it before any handler runs, with one line naming both versions and which
//!   side to upgrade ([`VersionError`]), and the sender gets that line as the refusal.
//!
//! A body's format is pinned by the contract fixtures `tests/fixtures/wire/<kind>-v<N>-*.bin`
//! (`tests/wire_contract.rs`): changing a body type fails them until the kind gets a new version
//! here and fixtures of its own, while the old version's fixtures stay and keep being decoded.

use serde::Serialize;

use crate::principal::Principal;
use crate::writers::MessageKind;

/// The framing of a connection, from its ALPN protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `mesh/1`: a header of kind and body, no version; every body is version 1 of its kind.
    V1,
    /// `mesh/2`: a header of version, kind and body.
    V2,
}

/// The ALPN protocol of the `mesh/1` framing.
pub const alpn_v1: &[u8] = b"mesh/1";
/// The ALPN protocol of the `mesh/2` framing.
pub const alpn_v2: &[u8] = b"mesh/2";

/// Every framing this build speaks, the preferred first (a server picks the first of its own
/// list that the client offers).
pub const alpn_offered: [&[u8]; 2] = [alpn_v2, alpn_v1];

impl Framing {
    /// The framing of a negotiated ALPN protocol; `None` for one this build does not speak
    /// (the handshake refuses those, so a live connection never has one).
    pub fn from_alpn(protocol: &[u8]) -> Option<Framing> {
        match protocol {
            p if p == alpn_v1 => Some(Framing::V1),
            p if p == alpn_v2 => Some(Framing::V2),
            _ => None,
        }
    }

    /// The ALPN protocol naming this framing.
    pub fn alpn(self) -> &'static str {
        match self {
            Framing::V1 => "mesh/1",
            Framing::V2 => "mesh/2",
        }
    }

    /// The newest version of any body this framing can carry: `mesh/1` has no version field,
    /// so only version 1.
    fn carries_at_most(self) -> u16 {
        match self {
            Framing::V1 => 1,
            Framing::V2 => u16::MAX,
        }
    }
}

/// The framing negotiated on `conn`. A connection without ALPN data cannot come from this
/// build's TLS configs (both sides require a protocol); it is read as `mesh/2` and any frame
/// that is not will fail to decode as a bad frame.
pub fn framing_of(conn: &quinn::Connection) -> Framing {
    conn.handshake_data()
        .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|data| data.protocol)
        .and_then(|protocol| Framing::from_alpn(&protocol))
        .unwrap_or(Framing::V2)
}

/// Whether a handshake failed for want of a common ALPN protocol (TLS alert 120,
/// `no_application_protocol`, which QUIC carries as CRYPTO_ERROR 0x178).
pub(crate) fn no_common_framing(raw: &str) -> bool {
    [
        "NoApplicationProtocol",
        "no_application_protocol",
        "0x178",
        "error 120",
    ]
    .iter()
    .any(|needle| raw.contains(needle))
}

/// The one line for a handshake with no common framing.
pub(crate) fn no_common_framing_reason(raw: &str) -> String {
    let ours: Vec<&str> = [Framing::V2, Framing::V1]
        .iter()
        .map(|f| f.alpn())
        .collect();
    format!(
        "{raw}: the peer speaks none of the framings this build speaks ({}); it is from a release too far apart from this one: upgrade the older side",
        ours.join(", ")
    )
}

/// The versions of one message kind's body this build reads, and the one it writes (`newest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Speaks {
    pub oldest: u16,
    pub newest: u16,
}

/// The one table of body versions per kind. The match names every kind with no wildcard, so a
/// new kind does not compile until its row is decided. A format change of a kind's body raises
/// its `newest` (and adds fixtures); dropping the old format raises `oldest`.
pub fn speaks(kind: &MessageKind) -> Speaks {
    let v1 = Speaks {
        oldest: 1,
        newest: 1,
    };
    match kind {
        MessageKind::Raft => v1,
        MessageKind::Envelope => v1,
        MessageKind::Report { .. } => v1,
        MessageKind::Command => v1,
        MessageKind::Forward => v1,
        MessageKind::Logs => v1,
    }
}

/// The version this build writes for `kind`.
pub fn current(kind: &MessageKind) -> u16 {
    speaks(kind).newest
}

/// A kind's name without its fields, as in fixture file names and version errors.
pub fn word(kind: &MessageKind) -> &'static str {
    match kind {
        MessageKind::Raft => "raft",
        MessageKind::Envelope => "envelope",
        MessageKind::Report { .. } => "report",
        MessageKind::Command => "command",
        MessageKind::Forward => "forward",
        MessageKind::Logs => "logs",
    }
}

/// One of each kind, for tables and tests (a report's machine is a placeholder).
pub fn every_kind() -> [MessageKind; 6] {
    [
        MessageKind::Raft,
        MessageKind::Envelope,
        MessageKind::Report {
            machine: String::new(),
        },
        MessageKind::Command,
        MessageKind::Forward,
        MessageKind::Logs,
    ]
}

/// A message at a version the other side does not speak.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The sender is newer than the receiver.
    #[error(
        "peer {sender} speaks {kind} v{theirs}, this {receiver} speaks up to {kind} v{newest}: upgrade {receiver} to a release that speaks {kind} v{theirs}"
    )]
    Newer {
        kind: &'static str,
        theirs: u16,
        newest: u16,
        sender: Principal,
        receiver: Principal,
    },
    /// The sender is older than the oldest version the receiver still reads.
    #[error(
        "peer {sender} speaks {kind} v{theirs}, this {receiver} speaks {kind} v{oldest} to v{newest} only: upgrade {sender} to a release that speaks {kind} v{oldest} or later"
    )]
    Older {
        kind: &'static str,
        theirs: u16,
        oldest: u16,
        newest: u16,
        sender: Principal,
        receiver: Principal,
    },
    /// The sender's body is newer than the framing the connection negotiated can carry.
    #[error(
        "not sent to {receiver}: it speaks the {framing} framing, which carries {kind} up to v{carries}, and this message is {kind} v{version}: upgrade {receiver}"
    )]
    FramingTooOld {
        kind: &'static str,
        version: u16,
        framing: &'static str,
        carries: u16,
        receiver: String,
    },
}

/// Whether `receiver` reads `kind` at `version` from `sender`.
pub fn check(
    kind: &MessageKind,
    version: u16,
    sender: &Principal,
    receiver: &Principal,
) -> Result<(), VersionError> {
    let Speaks { oldest, newest } = speaks(kind);
    if version > newest {
        return Err(VersionError::Newer {
            kind: word(kind),
            theirs: version,
            newest,
            sender: sender.clone(),
            receiver: receiver.clone(),
        });
    }
    if version < oldest {
        return Err(VersionError::Older {
            kind: word(kind),
            theirs: version,
            oldest,
            newest,
            sender: sender.clone(),
            receiver: receiver.clone(),
        });
    }
    Ok(())
}

/// Whether a body of `kind` at `version` may go on a connection of `framing` to `receiver`.
pub fn check_framing(
    kind: &MessageKind,
    version: u16,
    framing: Framing,
    receiver: &str,
) -> Result<(), VersionError> {
    let carries = framing.carries_at_most();
    if version <= carries {
        return Ok(());
    }
    Err(VersionError::FramingTooOld {
        kind: word(kind),
        version,
        framing: framing.alpn(),
        carries,
        receiver: receiver.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_speaks_exactly_v1_in_this_release() {
        // Decision 0240: the table of supported versions per kind. Raising a kind's `newest`
        // needs its fixtures (tests/wire_contract.rs); this pins what this release speaks.
        for kind in every_kind() {
            assert_eq!(
                speaks(&kind),
                Speaks {
                    oldest: 1,
                    newest: 1
                },
                "{}",
                word(&kind)
            );
            assert_eq!(current(&kind), 1);
        }
        let words: Vec<_> = every_kind().iter().map(word).collect();
        assert_eq!(
            words,
            ["raft", "envelope", "report", "command", "forward", "logs"]
        );
    }

    #[test]
    fn a_newer_or_older_version_is_refused_naming_both_versions_and_who_to_upgrade() {
        let sender = Principal::Replica(2);
        let receiver = Principal::Replica(1);
        let newer = check(&MessageKind::Raft, 2, &sender, &receiver).expect_err("v2 is newer");
        assert_eq!(
            newer.to_string(),
            "peer replica:2 speaks raft v2, this replica:1 speaks up to raft v1: upgrade replica:1 to a release that speaks raft v2"
        );
        let older = check(&MessageKind::Raft, 0, &sender, &receiver).expect_err("v0 is older");
        assert_eq!(
            older.to_string(),
            "peer replica:2 speaks raft v0, this replica:1 speaks raft v1 to v1 only: upgrade replica:2 to a release that speaks raft v1 or later"
        );
        assert!(check(&MessageKind::Raft, 1, &sender, &receiver).is_ok());
    }

    #[test]
    fn the_v1_framing_carries_only_version_1_bodies() {
        let kind = MessageKind::Envelope;
        assert!(check_framing(&kind, 1, Framing::V1, "host:ace").is_ok());
        assert!(check_framing(&kind, 7, Framing::V2, "host:ace").is_ok());
        let refused = check_framing(&kind, 2, Framing::V1, "host:ace").expect_err("too old");
        assert_eq!(
            refused.to_string(),
            "not sent to host:ace: it speaks the mesh/1 framing, which carries envelope up to v1, and this message is envelope v2: upgrade host:ace"
        );
        assert_eq!(Framing::from_alpn(b"mesh/1"), Some(Framing::V1));
        assert_eq!(Framing::from_alpn(b"mesh/2"), Some(Framing::V2));
        assert_eq!(Framing::from_alpn(b"mesh/3"), None);
    }
}
