//! Envelopes (G2): a declaration wrapped with its machine, epoch, sequence and signer, signed with
//! ed25519 over the exact bytes that travel. A host verifies those bytes before decoding the body.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::declaration::Declaration;

/// What a replica sends to a machine. The epoch is the Raft term of the leader that sent it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub machine: String,
    pub epoch: u64,
    pub sequence: u64,
    /// The replica id whose key signed this.
    pub signer: u64,
    /// Modules whose mounts this envelope may move (`push --move`); a host refuses any other move (G8).
    pub moves: Vec<String>,
    pub declaration: Declaration,
}

impl Envelope {
    /// `(epoch, sequence)`: the order hosts fence on.
    pub fn position(&self) -> Position {
        Position {
            epoch: self.epoch,
            sequence: self.sequence,
        }
    }
}

/// A point in a machine's send order. Compared by epoch, then sequence.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Position {
    pub epoch: u64,
    pub sequence: u64,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {} sequence {}", self.epoch, self.sequence)
    }
}

/// The bytes on the wire: the encoded envelope and the signature over exactly those bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub body: Vec<u8>,
    pub signature: Vec<u8>,
}

/// Why a host refused an envelope. Every refusal is counted and reported.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Refusal {
    #[error("envelope is malformed: {0}")]
    Malformed(String),
    #[error("envelope signed by replica {0}, which this host does not trust")]
    UnknownSigner(u64),
    #[error("envelope signature does not verify against replica {0}'s key")]
    BadSignature(u64),
    #[error("envelope is for machine {got}, this host is {expected}")]
    WrongMachine { expected: String, got: String },
    #[error("envelope at {got} is not newer than {accepted}, already accepted")]
    Older { got: Position, accepted: Position },
}

/// Why an envelope could not be sealed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error(transparent)]
    Codec(#[from] mesh_codec::CodecError),
}

/// Encodes `envelope` and signs exactly those bytes; returns the wire bytes.
pub fn seal(envelope: &Envelope, key: &SigningKey) -> Result<Vec<u8>, SealError> {
    let body = mesh_codec::encode("envelope", envelope)?;
    let signature = key.sign(&body).to_bytes().to_vec();
    Ok(mesh_codec::encode(
        "sealed envelope",
        &Sealed { body, signature },
    )?)
}

/// Checks wire bytes against the host's trust: a known signer whose signature verifies over the body,
/// the host's own machine name, and a position above `accepted`. Decodes the body only after the
/// signature verifies. Pure: the caller persists the new high-water mark before applying.
pub fn open(
    wire: &[u8],
    trusted: &BTreeMap<u64, VerifyingKey>,
    machine: &str,
    accepted: Option<Position>,
) -> Result<Envelope, Refusal> {
    let sealed: Sealed = mesh_codec::decode("sealed envelope", wire)
        .map_err(|e| Refusal::Malformed(e.to_string()))?;
    let signer = peek_signer(&sealed.body)?;
    let key = trusted.get(&signer).ok_or(Refusal::UnknownSigner(signer))?;
    let signature: [u8; 64] = sealed
        .signature
        .as_slice()
        .try_into()
        .map_err(|_| Refusal::BadSignature(signer))?;
    key.verify_strict(&sealed.body, &Signature::from_bytes(&signature))
        .map_err(|_| Refusal::BadSignature(signer))?;
    let envelope: Envelope = mesh_codec::decode("envelope", &sealed.body)
        .map_err(|e| Refusal::Malformed(e.to_string()))?;
    if envelope.signer != signer {
        return Err(Refusal::Malformed("signer changed between reads".into()));
    }
    if envelope.machine != machine {
        return Err(Refusal::WrongMachine {
            expected: machine.to_string(),
            got: envelope.machine,
        });
    }
    if let Some(accepted) = accepted
        && envelope.position() <= accepted
    {
        return Err(Refusal::Older {
            got: envelope.position(),
            accepted,
        });
    }
    Ok(envelope)
}

/// Reads only the signer id, which the encoding places after the machine name, epoch and sequence;
/// nothing else of the body is trusted before the signature verifies.
fn peek_signer(body: &[u8]) -> Result<u64, Refusal> {
    #[derive(Deserialize)]
    struct Head {
        _machine: String,
        _epoch: u64,
        _sequence: u64,
        signer: u64,
    }
    // The head is a prefix of the body, so decode it leniently (trailing bytes are the rest).
    let head: Head = mesh_codec::decode_prefix("envelope head", body)
        .map_err(|e| Refusal::Malformed(e.to_string()))?;
    Ok(head.signer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn envelope(machine: &str, epoch: u64, sequence: u64, signer: u64) -> Envelope {
        Envelope {
            machine: machine.into(),
            epoch,
            sequence,
            signer,
            moves: vec![],
            declaration: Declaration {
                machine: machine.into(),
                modules: vec![],
            },
        }
    }

    fn trust(id: u64, k: &SigningKey) -> BTreeMap<u64, VerifyingKey> {
        BTreeMap::from([(id, k.verifying_key())])
    }

    #[test]
    fn g2_host_accepts_a_newer_envelope_from_a_trusted_replica() {
        let k = key(1);
        let wire = seal(&envelope("ace", 3, 7, 1), &k).expect("seal");
        let got = open(
            &wire,
            &trust(1, &k),
            "ace",
            Some(Position {
                epoch: 3,
                sequence: 6,
            }),
        );
        assert_eq!(got.expect("accepted"), envelope("ace", 3, 7, 1));
    }

    #[test]
    fn g2_host_refuses_unknown_signer_wrong_machine_and_older() {
        let k = key(1);
        let wire = seal(&envelope("ace", 3, 7, 1), &k).expect("seal");
        assert_eq!(
            open(&wire, &trust(2, &k), "ace", None),
            Err(Refusal::UnknownSigner(1))
        );
        assert!(matches!(
            open(&wire, &trust(1, &k), "g14", None),
            Err(Refusal::WrongMachine { .. })
        ));
        let same = Position {
            epoch: 3,
            sequence: 7,
        };
        assert!(matches!(
            open(&wire, &trust(1, &k), "ace", Some(same)),
            Err(Refusal::Older { .. })
        ));
        let newer_epoch = Position {
            epoch: 4,
            sequence: 1,
        };
        assert!(matches!(
            open(&wire, &trust(1, &k), "ace", Some(newer_epoch)),
            Err(Refusal::Older { .. })
        ));
    }

    #[test]
    fn g2_host_refuses_a_key_it_does_not_trust_for_that_signer() {
        let wire = seal(&envelope("ace", 1, 1, 1), &key(9)).expect("seal");
        assert_eq!(
            open(&wire, &trust(1, &key(1)), "ace", None),
            Err(Refusal::BadSignature(1))
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        #[test]
        fn g2_flipping_any_byte_of_a_sealed_envelope_makes_it_refused(
            at in proptest::prelude::any::<proptest::sample::Index>(),
            mask in 1u8..=255,
        ) {
            // G2: the signature covers exactly the bytes sent; any altered byte is refused.
            let k = key(1);
            let wire = seal(&envelope("ace", 3, 7, 1), &k).expect("seal");
            let mut bent = wire.clone();
            let i = at.index(bent.len());
            bent[i] ^= mask;
            proptest::prop_assert!(open(&bent, &trust(1, &k), "ace", None).is_err(), "byte {} accepted", i);
        }
    }
}
