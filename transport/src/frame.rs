//! Framing on QUIC streams: a 4-byte big-endian length, then that many bytes. The length is
//! checked against the limit before any buffer is sized from it, and every read and write has a
//! deadline. Frame bodies go through `mesh_codec`.
//!
//! A request's [`Header`] has two layouts, one per framing (decision 0240, `version.rs`): in
//! `mesh/2` the body's version, the kind and the body; in `mesh/1` the kind and the body, every
//! body being version 1. The `mesh/2` bytes are the version followed by exactly the `mesh/1`
//! bytes, so a header encoded once goes to a `mesh/1` peer with its version prefix cut off.

use std::time::Duration;

use quinn::{ReadError, ReadExactError, RecvStream, SendStream, WriteError};
use serde::{Deserialize, Serialize};

use crate::version::{self, Framing};
use crate::writers::MessageKind;

/// Bytes in the length prefix.
pub const length_prefix_bytes: usize = 4;

/// Most bytes reserved up front for a frame body, whatever its prefix says; the rest grows as
/// bytes actually arrive, so a peer announcing large frames costs nothing until it sends them.
pub const frame_reserve_bytes_max: usize = 64 * 1024;

/// A request or one-way message: the version of its body's format, what it claims to be, and
/// its opaque body. Field order is the `mesh/2` wire order: the version comes first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub version: u16,
    pub kind: MessageKind,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

impl Header {
    /// A message of `kind` in the body version this build writes for it.
    pub fn new(kind: MessageKind, body: Vec<u8>) -> Header {
        Header {
            version: version::current(&kind),
            kind,
            body,
        }
    }
}

/// The `mesh/1` header: no version; its body is version 1 of its kind.
#[derive(Deserialize)]
struct HeaderV1 {
    kind: MessageKind,
    #[serde(with = "serde_bytes")]
    body: Vec<u8>,
}

/// The answer to a request that was not served: refused by the writers table, by the handler,
/// or because the request frame was bad.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub reason: String,
}

/// What travels back on a request's stream.
pub type Response = Result<Vec<u8>, Refused>;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(
        "frame of {len} bytes is over the limit of {max} bytes (frame_bytes_max); send less or raise the limit on both ends"
    )]
    TooLarge { len: u64, max: usize },
    #[error("stream finished after {got} of {expected} frame bytes; the sender stopped mid-frame")]
    CutShort { expected: usize, got: usize },
    #[error("no complete frame within {after_ms} ms")]
    Timeout { after_ms: u128 },
    #[error("stream {action} failed: {reason}")]
    Stream {
        action: &'static str,
        reason: String,
    },
    /// The other side reset the stream before the whole frame arrived (QUIC RESET_STREAM): a
    /// sender withdrawing its request, or a receiver saying it read none of it
    /// ([`crate::serve::reset_unread`]).
    #[error("the peer reset the stream with code {code} before the whole frame arrived")]
    Reset { code: u64 },
    #[error("connection lost while {action}: {source}")]
    ConnectionLost {
        action: &'static str,
        source: quinn::ConnectionError,
    },
    #[error(transparent)]
    Codec(#[from] mesh_codec::CodecError),
}

fn read_err(e: ReadError) -> FrameError {
    match e {
        ReadError::ConnectionLost(source) => FrameError::ConnectionLost {
            action: "reading",
            source,
        },
        ReadError::Reset(code) => FrameError::Reset {
            code: code.into_inner(),
        },
        other => FrameError::Stream {
            action: "read",
            reason: other.to_string(),
        },
    }
}

fn write_err(e: WriteError) -> FrameError {
    match e {
        WriteError::ConnectionLost(source) => FrameError::ConnectionLost {
            action: "writing",
            source,
        },
        other => FrameError::Stream {
            action: "write",
            reason: other.to_string(),
        },
    }
}

/// Reads one frame; the stream may carry nothing after it that we care about.
pub async fn read_frame(
    recv: &mut RecvStream,
    frame_bytes_max: usize,
    timeout: Duration,
) -> Result<Vec<u8>, FrameError> {
    match tokio::time::timeout(timeout, read_frame_untimed(recv, frame_bytes_max)).await {
        Ok(result) => result,
        Err(_) => Err(FrameError::Timeout {
            after_ms: timeout.as_millis(),
        }),
    }
}

async fn read_frame_untimed(
    recv: &mut RecvStream,
    frame_bytes_max: usize,
) -> Result<Vec<u8>, FrameError> {
    let mut prefix = [0u8; length_prefix_bytes];
    recv.read_exact(&mut prefix).await.map_err(|e| match e {
        ReadExactError::FinishedEarly(got) => FrameError::CutShort {
            expected: length_prefix_bytes,
            got,
        },
        ReadExactError::ReadError(e) => read_err(e),
    })?;
    let len = u32::from_be_bytes(prefix);
    if u64::from(len) > frame_bytes_max as u64 {
        return Err(FrameError::TooLarge {
            len: len.into(),
            max: frame_bytes_max,
        });
    }
    let len = len as usize;
    let mut body = Vec::with_capacity(len.min(frame_reserve_bytes_max));
    while body.len() < len {
        match recv.read_chunk(len - body.len(), true).await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(FrameError::CutShort {
                    expected: len,
                    got: body.len(),
                });
            }
            Err(e) => return Err(read_err(e)),
        }
    }
    Ok(body)
}

/// Writes one frame and finishes the stream.
pub async fn write_frame(
    send: &mut SendStream,
    bytes: &[u8],
    frame_bytes_max: usize,
    timeout: Duration,
) -> Result<(), FrameError> {
    let len = check_len(bytes.len(), frame_bytes_max)?;
    let write = async {
        send.write_all(&len.to_be_bytes())
            .await
            .map_err(write_err)?;
        send.write_all(bytes).await.map_err(write_err)?;
        send.finish().map_err(|e| FrameError::Stream {
            action: "finish",
            reason: e.to_string(),
        })
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(result) => result,
        Err(_) => Err(FrameError::Timeout {
            after_ms: timeout.as_millis(),
        }),
    }
}

/// The length as it goes on the wire, if it is within the limit.
pub fn check_len(len: usize, frame_bytes_max: usize) -> Result<u32, FrameError> {
    match u32::try_from(len) {
        Ok(small) if len <= frame_bytes_max => Ok(small),
        _ => Err(FrameError::TooLarge {
            len: len as u64,
            max: frame_bytes_max,
        }),
    }
}

/// The header in the `mesh/2` layout; [`for_framing`] gives the bytes for a `mesh/1` peer.
pub fn encode_header(header: &Header) -> Result<Vec<u8>, FrameError> {
    Ok(mesh_codec::encode("frame header", header)?)
}

/// A header in the `mesh/2` layout.
pub fn decode_header(bytes: &[u8]) -> Result<Header, FrameError> {
    decode_header_framed(bytes, Framing::V2)
}

/// A header in the layout of `framing`; a `mesh/1` header's body is version 1.
pub fn decode_header_framed(bytes: &[u8], framing: Framing) -> Result<Header, FrameError> {
    match framing {
        Framing::V2 => Ok(mesh_codec::decode("frame header", bytes)?),
        Framing::V1 => {
            let HeaderV1 { kind, body } = mesh_codec::decode("frame header (mesh/1)", bytes)?;
            Ok(Header {
                version: 1,
                kind,
                body,
            })
        }
    }
}

/// The bytes of a `mesh/2` header (from [`encode_header`]) as `framing` carries them: for
/// `mesh/1` without the version prefix, refused when the body's version is one `mesh/1` cannot
/// carry. `receiver` names the peer in that refusal.
pub fn for_framing<'a>(
    encoded: &'a [u8],
    kind: &MessageKind,
    version: u16,
    framing: Framing,
    receiver: &str,
) -> Result<&'a [u8], version::VersionError> {
    version::check_framing(kind, version, framing, receiver)?;
    match framing {
        Framing::V2 => Ok(encoded),
        // A u16 under 251 is one byte in the codec's variable-length integers, and
        // check_framing allowed at most version 1 here; a header is never empty.
        Framing::V1 => Ok(encoded.split_first().map_or(encoded, |(_, rest)| rest)),
    }
}

/// [`Response`] as it is encoded: the same bytes as the `Result` (variant 0 the body, 1 the
/// refusal), with the body written and read as one byte string instead of element by element.
#[derive(Serialize)]
enum ResponseOut<'a> {
    Ok(#[serde(with = "serde_bytes")] &'a [u8]),
    Err(&'a Refused),
}

#[derive(Deserialize)]
enum ResponseIn {
    Ok(#[serde(with = "serde_bytes")] Vec<u8>),
    Err(Refused),
}

pub fn encode_response(response: &Response) -> Result<Vec<u8>, FrameError> {
    let wire = match response {
        Ok(body) => ResponseOut::Ok(body),
        Err(refused) => ResponseOut::Err(refused),
    };
    Ok(mesh_codec::encode("frame response", &wire)?)
}

pub fn decode_response(bytes: &[u8]) -> Result<Response, FrameError> {
    Ok(match mesh_codec::decode("frame response", bytes)? {
        ResponseIn::Ok(body) => Ok(body),
        ResponseIn::Err(refused) => Err(refused),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_bodies_are_encoded_exactly_as_before_so_old_peers_and_fixtures_still_read() {
        // The body is written as one byte string for speed; the bytes must equal those of the
        // plain `Vec<u8>` and `Result` encodings, or a peer of the previous version misreads them.
        #[derive(Serialize)]
        struct PlainHeader {
            kind: MessageKind,
            body: Vec<u8>,
        }
        let body: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
        let header = Header::new(MessageKind::Command, body.clone());
        let plain = PlainHeader {
            kind: MessageKind::Command,
            body: body.clone(),
        };
        // mesh/2: the version, then exactly the mesh/1 bytes (decision 0240).
        let ours = encode_header(&header).expect("encode");
        let plain_bytes = mesh_codec::encode("plain", &plain).expect("encode");
        assert_eq!(ours[0], 1, "version 1 is one byte");
        assert_eq!(&ours[1..], plain_bytes.as_slice());
        assert_eq!(decode_header(&ours).expect("decode"), header);
        let v1 = for_framing(&ours, &header.kind, 1, Framing::V1, "peer").expect("v1 carries v1");
        assert_eq!(v1, plain_bytes.as_slice());
        assert_eq!(
            decode_header_framed(v1, Framing::V1).expect("decode"),
            header
        );
        let refused = Refused {
            reason: "no".into(),
        };
        for response in [Ok(body), Err(refused)] {
            let ours = encode_response(&response).expect("encode");
            assert_eq!(
                ours,
                mesh_codec::encode("plain", &response).expect("encode")
            );
            assert_eq!(decode_response(&ours).expect("decode"), response);
        }
    }

    #[test]
    fn header_and_response_round_trip_through_the_codec() {
        // Framing: frame bodies are mesh_codec values.
        let header = Header::new(
            MessageKind::Report {
                machine: "ace".into(),
            },
            vec![1, 2, 3],
        );
        assert_eq!(
            decode_header(&encode_header(&header).expect("must succeed")).expect("must succeed"),
            header
        );
        let refused: Response = Err(Refused {
            reason: "no".into(),
        });
        assert_eq!(
            decode_response(&encode_response(&refused).expect("must succeed"))
                .expect("must succeed"),
            refused
        );
    }

    #[test]
    fn lengths_over_the_limit_are_refused_before_sending() {
        // Limits: frame_bytes_max is checked before a frame is written.
        assert!(check_len(10, 10).is_ok());
        assert!(matches!(
            check_len(11, 10),
            Err(FrameError::TooLarge { len: 11, max: 10 })
        ));
    }

    #[test]
    fn garbage_header_bytes_are_an_error_not_a_panic() {
        // No panics on any input.
        assert!(decode_header(&[0xff; 32]).is_err());
        assert!(decode_header_framed(&[0xff; 32], Framing::V1).is_err());
        assert!(decode_response(&[7, 7, 7]).is_err());
    }
}
