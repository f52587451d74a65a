//! A follower's relay of a streamed push (decision 0190): it forwards the push to the leader
//! asking for a streamed answer and offers each chunk the leader sends (its events, opaque here)
//! to the operator's stream as it comes, then hands back the leader's answer.

use std::time::Duration;

use mesh_transport::{Endpoint, MessageKind, Part, Peer, Sink, TransportError};

use super::push::push_queue_wait_ms;

/// Longest wait for the leader's next part of a streamed push: its first event comes once it
/// has the push lock (up to [`push_queue_wait_ms`]) and a lease round; later ones as hosts
/// answer, each within the request timeout.
pub const stream_idle_ms: u64 = push_queue_wait_ms + 30_000;

/// Forwards `body` to `peer` and relays its streamed answer into `lines`; the answer's bytes.
/// A leader that answers once (an older one) gives only the answer.
pub(crate) async fn relay(
    endpoint: &Endpoint,
    peer: Peer,
    body: Vec<u8>,
    timeout: Duration,
    lines: &Sink,
) -> Result<Vec<u8>, TransportError> {
    let idle = Duration::from_millis(stream_idle_ms).min(timeout);
    let mut answer = endpoint
        .request_stream(peer, MessageKind::Forward, body, timeout, idle)
        .await?;
    loop {
        match answer.next().await? {
            Part::Chunk(chunk) => {
                // Never waits: a skipped chunk is in the answer too.
                lines.offer(chunk);
            }
            Part::Answer(bytes) => return Ok(bytes),
        }
    }
}
