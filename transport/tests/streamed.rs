//! Streamed answers (decision 0190) over real QUIC on loopback: chunks reach the caller while
//! the handler is still working, a caller that does not ask gets one answer, a handler that does
//! not stream answers a caller that asks once, and a reader that does not read never holds the
//! handler back.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use mesh_transport::{BoxFuture, Endpoint, Handler, MessageKind, Part, Principal, Sink};
use support::*;
use tokio::sync::Notify;

/// Offers `first`, waits for `go` (when the body says "gated"), offers `second`; with the body
/// "flood" offers 100 chunks of 64 KiB without waiting. Answers how many were skipped.
#[derive(Default)]
struct Streamer {
    go: Notify,
    waiting: AtomicBool,
    finished: AtomicBool,
    skipped: AtomicU64,
}

impl Streamer {
    async fn work(&self, body: Vec<u8>, sink: Sink) -> Result<Vec<u8>, String> {
        if body == b"flood" {
            for i in 0..100u8 {
                sink.offer(vec![i; 64 * 1024]);
            }
        } else {
            sink.offer(b"first".to_vec());
            if body == b"gated" {
                let go = self.go.notified();
                self.waiting.store(true, Ordering::SeqCst);
                go.await;
            }
            sink.offer(b"second".to_vec());
        }
        self.skipped.store(sink.skipped(), Ordering::SeqCst);
        self.finished.store(true, Ordering::SeqCst);
        Ok(format!("done, {} skipped", sink.skipped()).into_bytes())
    }
}

impl Handler for Streamer {
    fn request(
        &self,
        _from: Principal,
        _kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(self.work(body, Sink::closed()))
    }

    fn request_streamed(
        &self,
        _from: Principal,
        _kind: MessageKind,
        body: Vec<u8>,
        sink: Sink,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(self.work(body, sink))
    }

    fn one_way(&self, _: Principal, _: MessageKind, _: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

fn streaming(pki: &Pki) -> (Endpoint, Arc<Streamer>) {
    let endpoint = Endpoint::bind(any_port(), &pki.identity(&replica(1)), config()).expect("bind");
    let streamer = Arc::new(Streamer::default());
    assert!(endpoint.serve(streamer.clone()));
    (endpoint, streamer)
}

const idle: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_chunk_reaches_the_caller_while_the_handler_still_works() {
    // Issue 13: the first chunk is read while the handler waits; the answer comes after `go`.
    let pki = Pki::new();
    let (server, streamer) = streaming(&pki);
    let alice = client(&pki, &operator("alice"));
    let mut answer = alice
        .request_stream(
            server.local_addr(),
            MessageKind::Command,
            b"gated".to_vec(),
            timeout,
            idle,
        )
        .await
        .expect("request");
    let first = answer.next().await.expect("first part");
    assert_eq!(first, Part::Chunk(b"first".to_vec()));
    assert!(
        !streamer.finished.load(Ordering::SeqCst),
        "the handler answered before its gate opened"
    );
    wait_for("the handler waits", || {
        streamer.waiting.load(Ordering::SeqCst)
    })
    .await;
    streamer.go.notify_one();
    assert_eq!(
        answer.next().await.expect("second"),
        Part::Chunk(b"second".to_vec())
    );
    assert_eq!(
        answer.next().await.expect("answer"),
        Part::Answer(b"done, 0 skipped".to_vec())
    );
    assert!(answer.next().await.is_err(), "nothing after the answer");
}

#[tokio::test]
async fn a_caller_that_does_not_ask_gets_one_answer_as_before() {
    // Old peers: a one-shot request to a streaming handler is answered with one frame.
    let pki = Pki::new();
    let (server, _) = streaming(&pki);
    let alice = client(&pki, &operator("alice"));
    let answer = alice
        .request(
            server.local_addr(),
            MessageKind::Command,
            b"plain".to_vec(),
            timeout,
        )
        .await
        .expect("request");
    assert_eq!(
        answer, b"done, 0 skipped",
        "a closed sink counts nothing as skipped"
    );
}

#[tokio::test]
async fn a_handler_that_does_not_stream_answers_a_caller_that_asks_once() {
    // Old peers: asking for a stream of a peer that only answers once is safe.
    let pki = Pki::new();
    let (server, recorder) = serving(&pki, &replica(1));
    let alice = client(&pki, &operator("alice"));
    let mut answer = alice
        .request_stream(
            server.local_addr(),
            MessageKind::Command,
            b"hi".to_vec(),
            timeout,
            idle,
        )
        .await
        .expect("request");
    assert_eq!(
        answer.next().await.expect("answer"),
        Part::Answer(b"echo:hi".to_vec())
    );
    assert_eq!(
        recorder.seen().len(),
        1,
        "the ask frame is not a second request"
    );
}

#[tokio::test]
async fn a_reader_that_does_not_read_never_holds_the_handler_back() {
    // Limits: 6.4 MiB of chunks against QUIC's flow-control window and a queue of 64: the
    // handler finishes before the caller reads anything, skipping what could not be queued;
    // the caller then reads what was queued and the answer, which says how many were skipped.
    let pki = Pki::new();
    let (server, streamer) = streaming(&pki);
    let alice = client(&pki, &operator("alice"));
    let mut answer = alice
        .request_stream(
            server.local_addr(),
            MessageKind::Command,
            b"flood".to_vec(),
            timeout,
            idle,
        )
        .await
        .expect("request");
    wait_for("the handler finishes unread", || {
        streamer.finished.load(Ordering::SeqCst)
    })
    .await;
    let skipped = streamer.skipped.load(Ordering::SeqCst);
    assert!(
        skipped > 0,
        "every chunk fit: the test did not fill the window"
    );
    let mut chunks = 0u64;
    loop {
        match answer.next().await.expect("part") {
            Part::Chunk(c) => {
                assert_eq!(c.len(), 64 * 1024);
                chunks += 1;
            }
            Part::Answer(a) => {
                assert_eq!(a, format!("done, {skipped} skipped").into_bytes());
                break;
            }
        }
    }
    assert_eq!(chunks + skipped, 100);
}
