//! One QUIC endpoint per process: it serves (see `serve.rs`) and dials. Dialling keeps one
//! connection per peer address, re-dials with bounded exponential backoff, and never holds a
//! lock shared between peers across a dial.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use quinn::{Connection, ConnectionError};
use tokio::time::Instant;

use crate::admit::{Admission, CheckedLimits};
use crate::config::CheckedConfig;
use crate::faults::{Faults, Verdict};
use crate::frame::{self, FrameError, Header};
use crate::open::{OpenConns, Side, close_untrusted};
use crate::pki::{Identity, server_name};
use crate::principal::Principal;
use crate::serve::{Counters, Counts, Handler, ServeContext};
use crate::tls::{self, ResetKey, RestartableCids, TlsError};
use crate::trust::{CertInfo, DenyList, Live};
use crate::writers::MessageKind;

/// First wait after a failed dial, in milliseconds; doubles per failure up to the config's
/// `dial_backoff_max_ms`.
pub const dial_backoff_first_ms: u64 = 50;

/// Most peer addresses remembered; slots without a live connection are pruned beyond this.
pub const peers_max: usize = 16_384;

/// How long `close` waits for connections to say goodbye, in milliseconds.
pub const close_wait_ms_max: u64 = 1000;

/// A peer to reach: an address and, optionally, the principal that must answer there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    pub expect: Option<Principal>,
}

impl Peer {
    /// A peer that must present a certificate naming `principal`.
    pub fn expecting(addr: SocketAddr, principal: Principal) -> Peer {
        Peer {
            addr,
            expect: Some(principal),
        }
    }
}

impl From<SocketAddr> for Peer {
    fn from(addr: SocketAddr) -> Peer {
        Peer { addr, expect: None }
    }
}

/// Why an endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("could not bind UDP {addr}: {source}; is another process using the port?")]
    Socket {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(
        "the reloaded certificate names {loaded}, but this process is {running}; a process keeps its principal: start it with the new config instead"
    )]
    Principal {
        running: Principal,
        loaded: Principal,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Files(#[from] crate::pki::PkiError),
}

/// Why a request or one-way message did not get through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("{addr} unreachable: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("{addr}: no answer within {after_ms} ms")]
    Timeout { addr: SocketAddr, after_ms: u128 },
    #[error("{addr} refused the message: {reason}")]
    Refused { addr: SocketAddr, reason: String },
    #[error(
        "frame of {len} bytes is over the limit of {max} bytes (frame_bytes_max); send less or raise the limit on both ends"
    )]
    FrameTooLarge { len: u64, max: usize },
    #[error("TLS handshake with {addr} refused: {reason}")]
    HandshakeRefused { addr: SocketAddr, reason: String },
    #[error("{addr} is {found}, not the expected {expected}; check the address in the config")]
    WrongPeer {
        addr: SocketAddr,
        expected: Principal,
        found: Principal,
    },
    #[error("{addr} answered with a bad frame: {reason}")]
    BadAnswer { addr: SocketAddr, reason: String },
    #[error(
        "too many peers ({max}) with live connections; raise peers_max or dial fewer addresses"
    )]
    TooManyPeers { max: usize },
    /// The caller's write gate (a leader's lease, G3) closed before the first byte was written,
    /// or before the write finished (then the stream was reset: nothing more leaves).
    #[error("not sent to {addr}: {reason}")]
    Gated { addr: SocketAddr, reason: String },
    #[error(
        "{addr} reset the connection after the whole request was written; it may have run there, so it is not sent again"
    )]
    ResetAfterWrite { addr: SocketAddr },
}

/// A message on its way: its header encoded in the mesh/2 layout, with the kind and version it
/// carries, so each connection can take it in its own framing.
struct Message<'a> {
    kind: &'a MessageKind,
    version: u16,
    bytes: &'a [u8],
}

/// Decides, after the connection is up and right before the first byte of a request is
/// written, whether it may be written, and for how long writing may go on (a leader's lease,
/// G3): dialling, backoff and handshakes all happen before it is asked. When that time runs out
/// before the answer came, it is asked again: refused, the request's stream is reset.
pub type WriteGate<'a> = &'a (dyn Fn() -> Result<Duration, String> + Send + Sync);

/// A dialled connection kept for later requests, with the peer's certificate it was opened with.
struct Kept {
    conn: Connection,
    principal: Principal,
    cert: Option<CertInfo>,
}

#[derive(Default)]
struct PeerState {
    conn: Option<Kept>,
    failures: u32,
    retry_at: Option<Instant>,
}

/// One peer's connection, behind its own lock so a slow dial blocks only callers of that peer.
#[derive(Default)]
struct PeerSlot {
    state: tokio::sync::Mutex<PeerState>,
}

struct Inner {
    quinn: quinn::Endpoint,
    client: quinn::ClientConfig,
    /// `client` with the transport of a dial to a host (no GSO, `tls::gso_on`), made once.
    client_to_hosts: quinn::ClientConfig,
    config: CheckedConfig,
    principal: Principal,
    local_addr: SocketAddr,
    peers: Mutex<HashMap<SocketAddr, Arc<PeerSlot>>>,
    counters: Arc<Counters>,
    faults: Arc<Faults>,
    /// What serving shares, once [`Endpoint::serve`] was called: a dialled connection that
    /// carries messages both ways is served with it too (decision 0316). Weak: the accept loop
    /// owns it. A handler may hold this endpoint (a host's does), and a strong reference here
    /// would make a cycle that keeps the closed endpoint, and its UDP port, for good: a host
    /// restarted in the same process could not bind its address again (decision 0325).
    serving: Mutex<Option<Weak<ServeContext>>>,
    live: Arc<Live>,
    open: Arc<OpenConns>,
    /// Where connections from given peers run (decision 0338), shared with serving.
    preferred: Arc<Mutex<Option<crate::serve::Preferred>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.quinn
            .close(quinn::VarInt::from_u32(0), b"endpoint dropped");
    }
}

/// The receive and send buffers asked for on every endpoint's UDP socket. Linux gives a socket
/// 208 KiB by default; a replica's one socket takes every client's, peer's and host's packets, and
/// at load `l` (500 clients) about 600 datagrams a second were dropped on a full buffer, each one
/// a QUIC loss the sender recovers only after a probe timeout — the slowest writes. The kernel
/// grants at most `net.core.rmem_max` / `wmem_max` (decision 0252).
pub const socket_buffer_bytes: usize = 4 * 1024 * 1024;

/// Asks for [`socket_buffer_bytes`] both ways. A refusal leaves the kernel's default, which
/// works, only with more loss under load: it is logged, not fatal.
fn widen_buffers(socket: &std::net::UdpSocket, addr: SocketAddr) {
    let sock = socket2::SockRef::from(socket);
    for (way, result) in [
        ("receive", sock.set_recv_buffer_size(socket_buffer_bytes)),
        ("send", sock.set_send_buffer_size(socket_buffer_bytes)),
    ] {
        if let Err(e) = result {
            tracing::warn!(%addr, way, error = %e, "could not widen the UDP {way} buffer to {socket_buffer_bytes} bytes; packets may be dropped under load");
        }
    }
}

/// A mesh QUIC endpoint: cheap to clone, all clones share connections, counters and faults.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("principal", &self.inner.principal)
            .field("local_addr", &self.inner.local_addr)
            .finish_non_exhaustive()
    }
}

/// What one outgoing message is, for the shared send path.
enum Outgoing {
    Request,
    OneWay,
}

impl Endpoint {
    /// Binds a UDP socket (port 0 for any) inside the current tokio runtime. Incoming
    /// connections wait until [`Endpoint::serve`] is called.
    pub fn bind(
        addr: SocketAddr,
        identity: &Identity,
        config: CheckedConfig,
    ) -> Result<Endpoint, BindError> {
        let socket_err = |source| BindError::Socket { addr, source };
        let socket = std::net::UdpSocket::bind(addr).map_err(socket_err)?;
        widen_buffers(&socket, addr);
        let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
        let socket = runtime.wrap_udp_socket(socket).map_err(socket_err)?;
        Endpoint::over_socket(identity, config, socket, runtime, None)
    }

    /// [`Endpoint::bind`] over a socket and runtime given instead of a UDP socket of the OS and
    /// tokio's: the same QUIC, TLS and trust checks over another datagram carrier (the
    /// simulator's network, decision 0322). `rng_seed` seeds QUIC's own random choices (none:
    /// from the OS, as `bind`).
    pub fn over_socket(
        identity: &Identity,
        config: CheckedConfig,
        socket: Arc<dyn quinn::AsyncUdpSocket>,
        runtime: Arc<dyn quinn::Runtime>,
        rng_seed: Option<[u8; 32]>,
    ) -> Result<Endpoint, BindError> {
        let addr = socket.local_addr().map_err(|source| BindError::Socket {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        let socket_err = |source| BindError::Socket { addr, source };
        let live = Arc::new(identity.live()?);
        let server = tls::server_config_live(live.clone(), &config)?;
        let client = tls::client_config_live(live.clone(), &config)?;
        let mut endpoint_config = match ResetKey::from_identity(identity) {
            Some(key) => quinn::EndpointConfig::new(Arc::new(key)),
            None => quinn::EndpointConfig::default(),
        };
        endpoint_config.cid_generator(|| Box::new(RestartableCids::new()));
        endpoint_config.rng_seed(rng_seed);
        let quinn = quinn::Endpoint::new_with_abstract_socket(
            endpoint_config,
            Some(server),
            socket,
            runtime,
        )
        .map_err(socket_err)?;
        let local_addr = quinn.local_addr().map_err(socket_err)?;
        Ok(Endpoint {
            inner: Arc::new(Inner {
                quinn,
                client_to_hosts: tls::to_host(&client, &config),
                client,
                config,
                principal: identity.principal().clone(),
                local_addr,
                peers: Mutex::new(HashMap::new()),
                counters: Arc::new(Counters::default()),
                faults: Arc::new(Faults::default()),
                serving: Mutex::new(None),
                open: Arc::new(OpenConns::new(live.clone())),
                live,
                preferred: Arc::new(Mutex::new(None)),
            }),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The principal this endpoint's certificate names.
    pub fn principal(&self) -> &Principal {
        &self.inner.principal
    }

    pub fn config(&self) -> &CheckedConfig {
        &self.inner.config
    }

    /// The fault hooks (all off until set).
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Counters since the endpoint started: refusals, bad frames, handshakes, dials.
    pub fn counts(&self) -> Counts {
        self.inner.counters.snapshot()
    }

    /// Starts accepting connections and hands every permitted message to `handler`.
    /// Returns `false` (and changes nothing) if this endpoint already serves.
    pub fn serve(&self, handler: Arc<dyn Handler>) -> bool {
        self.serve_limited(handler, CheckedLimits::default())
    }

    /// [`Endpoint::serve`] with other admission limits than the defaults (decision 0300): for
    /// tests, so a handful of connections reach a cap.
    pub fn serve_limited(&self, handler: Arc<dyn Handler>, limits: CheckedLimits) -> bool {
        let mut serving = self
            .inner
            .serving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if serving.is_some() {
            return false;
        }
        let context = ServeContext {
            config: self.inner.config.clone(),
            counters: self.inner.counters.clone(),
            faults: self.inner.faults.clone(),
            handler,
            open: self.inner.open.clone(),
            admission: Arc::new(Admission::new(limits, self.inner.counters.clone())),
            principal: self.inner.principal.clone(),
            warned: Arc::default(),
            warned_handshakes: Arc::default(),
            preferred: self.inner.preferred.clone(),
            serving: tokio::runtime::Handle::current(),
        };
        let context = Arc::new(context);
        *serving = Some(Arc::downgrade(&context));
        // Where preferred connections run, when named before: a peer's new connection is then
        // not queued behind the serving runtime's work even before its handshake (decision 0338).
        let accept_on = self
            .inner
            .preferred
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
            .map(|p| p.runtime.clone());
        let accept = crate::serve::accept_loop(self.inner.quinn.clone(), context);
        match accept_on {
            Some(runtime) => {
                runtime.spawn(accept);
            }
            None => {
                tokio::spawn(accept);
            }
        }
        true
    }

    /// Runs every connection accepted from one of `peers` on `runtime` (its handshake, its QUIC
    /// driver and the requests on it) instead of on the runtime [`Endpoint::serve`] was called
    /// on; replaces the set given before. A replica names its fellow replicas' addresses and its
    /// Raft thread, so it answers its leader however busy the fleet keeps its serving runtime
    /// (decision 0338). Named before serving, the accept loop runs on `runtime` too, so a peer's
    /// new connection is not queued behind the serving runtime either; every other connection
    /// is still handed to the serving runtime. Who a peer is still comes from its certificate
    /// alone.
    pub fn prefer(
        &self,
        runtime: tokio::runtime::Handle,
        peers: impl IntoIterator<Item = SocketAddr>,
    ) {
        let preferred = crate::serve::Preferred {
            runtime,
            peers: peers.into_iter().collect(),
        };
        *self
            .inner
            .preferred
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(preferred);
    }

    /// Loads a new certificate, key and CA set (decision 0170): handshakes from now on use them,
    /// open connections stay up unless their peer's certificate no longer chains to the new CA
    /// set (then they are closed, as [`Endpoint::set_denied`] does). The principal cannot change.
    /// On error nothing changed. Returns how many connections were closed.
    pub fn reload_identity(&self, identity: &Identity) -> Result<usize, ReloadError> {
        if identity.principal() != &self.inner.principal {
            return Err(ReloadError::Principal {
                running: self.inner.principal.clone(),
                loaded: identity.principal().clone(),
            });
        }
        self.inner
            .live
            .reload(identity.cas(), identity.chain(), identity.key())?;
        Ok(self.recheck_open())
    }

    /// Replaces the deny list: the next handshake of a revoked certificate is refused, and open
    /// connections of one are closed now with the refusal as the reason. Returns how many.
    pub fn set_denied(&self, deny: DenyList) -> usize {
        if self.inner.live.denied() == deny {
            return 0;
        }
        self.inner.live.set_denied(deny);
        self.recheck_open()
    }

    /// [`Endpoint::reload_identity`] from the files: the CA set, certificate and key (0600).
    pub fn reload_from_files(
        &self,
        ca: &std::path::Path,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<usize, ReloadError> {
        let identity = Identity::load(ca, cert, key)?;
        self.reload_identity(&identity)
    }

    /// How many CA certificates are trusted now: 1, or 2 during a CA switch.
    pub fn trusted_cas(&self) -> usize {
        self.inner.live.cas().len()
    }

    /// The deny list in force.
    pub fn denied(&self) -> DenyList {
        self.inner.live.denied()
    }

    /// This endpoint's own certificate, and the one each peer presented at its last handshake.
    pub fn certificates(&self) -> (Option<CertInfo>, Vec<CertInfo>) {
        (self.inner.live.own(), self.inner.live.seen())
    }

    /// Checks every open connection's peer certificate against the trust in force and closes
    /// those refused, each with one line naming the certificate.
    fn recheck_open(&self) -> usize {
        let mut closed = 0;
        for (conn, side) in self.inner.open.all() {
            if self.inner.open.recheck(&conn, side).is_err() {
                closed += 1;
            }
        }
        closed
    }

    /// Closes every connection and stops serving; peers see the connection closed at once.
    /// Closes every connection at once without waiting for the peers to hear it: for a caller
    /// that gives up on peers that did not answer (waiting for them to go idle would only add
    /// `close_wait_ms_max` to its failure).
    pub fn abandon(&self) {
        self.inner
            .quinn
            .close(quinn::VarInt::from_u32(0), b"endpoint closed");
    }

    pub async fn close(&self) {
        self.inner
            .quinn
            .close(quinn::VarInt::from_u32(0), b"endpoint closed");
        let wait = Duration::from_millis(close_wait_ms_max);
        let _ = tokio::time::timeout(wait, self.inner.quinn.wait_idle()).await;
    }

    /// Sends a request and waits for its answer, all within `timeout`. A request that was
    /// written whole is never sent again, whatever happens to the connection after.
    pub async fn request(
        &self,
        peer: impl Into<Peer>,
        kind: MessageKind,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        self.send(peer.into(), kind, body, timeout, Outgoing::Request, None)
            .await
    }

    /// [`Endpoint::request`], writing only if `gate` allows it once the connection is up, and
    /// no byte after the time it allows: a write that runs past it is reset.
    pub async fn request_gated(
        &self,
        peer: impl Into<Peer>,
        kind: MessageKind,
        body: Vec<u8>,
        timeout: Duration,
        gate: WriteGate<'_>,
    ) -> Result<Vec<u8>, TransportError> {
        self.send(
            peer.into(),
            kind,
            body,
            timeout,
            Outgoing::Request,
            Some(gate),
        )
        .await
    }

    /// Sends a one-way message; `Ok` once the peer's QUIC stack has acknowledged all of it (not
    /// that a handler ran).
    pub async fn send_one_way(
        &self,
        peer: impl Into<Peer>,
        kind: MessageKind,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        self.send(peer.into(), kind, body, timeout, Outgoing::OneWay, None)
            .await
            .map(|_| ())
    }

    /// Dials `peer` if needed and says which principal answers there.
    pub async fn peer_principal(
        &self,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Result<Principal, TransportError> {
        let deadline = Instant::now() + timeout;
        match tokio::time::timeout_at(deadline, self.connection(peer, None, deadline)).await {
            Ok(connected) => connected.map(|(_, principal, _)| principal),
            Err(_) => Err(TransportError::Timeout {
                addr: peer,
                after_ms: timeout.as_millis(),
            }),
        }
    }

    async fn send(
        &self,
        peer: Peer,
        kind: MessageKind,
        body: Vec<u8>,
        timeout: Duration,
        what: Outgoing,
        gate: Option<WriteGate<'_>>,
    ) -> Result<Vec<u8>, TransportError> {
        let max = self.inner.config.frame_bytes_max();
        let too_large = |len: usize| TransportError::FrameTooLarge {
            len: len as u64,
            max,
        };
        // Refuse an oversized body before copying it into a frame.
        if body.len() > max {
            return Err(too_large(body.len()));
        }
        let body_len = body.len();
        // Encoding bytes and a kind fails only past the codec's size limit.
        let bytes = frame::encode_header(&Header::new(kind.clone(), body))
            .map_err(|_| too_large(body_len))?;
        frame::check_len(bytes.len(), max).map_err(|_| too_large(bytes.len()))?;
        let deadline = Instant::now() + timeout;
        let message = Message {
            kind: &kind,
            version: crate::version::current(&kind),
            bytes: &bytes,
        };
        let attempt = self.send_through_faults(&peer, &message, deadline, &what, gate);
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(result) => result,
            Err(_) => {
                self.forget_connection(peer.addr).await;
                Err(TransportError::Timeout {
                    addr: peer.addr,
                    after_ms: timeout.as_millis(),
                })
            }
        }
    }

    async fn send_through_faults(
        &self,
        peer: &Peer,
        message: &Message<'_>,
        deadline: Instant,
        what: &Outgoing,
        gate: Option<WriteGate<'_>>,
    ) -> Result<Vec<u8>, TransportError> {
        // Held until here so release can tell when this message has finished.
        let _done;
        let verdict = match what {
            Outgoing::Request => self.inner.faults.request_verdict(peer.addr).await,
            Outgoing::OneWay => self.inner.faults.outgoing(peer.addr),
        };
        match verdict {
            Verdict::Pass => {}
            Verdict::Cut => match what {
                // Only a one-way message meets a cut link here: it is lost.
                Outgoing::OneWay => {
                    self.inner.faults.count_cut_loss();
                    return Ok(Vec::new());
                }
                Outgoing::Request => std::future::pending::<()>().await,
            },
            Verdict::Drop => match what {
                // A lost request looks like a silent peer: the caller's deadline fires.
                Outgoing::Request => std::future::pending::<()>().await,
                Outgoing::OneWay => return Ok(Vec::new()),
            },
            Verdict::Delay(delay) => tokio::time::sleep(delay).await,
            Verdict::Hold { go, done } => {
                _done = done;
                // An error means the hooks were dropped with the endpoint: send anyway.
                let _ = go.await;
            }
        }
        let answered = self
            .send_with_redial(peer, message, deadline, what, gate)
            .await;
        if answered.is_ok()
            && matches!(what, Outgoing::Request)
            && self.inner.faults.duplicate(peer.addr)
        {
            // The duplicate of bytes already written: not gated again, its answer dropped.
            let _ = self
                .send_with_redial(peer, message, deadline, what, None)
                .await;
        }
        answered
    }

    /// Sends once; if a reused connection turns out to be dead before the whole message was
    /// written (so the peer cannot have processed it), dials again and sends once more, asking
    /// the gate again. Once the whole message is written it is never sent again.
    async fn send_with_redial(
        &self,
        peer: &Peer,
        message: &Message<'_>,
        deadline: Instant,
        what: &Outgoing,
        gate: Option<WriteGate<'_>>,
    ) -> Result<Vec<u8>, TransportError> {
        let (conn, principal, reused) = self
            .connection(peer.addr, peer.expect.as_ref(), deadline)
            .await?;
        check_expected(peer, &principal)?;
        let heard = frames_heard(&conn);
        let result = self
            .exchange(&conn, peer.addr, message, deadline, what, gate)
            .await;
        if let Err(Attempt::Frame(FrameError::Timeout { .. })) = &result
            && frames_heard(&conn) == heard
        {
            // Not one frame from the peer while the request waited, not even the acknowledgement
            // a live QUIC peer sends within its ack delay: the connection is dead (the peer
            // restarted at its address and has no keys for it, say) and would stay in use until
            // its idle timeout, every request on it timing out. The next message dials afresh.
            tracing::debug!(peer = %peer.addr, "no frame from the peer during a request; the next message dials afresh");
            // Closed, not only forgotten: a peer that is there after all frees its slot (it
            // counts connections per peer) instead of holding it until the idle timeout.
            conn.close(quinn::VarInt::from_u32(0), b"silent through a request");
            self.forget_connection(peer.addr).await;
        }
        let result = match result {
            Err(Attempt::Stale(reason)) if reused => {
                tracing::debug!(peer = %peer.addr, %reason, "connection was stale; dialling again");
                self.forget_connection(peer.addr).await;
                let (conn, principal, _) = self
                    .connection(peer.addr, peer.expect.as_ref(), deadline)
                    .await?;
                check_expected(peer, &principal)?;
                self.exchange(&conn, peer.addr, message, deadline, what, gate)
                    .await
            }
            result => result,
        };
        if let Err(Attempt::Failed(TransportError::ResetAfterWrite { .. })) = &result {
            // The connection is dead: the next message dials afresh.
            self.forget_connection(peer.addr).await;
        }
        result.map_err(|a| a.into_error(peer.addr))
    }

    async fn exchange(
        &self,
        conn: &Connection,
        addr: SocketAddr,
        message: &Message<'_>,
        deadline: Instant,
        what: &Outgoing,
        gate: Option<WriteGate<'_>>,
    ) -> Result<Vec<u8>, Attempt> {
        // In the framing this connection negotiated (decision 0240): a mesh/1 peer gets the
        // header without its version, or nothing when the body is newer than mesh/1 carries.
        let bytes = frame::for_framing(
            message.bytes,
            message.kind,
            message.version,
            crate::version::framing_of(conn),
            &addr.to_string(),
        )
        .map_err(|e| {
            Attempt::Failed(TransportError::Refused {
                addr,
                reason: e.to_string(),
            })
        })?;
        match what {
            Outgoing::Request => {
                self.exchange_request(conn, addr, bytes, deadline, gate)
                    .await
            }
            Outgoing::OneWay => {
                let max = self.inner.config.frame_bytes_max();
                let left = deadline.saturating_duration_since(Instant::now());
                let mut send = conn.open_uni().await.map_err(Attempt::Stale)?;
                frame::write_frame(&mut send, bytes, max, left)
                    .await
                    .map_err(Attempt::from_frame)?;
                match send.stopped().await {
                    Ok(None) => Ok(Vec::new()),
                    Ok(Some(code)) => Err(Attempt::Failed(TransportError::Refused {
                        addr,
                        reason: crate::serve::stop_reason(code),
                    })),
                    Err(quinn::StoppedError::ConnectionLost(source)) => Err(Attempt::after_write(
                        addr,
                        FrameError::ConnectionLost {
                            action: "waiting for the acknowledgement",
                            source,
                        },
                    )),
                    Err(e) => Err(Attempt::Failed(TransportError::Unreachable {
                        addr,
                        reason: e.to_string(),
                    })),
                }
            }
        }
    }

    async fn exchange_request(
        &self,
        conn: &Connection,
        addr: SocketAddr,
        bytes: &[u8],
        deadline: Instant,
        gate: Option<WriteGate<'_>>,
    ) -> Result<Vec<u8>, Attempt> {
        let max = self.inner.config.frame_bytes_max();
        let left = deadline.saturating_duration_since(Instant::now());
        let (send, mut recv) = conn.open_bi().await.map_err(Attempt::Stale)?;
        let mut send = ResetUnlessAnswered {
            send,
            answered: false,
        };
        // The last check before the first byte (G3): everything slow happened before it.
        let (write_left, write_by) = match gate {
            None => (left, None),
            Some(gate) => {
                let allowed = gate().map_err(|reason| gated(addr, reason))?;
                let allowed = allowed.min(left);
                (allowed, Some(Instant::now() + allowed))
            }
        };
        match frame::write_frame(&mut send.send, bytes, max, write_left).await {
            Ok(()) => {}
            Err(FrameError::Timeout { .. }) if write_by.is_some() => {
                // Nothing more of it may leave: unsent and unacknowledged data is dropped (the
                // guard resets the stream).
                return Err(gated(
                    addr,
                    "the write did not finish inside its gate".into(),
                ));
            }
            Err(e @ FrameError::Stream { .. }) => {
                // The peer stopped reading mid-frame (a frame over its limit for this sender,
                // say) and answers why: that refusal, not a lost write, is the outcome.
                let left = deadline.saturating_duration_since(Instant::now());
                return Err(match frame::read_frame(&mut recv, max, left).await {
                    Ok(answer) => match frame::decode_response(&answer) {
                        Ok(Err(refused)) => Attempt::Failed(TransportError::Refused {
                            addr,
                            reason: refused.reason,
                        }),
                        _ => Attempt::from_frame(e),
                    },
                    Err(_) => Attempt::from_frame(e),
                });
            }
            Err(e) => return Err(Attempt::from_frame(e)),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let read = frame::read_frame(&mut recv, max, left);
        tokio::pin!(read);
        let answer = match (write_by, gate) {
            (Some(mut write_by), Some(gate)) => loop {
                tokio::select! {
                    answer = &mut read => break answer,
                    () = tokio::time::sleep_until(write_by) => {
                        // The gate's time ran out with no answer yet: it is asked again (a lease
                        // renewed meanwhile lets the request's retransmissions go on, decision
                        // 0221); closed, nothing more of the request may leave.
                        match gate() {
                            Ok(more) if !more.is_zero() => write_by = Instant::now() + more,
                            Ok(_) | Err(_) => {
                                let _ = send.send.reset(quinn::VarInt::from_u32(0));
                                match read.await {
                                    // The peer had not the whole request when the reset came,
                                    // and says so: no handler ran, as if the gate had refused
                                    // the write, and the caller may send it under a later gate
                                    // (decision 0319). Had it had all of it, QUIC ignores the
                                    // reset and its handler's answer comes as usual.
                                    Err(FrameError::Reset { code })
                                        if code == u64::from(crate::serve::reset_unread) =>
                                    {
                                        return Err(gated(
                                            addr,
                                            "the write gate closed before the peer had the whole request, and the peer handled none of it".into(),
                                        ));
                                    }
                                    other => break other,
                                }
                            }
                        }
                    }
                }
            },
            _ => read.await,
        };
        let answer = answer.map_err(|e| Attempt::after_write(addr, e))?;
        // The peer read the whole request: nothing of it is left to retransmit.
        send.answered = true;
        match frame::decode_response(&answer) {
            Ok(Ok(body)) => Ok(body),
            Ok(Err(refused)) => Err(Attempt::Failed(TransportError::Refused {
                addr,
                reason: refused.reason,
            })),
            Err(e) => Err(Attempt::Failed(TransportError::BadAnswer {
                addr,
                reason: e.to_string(),
            })),
        }
    }

    fn slot(&self, addr: SocketAddr) -> Result<Arc<PeerSlot>, TransportError> {
        let mut peers = self
            .inner
            .peers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(slot) = peers.get(&addr) {
            return Ok(slot.clone());
        }
        if peers.len() >= peers_max {
            // A slot in use (locked) or with a live connection stays; idle dead ones go.
            peers.retain(|_, slot| match slot.state.try_lock() {
                Ok(state) => state.conn.is_some(),
                Err(_) => true,
            });
            if peers.len() >= peers_max {
                return Err(TransportError::TooManyPeers { max: peers_max });
            }
        }
        let slot = Arc::new(PeerSlot::default());
        peers.insert(addr, slot.clone());
        Ok(slot)
    }

    /// The live connection to `peer` (dialled if needed) once the expected principal answers
    /// there; the bool says it was reused. For the streamed requests of `stream.rs`.
    pub(crate) async fn connection_to(
        &self,
        peer: &Peer,
        deadline: Instant,
    ) -> Result<(Connection, bool), TransportError> {
        let (conn, principal, reused) = self
            .connection(peer.addr, peer.expect.as_ref(), deadline)
            .await?;
        check_expected(peer, &principal)?;
        Ok((conn, reused))
    }

    /// Drops the connection to `addr`: the next message dials afresh.
    pub(crate) async fn forget(&self, addr: SocketAddr) {
        self.forget_connection(addr).await;
    }

    async fn forget_connection(&self, addr: SocketAddr) {
        let Ok(slot) = self.slot(addr) else { return };
        // Bounded: if a dial holds the slot, that dial will replace the connection anyway.
        let wait = Duration::from_millis(close_wait_ms_max);
        if let Ok(mut state) = tokio::time::timeout(wait, slot.state.lock()).await {
            state.conn = None;
        }
    }

    /// The live connection to `addr`: the one this endpoint dialled, else one the peer there (or
    /// `expect`, when it dialled from elsewhere) opened to this endpoint and that carries
    /// messages both ways (decision 0316), else a new dial. The bool says it was reused.
    async fn connection(
        &self,
        addr: SocketAddr,
        expect: Option<&Principal>,
        deadline: Instant,
    ) -> Result<(Connection, Principal, bool), TransportError> {
        let slot = self.slot(addr)?;
        let mut state = slot.state.lock().await;
        if let Some(kept) = &state.conn {
            if kept.conn.close_reason().is_none() {
                // A TLS check happens at the handshake only: a kept connection is dropped once
                // the peer's certificate has ended, and the dial below meets the peer's current
                // one (renewed, or refused naming it).
                let now = time::OffsetDateTime::now_utc();
                match kept.cert.as_ref().and_then(|c| crate::trust::ended(c, now)) {
                    None => return Ok((kept.conn.clone(), kept.principal.clone(), true)),
                    Some(refusal) => close_untrusted(&kept.conn, &refusal.to_string()),
                }
            }
            state.conn = None;
        }
        if let Some(shared) = self.inner.open.shared(addr, expect) {
            // The peer's certificate was verified at its handshake, as a dial's would be; an
            // ended one closes the connection and the dial below meets the current one.
            let now = time::OffsetDateTime::now_utc();
            match shared
                .cert
                .as_ref()
                .and_then(|c| crate::trust::ended(c, now))
            {
                None => return Ok((shared.conn, shared.principal, true)),
                Some(refusal) => close_untrusted(&shared.conn, &refusal.to_string()),
            }
        }
        match dial_gate(state.retry_at, Instant::now(), deadline) {
            DialGate::Now => {}
            // Waiting out the backoff (holding only this peer's lock) spaces dials to a dead
            // peer without failing calls made just after it came back.
            DialGate::After(retry_at) => tokio::time::sleep_until(retry_at).await,
            DialGate::TooLate { wait } => {
                return Err(TransportError::Unreachable {
                    addr,
                    reason: format!(
                        "{} dial attempts failed; the next is allowed in {} ms, after this call's deadline",
                        state.failures,
                        wait.as_millis()
                    ),
                });
            }
        }
        match self.dial(addr, expect, deadline).await {
            Ok((conn, principal)) => {
                state.failures = 0;
                state.retry_at = None;
                state.conn = Some(Kept {
                    conn: conn.clone(),
                    principal: principal.clone(),
                    cert: crate::serve::peer_cert(&conn),
                });
                Ok((conn, principal, false))
            }
            Err(e) => {
                state.failures = state.failures.saturating_add(1);
                let max = self.inner.config.dial_backoff_max();
                state.retry_at = Some(Instant::now() + backoff(state.failures, max));
                Err(e)
            }
        }
    }

    /// Dials `addr`; a host expected there gets the transport of `tls::Side::DiallingHost`.
    async fn dial(
        &self,
        addr: SocketAddr,
        expect: Option<&Principal>,
        deadline: Instant,
    ) -> Result<(Connection, Principal), TransportError> {
        // Before any verification: a trust change from here on is seen by `track` below.
        let since = self.inner.open.since();
        let client = match expect {
            Some(Principal::Host(_)) => self.inner.client_to_hosts.clone(),
            _ => self.inner.client.clone(),
        };
        let connecting = self
            .inner
            .quinn
            .connect_with(client, addr, server_name)
            .map_err(|e| TransportError::Unreachable {
                addr,
                reason: e.to_string(),
            })?;
        let conn = match tokio::time::timeout_at(deadline, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(connection_error(addr, e)),
            Err(_) => {
                return Err(TransportError::Unreachable {
                    addr,
                    reason: "no handshake before the deadline".to_string(),
                });
            }
        };
        self.inner.counters.dialled();
        self.inner.faults.before_track().await;
        self.inner
            .open
            .track(&conn, Side::Dialled, since)
            .map_err(|reason| TransportError::HandshakeRefused { addr, reason })?;
        let (principal, role) = crate::serve::peer_principal(&conn)
            .map_err(|reason| TransportError::HandshakeRefused { addr, reason })?;
        tracing::debug!(peer = %addr, %principal, "connected");
        self.serve_dialled(&conn, addr, &principal, role);
        Ok((conn, principal))
    }

    /// Serves what the peer sends back over a connection this endpoint dialled, when the
    /// connection carries messages both ways (a host's to a replica or a replica's to a host,
    /// decision 0316) and this endpoint serves at all. Its stream credit started at none.
    fn serve_dialled(
        &self,
        conn: &Connection,
        addr: SocketAddr,
        principal: &Principal,
        role: Option<crate::principal::Role>,
    ) {
        if !crate::open::shares_connections(&self.inner.principal, principal) {
            return;
        }
        let serving = self
            .inner
            .serving
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
            .and_then(Weak::upgrade);
        // None once the endpoint closed (its accept loop ended) or when it never served.
        let Some(context) = serving else { return };
        tokio::spawn(crate::serve::serve_connection(
            conn.clone(),
            addr,
            principal.clone(),
            role,
            0,
            ServeContext::clone(&context),
        ));
    }
}

/// Whether a dial may start now, after a wait, or not before the caller's deadline.
#[derive(Debug, PartialEq, Eq)]
enum DialGate {
    Now,
    After(Instant),
    TooLate { wait: Duration },
}

fn dial_gate(retry_at: Option<Instant>, now: Instant, deadline: Instant) -> DialGate {
    match retry_at {
        Some(at) if at >= deadline => DialGate::TooLate {
            wait: at.saturating_duration_since(now),
        },
        Some(at) if at > now => DialGate::After(at),
        _ => DialGate::Now,
    }
}

/// Wait after the `failures`-th failed dial in a row: doubling from the first wait, capped.
fn backoff(failures: u32, max: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(20);
    let wait = Duration::from_millis(dial_backoff_first_ms.saturating_mul(1 << doublings));
    wait.min(max)
}

fn check_expected(peer: &Peer, found: &Principal) -> Result<(), TransportError> {
    match &peer.expect {
        Some(expected) if expected != found => Err(TransportError::WrongPeer {
            addr: peer.addr,
            expected: expected.clone(),
            found: found.clone(),
        }),
        _ => Ok(()),
    }
}

/// A failed attempt: either the connection was stale (safe to dial again and retry once) or a
/// final error.
enum Attempt {
    Stale(ConnectionError),
    Failed(TransportError),
    Frame(FrameError),
}

fn gated(addr: SocketAddr, reason: String) -> Attempt {
    Attempt::Failed(TransportError::Gated { addr, reason })
}

impl Attempt {
    /// A failure once the whole message was written: a reset connection is final, since the
    /// peer may have processed the message before it lost the connection.
    fn after_write(addr: SocketAddr, e: FrameError) -> Attempt {
        match e {
            FrameError::ConnectionLost {
                source: ConnectionError::Reset,
                ..
            } => Attempt::Failed(TransportError::ResetAfterWrite { addr }),
            other => Attempt::from_frame(other),
        }
    }

    fn from_frame(e: FrameError) -> Attempt {
        match e {
            FrameError::ConnectionLost {
                source: ConnectionError::Reset,
                ..
            } => Attempt::Stale(ConnectionError::Reset),
            other => Attempt::Frame(other),
        }
    }

    fn into_error(self, addr: SocketAddr) -> TransportError {
        match self {
            Attempt::Stale(e) => connection_error(addr, e),
            Attempt::Failed(e) => e,
            Attempt::Frame(FrameError::TooLarge { len, max }) => {
                TransportError::FrameTooLarge { len, max }
            }
            Attempt::Frame(FrameError::ConnectionLost { source, .. }) => {
                connection_error(addr, source)
            }
            Attempt::Frame(FrameError::Timeout { after_ms }) => {
                TransportError::Timeout { addr, after_ms }
            }
            Attempt::Frame(e @ (FrameError::CutShort { .. } | FrameError::Codec(_))) => {
                TransportError::BadAnswer {
                    addr,
                    reason: e.to_string(),
                }
            }
            Attempt::Frame(other) => TransportError::Unreachable {
                addr,
                reason: other.to_string(),
            },
        }
    }
}

/// TLS alerts travel as QUIC CRYPTO_ERROR codes 0x100..=0x1ff.
fn is_crypto_code(code: quinn::TransportErrorCode) -> bool {
    (0x100..=0x1ff).contains(&u64::from(code))
}

/// How many frames the peer has sent on `conn` that this side decrypted and handled.
fn frames_heard(conn: &Connection) -> u64 {
    let f = conn.stats().frame_rx;
    f.acks + f.stream + f.ping + f.max_data + f.max_stream_data + f.reset_stream + f.stop_sending
}

fn connection_error(addr: SocketAddr, e: ConnectionError) -> TransportError {
    match &e {
        ConnectionError::TransportError(t) if is_crypto_code(t.code) => {
            TransportError::HandshakeRefused {
                addr,
                reason: crate::trust::handshake_reason(&e.to_string()),
            }
        }
        ConnectionError::ConnectionClosed(close) if is_crypto_code(close.error_code) => {
            TransportError::HandshakeRefused {
                addr,
                reason: crate::trust::handshake_reason(&e.to_string()),
            }
        }
        _ => TransportError::Unreachable {
            addr,
            reason: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_first_wait_and_stops_at_the_cap() {
        // Dialling: bounded exponential backoff.
        let max = Duration::from_millis(2000);
        let waits: Vec<u128> = (1..=8).map(|n| backoff(n, max).as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff(u32::MAX, max), max);
    }

    #[test]
    fn dial_waits_out_the_backoff_only_if_the_deadline_allows() {
        // Dialling: a call waits out the backoff only within its own deadline.
        let now = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(dial_gate(None, now, now + ms(10)), DialGate::Now);
        assert_eq!(
            dial_gate(Some(now - ms(1)), now, now + ms(10)),
            DialGate::Now
        );
        assert_eq!(
            dial_gate(Some(now + ms(5)), now, now + ms(10)),
            DialGate::After(now + ms(5))
        );
        assert_eq!(
            dial_gate(Some(now + ms(50)), now, now + ms(10)),
            DialGate::TooLate { wait: ms(50) }
        );
    }

    #[test]
    fn udp_buffers_are_widened_up_to_what_the_kernel_allows() {
        // Limits and load: a replica's socket must not drop datagrams at its default 208 KiB
        // (decision 0252). Linux reports twice the size it granted, capped by rmem_max/wmem_max.
        let cap = |name: &str| -> usize {
            std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(socket_buffer_bytes)
        };
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let before = socket2::SockRef::from(&socket)
            .recv_buffer_size()
            .expect("read rcvbuf");
        widen_buffers(&socket, socket.local_addr().expect("addr"));
        let sock = socket2::SockRef::from(&socket);
        let recv = sock.recv_buffer_size().expect("read rcvbuf");
        let send = sock.send_buffer_size().expect("read sndbuf");
        let want_recv = socket_buffer_bytes.min(cap("rmem_max"));
        let want_send = socket_buffer_bytes.min(cap("wmem_max"));
        assert!(
            recv >= want_recv && recv > before,
            "receive buffer {recv} (was {before}), asked {want_recv}"
        );
        assert!(send >= want_send, "send buffer {send}, asked {want_send}");
    }
}

/// A request's send stream, reset when dropped before its answer came: a request given up (its
/// timeout, a failed read, its future dropped) is given up on the wire too. Left to quinn, a
/// dropped stream is finished, and bytes written under the gate's time but lost on the way would
/// go on being retransmitted, and could reach a host after a newer leader was heard from (G3).
struct ResetUnlessAnswered {
    send: quinn::SendStream,
    answered: bool,
}

impl Drop for ResetUnlessAnswered {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.send.reset(quinn::VarInt::from_u32(0));
        }
    }
}
