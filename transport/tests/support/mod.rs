//! Shared test fixtures: a mesh PKI in a temp dir, endpoints on loopback port 0, a handler that
//! records what it was given, and waiting on conditions with a deadline.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh_transport::{
    BoxFuture, Ca, CheckedConfig, Endpoint, Handler, Identity, MessageKind, Principal,
    TransportConfig, Validity,
};
use tokio::sync::Notify;

pub const loopback: &str = "127.0.0.1:0";
pub const wait_ms_max: u64 = 10_000;
pub const timeout: Duration = Duration::from_secs(5);

pub fn any_port() -> SocketAddr {
    loopback.parse().expect("loopback address")
}

/// A CA and the identities issued from it, kept in memory.
pub struct Pki {
    pub ca: Ca,
}

impl Pki {
    pub fn new() -> Pki {
        Pki {
            ca: Ca::create(Validity::days_from_now(1)).expect("create CA"),
        }
    }

    pub fn identity(&self, principal: &Principal) -> Identity {
        let issued = self
            .ca
            .issue(principal, Validity::days_from_now(1))
            .expect("issue");
        Identity::from_pem(self.ca.cert_pem(), issued.cert_pem(), issued.key_pem())
            .expect("identity")
    }
}

pub fn replica(id: u64) -> Principal {
    Principal::Replica(id)
}

pub fn host(name: &str) -> Principal {
    Principal::Host(name.to_string())
}

pub fn operator(name: &str) -> Principal {
    Principal::Operator(name.to_string())
}

pub fn report(machine: &str) -> MessageKind {
    MessageKind::Report {
        machine: machine.to_string(),
    }
}

/// Everything a handler was given, in arrival order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub from: Principal,
    pub kind: MessageKind,
    pub body: Vec<u8>,
    pub one_way: bool,
}

/// Echoes requests (prefixing "echo:"), records everything, and can be made to block.
#[derive(Default)]
pub struct Recorder {
    pub seen: Mutex<Vec<Seen>>,
    pub blocked: Mutex<bool>,
    pub unblock: Notify,
    pub in_handler: std::sync::atomic::AtomicUsize,
    pub in_handler_max: std::sync::atomic::AtomicUsize,
}

impl Recorder {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    pub fn block(&self) {
        *self.blocked.lock().expect("lock") = true;
    }

    pub fn release(&self) {
        *self.blocked.lock().expect("lock") = false;
        self.unblock.notify_waiters();
    }

    async fn wait_unblocked(&self) {
        loop {
            let notified = self.unblock.notified();
            if !*self.blocked.lock().expect("lock") {
                return;
            }
            notified.await;
        }
    }

    fn record(&self, from: Principal, kind: MessageKind, body: Vec<u8>, one_way: bool) {
        self.seen.lock().expect("lock").push(Seen {
            from,
            kind,
            body,
            one_way,
        });
    }
}

impl Handler for Recorder {
    fn request(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            let now = self.in_handler.fetch_add(1, SeqCst) + 1;
            self.in_handler_max.fetch_max(now, SeqCst);
            self.wait_unblocked().await;
            self.in_handler.fetch_sub(1, SeqCst);
            if body == b"refuse" {
                return Err("handler says no".to_string());
            }
            self.record(from, kind, body.clone(), false);
            let mut answer = b"echo:".to_vec();
            answer.extend_from_slice(&body);
            Ok(answer)
        })
    }

    fn one_way(&self, from: Principal, kind: MessageKind, body: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.record(from, kind, body, true) })
    }
}

pub fn config() -> CheckedConfig {
    TransportConfig::default().check().expect("config")
}

pub fn small_config(streams: u32, frame_bytes_max: u32) -> CheckedConfig {
    TransportConfig {
        streams_per_connection_max: streams,
        frame_bytes_max,
        ..TransportConfig::default()
    }
    .check()
    .expect("config")
}

/// An endpoint for `principal` that serves with a fresh recorder.
pub fn serving(pki: &Pki, principal: &Principal) -> (Endpoint, Arc<Recorder>) {
    serving_with(pki.identity(principal), config())
}

pub fn serving_with(identity: Identity, config: CheckedConfig) -> (Endpoint, Arc<Recorder>) {
    let endpoint = Endpoint::bind(any_port(), &identity, config).expect("bind");
    let recorder = Arc::new(Recorder::default());
    assert!(endpoint.serve(recorder.clone()));
    (endpoint, recorder)
}

/// A dial-only endpoint for `principal`.
pub fn client(pki: &Pki, principal: &Principal) -> Endpoint {
    Endpoint::bind(any_port(), &pki.identity(principal), config()).expect("bind")
}

/// Waits until `check` holds, polling; panics with `what` after the deadline.
pub async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms_max);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
