//! Streamed answers (decision 0190): a request whose answer comes as chunks while the handler
//! works, then one final frame. The caller asks for it by writing a second, fixed frame
//! ([`stream_ask`]) after the request frame; a peer that does not know it reads only the first
//! frame and answers once, as before, so asking is always safe. Only `Command` and `Forward`
//! requests are looked at for it, so the other kinds pay nothing.
//!
//! On the wire every frame of the answer has the frame limit; chunks are variant 2 of the
//! answer's encoding and the final frame is exactly a one-shot [`Response`]. The handler offers
//! chunks to a [`Sink`] that never waits: it holds at most [`stream_chunks_max`], and a chunk
//! offered while it is full (a slow reader) is skipped and counted — the final answer has to
//! carry everything the chunks said. A reader that takes nothing for `request_timeout` loses
//! the stream (it is reset), never the handler its progress.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quinn::{RecvStream, SendStream, VarInt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::endpoint::{Endpoint, Peer, TransportError};
use crate::faults::Verdict;
use crate::frame::{self, FrameError, Header, Refused, Response};
use crate::writers::MessageKind;

/// The body of the frame a caller writes after its request to ask for a streamed answer.
pub const stream_ask: &[u8] = b"mesh-stream/1";

/// Chunks waiting to be written on one stream; an offer beyond this is skipped.
pub const stream_chunks_max: usize = 64;

/// Stream reset code: the reader took nothing for `request_timeout`; the rest is not sent.
pub const reset_slow_reader: u32 = 5;

/// Whether a request of this kind is looked at for [`stream_ask`].
pub(crate) fn may_stream(kind: &MessageKind) -> bool {
    matches!(kind, MessageKind::Command | MessageKind::Forward)
}

/// One frame of a streamed answer: variants 0 and 1 are a one-shot [`Response`]'s (the final
/// frame is written by `serve::answer` as one, so only the tests build them here).
#[derive(Serialize)]
#[cfg_attr(not(test), allow(dead_code))]
enum PartOut<'a> {
    Ok(#[serde(with = "serde_bytes")] &'a [u8]),
    Err(&'a Refused),
    Chunk(#[serde(with = "serde_bytes")] &'a [u8]),
}

#[derive(Deserialize)]
enum PartIn {
    Ok(#[serde(with = "serde_bytes")] Vec<u8>),
    Err(Refused),
    Chunk(#[serde(with = "serde_bytes")] Vec<u8>),
}

/// What the handler offers chunks to. Cheap to clone; offering never waits.
#[derive(Clone, Debug)]
pub struct Sink {
    tx: Option<mpsc::Sender<Vec<u8>>>,
    skipped: Arc<AtomicU64>,
    chunk_bytes_max: usize,
}

impl Sink {
    /// A sink that takes nothing: the caller asked for one answer.
    pub fn closed() -> Sink {
        Sink {
            tx: None,
            skipped: Arc::new(AtomicU64::new(0)),
            chunk_bytes_max: 0,
        }
    }

    pub(crate) fn open(chunk_bytes_max: usize) -> (Sink, mpsc::Receiver<Vec<u8>>) {
        let (tx, rx) = mpsc::channel(stream_chunks_max);
        let sink = Sink {
            tx: Some(tx),
            skipped: Arc::new(AtomicU64::new(0)),
            chunk_bytes_max,
        };
        (sink, rx)
    }

    /// Whether the caller reads chunks (they may still be skipped).
    pub fn is_open(&self) -> bool {
        self.tx.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// Queues `chunk` to be written; `false` when the caller asked for one answer, and `false`
    /// and counted as skipped when the queue is full, the stream is gone, or the chunk is over
    /// the frame limit.
    pub fn offer(&self, chunk: Vec<u8>) -> bool {
        let Some(tx) = &self.tx else { return false };
        // The encoding adds at most 16 bytes (variant and length) to the chunk.
        let queued = chunk.len() + 16 <= self.chunk_bytes_max && tx.try_send(chunk).is_ok();
        if !queued {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    /// Chunks offered to an open stream that were not queued.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

/// Reads what may follow a permitted request frame: `true` when it is [`stream_ask`]. A caller
/// that finished its stream after the request (every one-shot caller) answers at once.
pub(crate) async fn asked(recv: &mut RecvStream, timeout: Duration) -> bool {
    match frame::read_frame(recv, stream_ask.len(), timeout).await {
        Ok(bytes) => bytes == stream_ask,
        Err(_) => false,
    }
}

/// Serves one streamed request: `job` (the handler, holding the sink of `rx`) runs while its
/// chunks are written as they come. `None` when the stream broke off (reset: no answer can
/// follow); else the handler's answer, for the final frame.
pub(crate) async fn serve(
    send: &mut SendStream,
    addr: SocketAddr,
    frame_bytes_max: usize,
    timeout: Duration,
    mut rx: mpsc::Receiver<Vec<u8>>,
    job: crate::serve::BoxFuture<'_, Result<Vec<u8>, String>>,
) -> Option<Response> {
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
    let job = async {
        let answer = job.await;
        let _ = done_tx.send(());
        answer
    };
    // Polled beside the handler, never instead of it: a write waiting on a slow reader holds
    // back only the chunks, which are skipped once the queue is full.
    let writer = async {
        let mut job_done = false;
        loop {
            let chunk = if job_done {
                // What was queued is still written; nothing more is waited for.
                rx.try_recv().ok()
            } else {
                tokio::select! {
                    biased;
                    chunk = rx.recv() => chunk,
                    _ = &mut done_rx => {
                        job_done = true;
                        continue;
                    }
                }
            };
            let Some(chunk) = chunk else { return true };
            let part = PartOut::Chunk(&chunk);
            if let Err(e) = write_part(send, &part, frame_bytes_max, timeout).await {
                // Mid-frame, the stream cannot carry a clean answer any more; the handler goes
                // on (its work must not depend on who reads) and its chunks are dropped.
                tracing::debug!(peer = %addr, reason = %e, "streamed answer abandoned");
                let _ = send.reset(VarInt::from_u32(reset_slow_reader));
                rx.close();
                return false;
            }
        }
    };
    let (answer, intact) = tokio::join!(job, writer);
    intact.then(|| answer.map_err(|reason| Refused { reason }))
}

async fn write_part(
    send: &mut SendStream,
    part: &PartOut<'_>,
    max: usize,
    timeout: Duration,
) -> Result<(), FrameError> {
    let bytes = mesh_codec::encode("answer chunk", part)?;
    let len = frame::check_len(bytes.len(), max)?;
    let write = async {
        send.write_all(&len.to_be_bytes()).await?;
        send.write_all(&bytes).await
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(FrameError::Stream {
            action: "write",
            reason: e.to_string(),
        }),
        Err(_) => Err(FrameError::Timeout {
            after_ms: timeout.as_millis(),
        }),
    }
}

/// One part of a streamed answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Part {
    /// A chunk the handler offered, in order.
    Chunk(Vec<u8>),
    /// The answer; nothing follows it.
    Answer(Vec<u8>),
}

/// The answer of [`Endpoint::request_stream`], read part by part.
#[derive(Debug)]
pub struct Streaming {
    addr: SocketAddr,
    // Kept so the stream stays open until the answer is read.
    _send: SendStream,
    recv: RecvStream,
    frame_bytes_max: usize,
    deadline: Instant,
    idle: Duration,
    done: bool,
}

impl Streaming {
    /// The next part: each within `idle` of the one before and all before the request's
    /// deadline. After [`Part::Answer`] there is nothing more to read.
    pub async fn next(&mut self) -> Result<Part, TransportError> {
        let addr = self.addr;
        if self.done {
            return Err(TransportError::BadAnswer {
                addr,
                reason: "the answer was already read".into(),
            });
        }
        let now = Instant::now();
        let left = self.deadline.saturating_duration_since(now);
        let wait = left.min(self.idle);
        let bytes = match frame::read_frame(&mut self.recv, self.frame_bytes_max, wait).await {
            Ok(bytes) => bytes,
            Err(FrameError::Timeout { after_ms }) => {
                self.done = true;
                return Err(TransportError::Timeout { addr, after_ms });
            }
            Err(e) => {
                self.done = true;
                return Err(TransportError::BadAnswer {
                    addr,
                    reason: format!("the streamed answer broke off: {e}"),
                });
            }
        };
        match mesh_codec::decode::<PartIn>("answer part", &bytes) {
            Ok(PartIn::Chunk(chunk)) => Ok(Part::Chunk(chunk)),
            Ok(PartIn::Ok(body)) => {
                self.done = true;
                Ok(Part::Answer(body))
            }
            Ok(PartIn::Err(refused)) => {
                self.done = true;
                Err(TransportError::Refused {
                    addr,
                    reason: refused.reason,
                })
            }
            Err(e) => {
                self.done = true;
                Err(TransportError::BadAnswer {
                    addr,
                    reason: e.to_string(),
                })
            }
        }
    }
}

impl Endpoint {
    /// Sends a request asking for a streamed answer; read it with [`Streaming::next`]. `timeout`
    /// bounds the whole exchange, `idle` the wait for each part. A peer that answers once gives
    /// only [`Part::Answer`]. Like [`Endpoint::request`], a request written whole is never sent
    /// again; a reused connection found dead before that is dialled again once.
    pub async fn request_stream(
        &self,
        peer: impl Into<Peer>,
        kind: MessageKind,
        body: Vec<u8>,
        timeout: Duration,
        idle: Duration,
    ) -> Result<Streaming, TransportError> {
        let peer = peer.into();
        let addr = peer.addr;
        let max = self.config().frame_bytes_max();
        let too_large = |len: usize| TransportError::FrameTooLarge {
            len: len as u64,
            max,
        };
        if body.len() > max {
            return Err(too_large(body.len()));
        }
        let body_len = body.len();
        let bytes = frame::encode_header(&Header::new(kind.clone(), body))
            .map_err(|_| too_large(body_len))?;
        let version = crate::version::current(&kind);
        frame::check_len(bytes.len(), max).map_err(|_| too_large(bytes.len()))?;
        let deadline = Instant::now() + timeout;
        let timed_out = || TransportError::Timeout {
            addr,
            after_ms: timeout.as_millis(),
        };
        let open = async {
            let _done;
            match self.faults().request_verdict(addr).await {
                Verdict::Pass => {}
                // A lost request looks like a silent peer: the caller's deadline fires.
                Verdict::Drop | Verdict::Cut => std::future::pending::<()>().await,
                Verdict::Delay(delay) => tokio::time::sleep(delay).await,
                Verdict::Hold { go, done } => {
                    _done = done;
                    let _ = go.await;
                }
            }
            let framed = |conn: &quinn::Connection| {
                let framing = crate::version::framing_of(conn);
                frame::for_framing(&bytes, &kind, version, framing, &addr.to_string()).map_err(
                    |e| TransportError::Refused {
                        addr,
                        reason: e.to_string(),
                    },
                )
            };
            let (conn, reused) = self.connection_to(&peer, deadline).await?;
            match write_ask(&conn, framed(&conn)?, max, deadline).await {
                Err(Opened::Stale) if reused => {
                    self.forget(addr).await;
                    let (conn, _) = self.connection_to(&peer, deadline).await?;
                    write_ask(&conn, framed(&conn)?, max, deadline)
                        .await
                        .map_err(|e| e.into_error(addr))
                }
                other => other.map_err(|e| e.into_error(addr)),
            }
        };
        let (send, recv) = match tokio::time::timeout_at(deadline, open).await {
            Ok(opened) => opened?,
            Err(_) => {
                self.forget(addr).await;
                return Err(timed_out());
            }
        };
        Ok(Streaming {
            addr,
            _send: send,
            recv,
            frame_bytes_max: max,
            deadline,
            idle,
            done: false,
        })
    }
}

/// Why the request and its ask could not be written.
enum Opened {
    /// The connection was dead before anything was written: safe to dial again.
    Stale,
    Failed(String),
    Timeout(u128),
}

impl Opened {
    fn into_error(self, addr: SocketAddr) -> TransportError {
        match self {
            Opened::Stale => TransportError::Unreachable {
                addr,
                reason: "the connection closed before the request was written".into(),
            },
            Opened::Failed(reason) => TransportError::Unreachable { addr, reason },
            Opened::Timeout(after_ms) => TransportError::Timeout { addr, after_ms },
        }
    }
}

async fn write_ask(
    conn: &quinn::Connection,
    request: &[u8],
    max: usize,
    deadline: Instant,
) -> Result<(SendStream, RecvStream), Opened> {
    let (mut send, recv) = conn.open_bi().await.map_err(|_| Opened::Stale)?;
    let mut bytes = Vec::with_capacity(request.len() + stream_ask.len() + 8);
    for part in [request, stream_ask] {
        let len = frame::check_len(part.len(), max).map_err(|e| Opened::Failed(e.to_string()))?;
        bytes.extend_from_slice(&len.to_be_bytes());
        bytes.extend_from_slice(part);
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let write = async {
        send.write_all(&bytes).await?;
        send.finish().map_err(|_| quinn::WriteError::ClosedStream)
    };
    match tokio::time::timeout(left, write).await {
        Ok(Ok(())) => Ok((send, recv)),
        Ok(Err(quinn::WriteError::ConnectionLost(_))) => Err(Opened::Stale),
        Ok(Err(e)) => Err(Opened::Failed(format!("stream write failed: {e}"))),
        Err(_) => Err(Opened::Timeout(left.as_millis())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_part_is_exactly_a_one_shot_response_so_old_peers_answers_read_as_final() {
        // Decision 0190: a peer that never streams answers with a plain Response frame; the
        // streaming reader must take it as the answer, and its own final frames must be the
        // same bytes.
        let body = vec![1u8, 2, 3];
        let ok = frame::encode_response(&Ok(body.clone())).expect("encode");
        assert_eq!(
            mesh_codec::encode("part", &PartOut::Ok(&body)).expect("encode"),
            ok
        );
        assert!(matches!(
            mesh_codec::decode::<PartIn>("part", &ok),
            Ok(PartIn::Ok(b)) if b == body
        ));
        let refused = Refused {
            reason: "no".into(),
        };
        let err = frame::encode_response(&Err(refused.clone())).expect("encode");
        assert_eq!(
            mesh_codec::encode("part", &PartOut::Err(&refused)).expect("encode"),
            err
        );
        assert!(matches!(
            mesh_codec::decode::<PartIn>("part", &err),
            Ok(PartIn::Err(r)) if r == refused
        ));
        let chunk = mesh_codec::encode("part", &PartOut::Chunk(&body)).expect("encode");
        assert!(frame::decode_response(&chunk).is_err());
    }

    #[test]
    fn a_full_sink_skips_and_counts_instead_of_waiting() {
        // Limits: the handler never waits on a slow reader; what it could not queue is counted.
        let (sink, mut rx) = Sink::open(1024);
        for _ in 0..stream_chunks_max {
            assert!(sink.offer(vec![0; 8]));
        }
        assert!(!sink.offer(vec![0; 8]));
        assert!(!sink.offer(vec![0; 2000]), "over the frame limit");
        assert_eq!(sink.skipped(), 2);
        assert!(rx.try_recv().is_ok());
        assert!(sink.offer(vec![0; 8]));
        let closed = Sink::closed();
        assert!(!closed.is_open());
        assert!(!closed.offer(vec![1]));
    }
}
