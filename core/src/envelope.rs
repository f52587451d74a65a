//! Envelopes (G2): a declaration wrapped with its machine, epoch, sequence and signer, signed with
//! ed25519 over the exact bytes that travel. A host verifies those bytes before decoding the body.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::compose::digest;
use super::declaration::{Declaration, Digest};

/// The highest epoch, and the highest sequence within one, a host applies or a controller files
/// (2^48; the same number as the replicas' `term_max`). Anything above it is refused before it can
/// move a mark or a floor: nothing signed by a real leader gets there (an election a second for
/// eight million years), and `+ 1` on a value at or below it never overflows.
pub const epoch_max: u64 = 1 << 48;

impl Position {
    /// Whether the epoch or the sequence is above [`epoch_max`]: corrupt or forged.
    pub fn beyond_bound(&self) -> bool {
        self.epoch > epoch_max || self.sequence > epoch_max
    }
}

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

/// The bytes on the wire: the encoded envelope, the signature over exactly those bytes, and a
/// second signature over the envelope's header, which the host keeps as its proof of the epoch it
/// accepted (G9).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub body: Vec<u8>,
    pub signature: Vec<u8>,
    pub header_signature: Vec<u8>,
}

/// What a host can prove it accepted without carrying the whole envelope: machine, position,
/// signer and the declaration's digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeHeader {
    pub machine: String,
    pub epoch: u64,
    pub sequence: u64,
    pub signer: u64,
    pub digest: Digest,
}

/// A header with the signing replica's signature over [`header_bytes`]: sent in reports so a
/// controller can check an epoch a host claims (G9).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochProof {
    pub header: EnvelopeHeader,
    pub signature: Vec<u8>,
}

/// Why a claimed epoch is not proven.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("no proof: the report carries no signed envelope header")]
    Missing,
    #[error("the proof is signed by replica {0}, which is not trusted")]
    UnknownSigner(u64),
    #[error("the proof's signature does not verify against replica {0}'s key")]
    BadSignature(u64),
    #[error("the proof is for {got}, not for what the report claims ({claimed})")]
    Mismatch { claimed: String, got: String },
    #[error(
        "the proof is for {got}, beyond the highest epoch or sequence anything signs ({epoch_max})"
    )]
    Beyond { got: Position },
}

/// The bytes a header signature covers: a label, so no other signed message can pass for one.
pub fn header_bytes(header: &EnvelopeHeader) -> Result<Vec<u8>, mesh_codec::CodecError> {
    mesh_codec::encode("envelope header", &("mesh/envelope-header/v1", header))
}

impl Envelope {
    /// The header a host keeps as its proof.
    pub fn header(&self) -> EnvelopeHeader {
        EnvelopeHeader {
            machine: self.machine.clone(),
            epoch: self.epoch,
            sequence: self.sequence,
            signer: self.signer,
            digest: digest(&self.declaration),
        }
    }
}

impl EpochProof {
    /// Checks that a trusted replica signed this header, and that it is for `machine` at
    /// `position` (what a report claims).
    pub fn verify(
        &self,
        trusted: &BTreeMap<u64, VerifyingKey>,
        machine: &str,
        position: Position,
    ) -> Result<(), ProofError> {
        let h = &self.header;
        let signed = Position {
            epoch: h.epoch,
            sequence: h.sequence,
        };
        if signed.beyond_bound() {
            return Err(ProofError::Beyond { got: signed });
        }
        if h.machine != machine || h.epoch != position.epoch || h.sequence != position.sequence {
            return Err(ProofError::Mismatch {
                claimed: format!("{machine} at {position}"),
                got: format!("{} at epoch {} sequence {}", h.machine, h.epoch, h.sequence),
            });
        }
        let key = trusted
            .get(&h.signer)
            .ok_or(ProofError::UnknownSigner(h.signer))?;
        let signature: [u8; 64] = self
            .signature
            .as_slice()
            .try_into()
            .map_err(|_| ProofError::BadSignature(h.signer))?;
        let bytes = header_bytes(h).map_err(|_| ProofError::BadSignature(h.signer))?;
        key.verify_strict(&bytes, &Signature::from_bytes(&signature))
            .map_err(|_| ProofError::BadSignature(h.signer))
    }
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
    #[error(
        "envelope at {got} is beyond the highest epoch or sequence a host applies ({epoch_max}); it is corrupt or forged"
    )]
    Beyond { got: Position },
    #[error(
        "envelope signed by replica {signer} came with replica {sender}'s certificate; a replica sends only what it signed itself"
    )]
    NotSender { signer: u64, sender: u64 },
}

/// Binds an opened envelope to the certificate it came with (issue 27): only the leader that
/// signed an envelope sends it, so an envelope signed by replica `signer` arriving with replica
/// `sender`'s certificate is a replay or a forgery by another replica's certificate.
pub fn check_sender(envelope: &Envelope, sender: u64) -> Result<(), Refusal> {
    if envelope.signer == sender {
        return Ok(());
    }
    Err(Refusal::NotSender {
        signer: envelope.signer,
        sender,
    })
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
    let header = header_bytes(&envelope.header())?;
    let header_signature = key.sign(&header).to_bytes().to_vec();
    let sealed = Sealed {
        body,
        signature,
        header_signature,
    };
    Ok(mesh_codec::encode("sealed envelope", &sealed)?)
}

/// How many bytes [`seal`] gives `envelope`, counted without signing or holding them: the
/// encoded envelope, its two ed25519 signatures (64 bytes each) and their length prefixes.
pub fn sealed_bytes_len(envelope: &Envelope) -> Result<usize, mesh_codec::CodecError> {
    let body = mesh_codec::encoded_len("envelope", envelope)?;
    let shell = Sealed {
        body: Vec::new(),
        signature: vec![0; Signature::BYTE_SIZE],
        header_signature: vec![0; Signature::BYTE_SIZE],
    };
    let empty = mesh_codec::encoded_len("sealed envelope", &shell)?;
    Ok(empty - length_prefix_bytes(0) + length_prefix_bytes(body) + body)
}

/// The codec's length prefix for `len` (bincode's variable-width integer).
fn length_prefix_bytes(len: usize) -> usize {
    match len {
        0..=250 => 1,
        251..=0xFFFF => 3,
        0x1_0000..=0xFFFF_FFFF => 5,
        _ => 9,
    }
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
    open_with_proof(wire, trusted, machine, accepted).map(|(envelope, _)| envelope)
}

/// [`open`], also checking the header signature and handing back the proof the host keeps.
pub fn open_with_proof(
    wire: &[u8],
    trusted: &BTreeMap<u64, VerifyingKey>,
    machine: &str,
    accepted: Option<Position>,
) -> Result<(Envelope, EpochProof), Refusal> {
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
    if envelope.position().beyond_bound() {
        return Err(Refusal::Beyond {
            got: envelope.position(),
        });
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
    let proof = EpochProof {
        header: envelope.header(),
        signature: sealed.header_signature,
    };
    proof
        .verify(trusted, machine, envelope.position())
        .map_err(|e| Refusal::Malformed(format!("header signature: {e}")))?;
    Ok((envelope, proof))
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
                revoked: Default::default(),
                signers: Default::default(),
            },
        }
    }

    fn trust(id: u64, k: &SigningKey) -> BTreeMap<u64, VerifyingKey> {
        BTreeMap::from([(id, k.verifying_key())])
    }

    #[test]
    fn sealed_bytes_len_is_the_length_seal_gives_across_prefix_widths() {
        // Issue 23: the push checks an envelope's size against the frame limit before it
        // records the send, by counting; the count must be what is sealed.
        let k = key(1);
        for content in [0usize, 100, 250, 251, 300, 65_000, 65_536, 70_000] {
            let mut e = envelope("ace", 3, 9, 1);
            e.moves = vec!["m".repeat(content % 97)];
            e.declaration
                .revoked
                .insert("k".into(), "x".repeat(content));
            let sealed = seal(&e, &k).expect("seals");
            assert_eq!(
                sealed_bytes_len(&e).expect("counts"),
                sealed.len(),
                "{content}"
            );
        }
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

    fn position(epoch: u64, sequence: u64) -> Position {
        Position { epoch, sequence }
    }

    #[test]
    fn g9_an_accepted_envelope_gives_a_proof_of_its_epoch_that_verifies_and_only_for_it() {
        // G9: the host proves the epoch it accepted with the signed header it kept.
        let k = key(1);
        let wire = seal(&envelope("ace", 9, 4, 1), &k).expect("seal");
        let (_, proof) = open_with_proof(&wire, &trust(1, &k), "ace", None).expect("open");
        assert_eq!(proof.verify(&trust(1, &k), "ace", position(9, 4)), Ok(()));
        assert!(matches!(
            proof.verify(&trust(1, &k), "ace", position(u64::MAX, 4)),
            Err(ProofError::Mismatch { .. })
        ));
        assert!(matches!(
            proof.verify(&trust(1, &k), "g14", position(9, 4)),
            Err(ProofError::Mismatch { .. })
        ));
        assert_eq!(
            proof.verify(&trust(2, &k), "ace", position(9, 4)),
            Err(ProofError::UnknownSigner(1))
        );
    }

    #[test]
    fn g9_a_forged_or_altered_proof_does_not_verify() {
        // G9: an unproven claim is refused: a header raised by hand, or signed by another key.
        let k = key(1);
        let wire = seal(&envelope("ace", 9, 4, 1), &k).expect("seal");
        let (_, proof) = open_with_proof(&wire, &trust(1, &k), "ace", None).expect("open");
        let mut raised = proof.clone();
        raised.header.epoch = 1_000;
        assert_eq!(
            raised.verify(&trust(1, &k), "ace", position(1_000, 4)),
            Err(ProofError::BadSignature(1))
        );
        let forged_wire = seal(&envelope("ace", 1_000, 4, 1), &key(7)).expect("seal");
        let forged: Sealed = mesh_codec::decode("sealed", &forged_wire).expect("decode");
        let forged = EpochProof {
            header: envelope("ace", 1_000, 4, 1).header(),
            signature: forged.header_signature,
        };
        assert_eq!(
            forged.verify(&trust(1, &k), "ace", position(1_000, 4)),
            Err(ProofError::BadSignature(1))
        );
    }

    #[test]
    fn g2_g9_an_epoch_or_sequence_beyond_the_bound_is_refused_even_signed_by_a_trusted_key() {
        // Issue 27 part 3: a trusted key that signs epoch 2^64-1 must not pin a host's mark there
        // for good, nor raise the cluster's floor with its proof.
        let k = key(1);
        let at_bound = seal(&envelope("ace", epoch_max, epoch_max, 1), &k).expect("seal");
        let (_, proof) = open_with_proof(&at_bound, &trust(1, &k), "ace", None).expect("at bound");
        assert_eq!(
            proof.verify(&trust(1, &k), "ace", position(epoch_max, epoch_max)),
            Ok(())
        );
        for (epoch, sequence) in [(epoch_max + 1, 1), (u64::MAX, 1), (1, epoch_max + 1)] {
            let wire = seal(&envelope("ace", epoch, sequence, 1), &k).expect("seal");
            assert_eq!(
                open(&wire, &trust(1, &k), "ace", None),
                Err(Refusal::Beyond {
                    got: position(epoch, sequence)
                })
            );
            let forged_wire = seal(&envelope("ace", epoch, sequence, 1), &k).expect("seal");
            let sealed: Sealed = mesh_codec::decode("sealed", &forged_wire).expect("decode");
            let proof = EpochProof {
                header: envelope("ace", epoch, sequence, 1).header(),
                signature: sealed.header_signature,
            };
            assert_eq!(
                proof.verify(&trust(1, &k), "ace", position(epoch, sequence)),
                Err(ProofError::Beyond {
                    got: position(epoch, sequence)
                })
            );
        }
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
