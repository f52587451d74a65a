//! The transport tests' own fixtures: endpoints on loopback port 0, a handler that records what it
//! was given, raw QUIC connections and frames, captured logs. The PKI, principals and waits come
//! from mesh-testkit.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mesh_transport::{
    BoxFuture, CheckedConfig, Endpoint, Handler, Identity, MessageKind, Principal, TransportConfig,
};
use tokio::sync::Notify;

pub const wait_ms_max: u64 = mesh_testkit::wait_deadline.as_millis() as u64;
pub const timeout: Duration = Duration::from_secs(5);

#[allow(unused_imports)] // each test binary uses some of them
pub use mesh_testkit::{Pki, host, operator, replica, wait_for};

pub fn any_port() -> SocketAddr {
    mesh_testkit::loopback()
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

/// Echoes requests (prefixing "echo:") and records everything; requests whose body starts with
/// "slow" wait in the handler while the recorder is blocked, and are counted while they wait.
#[derive(Default)]
pub struct Recorder {
    pub seen: Mutex<Vec<Seen>>,
    pub blocked: Mutex<bool>,
    pub unblock: Notify,
    pub slow_in_handler: std::sync::atomic::AtomicUsize,
    pub slow_in_handler_max: std::sync::atomic::AtomicUsize,
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
            if body.starts_with(b"slow") {
                let now = self.slow_in_handler.fetch_add(1, SeqCst) + 1;
                self.slow_in_handler_max.fetch_max(now, SeqCst);
                self.wait_unblocked().await;
                self.slow_in_handler.fetch_sub(1, SeqCst);
            }
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

/// A raw QUIC connection presenting exactly this certificate and key, for writing bytes that
/// the endpoint API would never send.
pub async fn raw_connection(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
    server: SocketAddr,
) -> Result<quinn::Connection, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca = CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("ca pem");
    let chain = vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).expect("cert pem")];
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key pem");
    let client = mesh_transport::tls::client_config_from_parts(&ca, chain, key, &config())
        .expect("client config");
    let mut endpoint = quinn::Endpoint::client(any_port()).expect("client endpoint");
    endpoint.set_default_client_config(client);
    let connecting = endpoint
        .connect(server, mesh_transport::pki::server_name)
        .expect("connect");
    connecting.await.map_err(|e| e.to_string())
}

/// A raw connection with a properly issued certificate for `principal`.
pub async fn raw_connection_as(
    pki: &Pki,
    principal: &Principal,
    server: SocketAddr,
) -> quinn::Connection {
    let issued = pki.issue(principal);
    raw_connection(
        pki.ca.cert_pem(),
        issued.cert_pem(),
        issued.key_pem(),
        server,
    )
    .await
    .expect("raw connection")
}

/// Writes `bytes` as they are on a new bidirectional stream, optionally finishes it, and reads
/// the answer frame.
pub async fn raw_request(
    conn: &quinn::Connection,
    bytes: &[u8],
    finish: bool,
) -> Result<mesh_transport::Response, String> {
    use mesh_transport::frame;
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    send.write_all(bytes).await.map_err(|e| e.to_string())?;
    if finish {
        send.finish().map_err(|e| e.to_string())?;
    }
    let answer = frame::read_frame(&mut recv, 1 << 20, timeout)
        .await
        .map_err(|e| e.to_string())?;
    frame::decode_response(&answer).map_err(|e| e.to_string())
}

/// The bytes of a well-formed request frame.
pub fn request_frame(kind: MessageKind, body: &[u8]) -> Vec<u8> {
    let header = mesh_transport::Header::new(kind, body.to_vec());
    let encoded = mesh_transport::frame::encode_header(&header).expect("encode");
    let mut bytes = (encoded.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&encoded);
    bytes
}

/// Captured log output of the current thread (tests run on a current-thread runtime, so the
/// endpoint's tasks log here too).
#[derive(Clone, Default)]
pub struct Logs(pub Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }

    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
