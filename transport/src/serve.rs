//! The serving half of an endpoint: accepts connections, reads frames, checks every frame
//! against the writers table before the handler sees it, and keeps a connection serving its
//! other streams whatever one stream sends.

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use quinn::{Connection, RecvStream, SendStream, VarInt};
use tokio::sync::Semaphore;

use crate::admit::{HandshakeSlot, Start};
use crate::config::CheckedConfig;
use crate::faults::Faults;
use crate::frame::{self, FrameError, Header, Refused, Response};
use crate::principal::{Principal, Role};
use crate::writers::{MessageKind, Permissions, permissions_for};

/// A boxed future, so a handler can be a trait object without extra crates.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the application does with messages the writers table let through.
pub trait Handler: Send + Sync + 'static {
    /// Answers a request; `Err(reason)` goes back to the caller as a refusal.
    fn request(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>>;

    /// Answers a request whose caller asked for a streamed answer (decision 0190): chunks offered
    /// to `sink` reach the caller while this runs, then the answer. By default one answer only.
    fn request_streamed(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
        sink: crate::stream::Sink,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        drop(sink);
        self.request(from, kind, body)
    }

    /// Answers a request as [`Handler::request`] (`sink` `None`) or [`Handler::request_streamed`]
    /// do, with the role the sender's certificate states (an operator's, decision 0295; `None`
    /// when it states none). The transport only reads the role; what it allows is the handler's
    /// decision. By default the role is not read: only a handler that serves operators needs it.
    fn request_with_role(
        &self,
        from: Principal,
        role: Option<Role>,
        kind: MessageKind,
        body: Vec<u8>,
        sink: Option<crate::stream::Sink>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        let _ = role;
        match sink {
            Some(sink) => self.request_streamed(from, kind, body, sink),
            None => self.request(from, kind, body),
        }
    }

    /// Takes a one-way message; nothing goes back.
    fn one_way(&self, from: Principal, kind: MessageKind, body: Vec<u8>) -> BoxFuture<'_, ()>;

    /// Hears that a frame from `from` was refused before any handler saw it, as over the frame
    /// limit its certificate allows (`reason` says which): a handler that names refused peers
    /// (the leader names hosts whose reports it refuses, decision 0299) notes it. By default
    /// nothing: the transport has counted and logged it.
    fn frame_refused(&self, from: &Principal, reason: &str) {
        let _ = (from, reason);
    }
}

/// Stream stop code: the frame was over the sender's limit (`frame_bytes_max`, or
/// `report_frame_bytes_max` for a host).
pub const stop_frame_too_large: u32 = 1;
/// Stream stop code: the frame could not be read or decoded.
pub const stop_bad_frame: u32 = 2;
/// Stream stop code: the writers table refused the message.
pub const stop_denied: u32 = 3;
/// Stream stop code: the message's body version is one this endpoint does not speak (decision
/// 0240); a request's answer and the receiver's log name both versions.
pub const stop_version: u32 = 6;
/// Stream reset code of an answer: the sender reset its request before the whole frame arrived,
/// so no handler ran and nothing of it was done (decision 0319). A sender that withdrew a
/// request when its write gate closed may send it again under a later gate; a peer of an older
/// release reads the reset as a lost answer, as it read the refusal it got before.
pub const reset_unread: u32 = 7;
/// Connection close code: the peer's certificate is no longer trusted (revoked, or its CA left
/// the trusted set); the close reason says which certificate and what to do.
pub const close_untrusted: u32 = 4;

/// Says what a stop code from a peer means.
pub fn stop_reason(code: VarInt) -> String {
    let code = code.into_inner();
    let what = match code {
        c if c == u64::from(stop_frame_too_large) => {
            "frame over the peer's limit for this sender (frame_bytes_max, or report_frame_bytes_max for a host)"
        }
        c if c == u64::from(stop_bad_frame) => "bad frame",
        c if c == u64::from(stop_denied) => "denied by the writers table",
        c if c == u64::from(stop_version) => {
            "a message version the peer does not speak; its log names both versions"
        }
        _ => "unknown reason",
    };
    format!("peer stopped the stream with code {code} ({what})")
}

#[derive(Default, Debug)]
pub(crate) struct Counters {
    denied: AtomicU64,
    bad_frames: AtomicU64,
    handshakes_refused: AtomicU64,
    requests_served: AtomicU64,
    one_ways_served: AtomicU64,
    dials: AtomicU64,
    pub(crate) conns: crate::admit::ConnCounters,
}

/// A snapshot of an endpoint's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Messages refused by the writers table (G10).
    pub denied: u64,
    /// Streams whose frame was too large, cut short, late or undecodable.
    pub bad_frames: u64,
    /// Incoming handshakes that failed (bad or missing certificate, wrong CA, expired).
    pub handshakes_refused: u64,
    /// Requests handed to the handler.
    pub requests_served: u64,
    /// One-way messages handed to the handler.
    pub one_ways_served: u64,
    /// Outgoing connections established.
    pub dials: u64,
    /// Handshakes and connections in progress and open, and those refused by a cap (decision
    /// 0300).
    pub conns: crate::admit::ConnCounts,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Counts {
        Counts {
            denied: self.denied.load(Ordering::Relaxed),
            bad_frames: self.bad_frames.load(Ordering::Relaxed),
            handshakes_refused: self.handshakes_refused.load(Ordering::Relaxed),
            requests_served: self.requests_served.load(Ordering::Relaxed),
            one_ways_served: self.one_ways_served.load(Ordering::Relaxed),
            dials: self.dials.load(Ordering::Relaxed),
            conns: self.conns.snapshot(),
        }
    }

    pub(crate) fn dialled(&self) {
        self.dials.fetch_add(1, Ordering::Relaxed);
    }
}

/// Everything the serving tasks share.
#[derive(Clone)]
pub(crate) struct ServeContext {
    pub(crate) config: CheckedConfig,
    pub(crate) counters: Arc<Counters>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) handler: Arc<dyn Handler>,
    pub(crate) open: Arc<crate::open::OpenConns>,
    /// Which connections are let in (decision 0300).
    pub(crate) admission: Arc<crate::admit::Admission>,
    /// This endpoint's own principal, named in version refusals.
    pub(crate) principal: Principal,
    /// Which warnings about which peer are due (at most one a peer and kind per interval).
    pub(crate) warned: Arc<crate::ratelog::LogEvery<(Principal, &'static str)>>,
    /// Refused handshakes logged at most once per interval per source IP (no principal yet).
    pub(crate) warned_handshakes: Arc<crate::ratelog::LogEvery<std::net::IpAddr>>,
    /// Where connections from the addresses it names are handshaken, driven and served
    /// (decision 0338); shared with the endpoint, so it may be set before or after serving.
    pub(crate) preferred: Arc<Mutex<Option<Preferred>>>,
    /// The runtime serving began on: every connection not preferred runs here, wherever the
    /// accept loop itself runs.
    pub(crate) serving: tokio::runtime::Handle,
}

/// Connections accepted from `peers` (a replica's fellow replicas, by the address each dials
/// from) run on `runtime` instead of the runtime serving began on: their handshake, their QUIC
/// driver and their requests. A follower answers its leader there even when the serving runtime
/// is busy with the fleet's handshakes and reports (decision 0338). Only where a connection is
/// run: who the peer is still comes from its certificate, and an address that is not a peer's
/// is served as before.
#[derive(Clone)]
pub(crate) struct Preferred {
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) peers: HashSet<SocketAddr>,
}

impl ServeContext {
    /// The runtime a connection from `addr` runs on, if not the serving one.
    fn preferred_for(&self, addr: SocketAddr) -> Option<tokio::runtime::Handle> {
        let preferred = self
            .preferred
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let p = preferred.as_ref()?;
        p.peers.contains(&addr).then(|| p.runtime.clone())
    }
}

/// The certificate a connected peer presented, as refusals name it.
pub(crate) fn peer_cert(conn: &Connection) -> Option<crate::trust::CertInfo> {
    let chain = conn
        .peer_identity()?
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    crate::trust::CertInfo::from_der(chain.first()?).ok()
}

/// The principal named by the certificate a connected peer presented, and the role it states.
pub(crate) fn peer_principal(conn: &Connection) -> Result<(Principal, Option<Role>), String> {
    let identity = conn
        .peer_identity()
        .ok_or_else(|| "peer presented no certificate".to_string())?;
    let chain = identity
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .map_err(|_| "peer identity is not an X.509 chain".to_string())?;
    let leaf = chain
        .first()
        .ok_or_else(|| "peer presented an empty chain".to_string())?;
    Principal::from_certificate_with_role(leaf).map_err(|e| e.to_string())
}

/// Accepts connections as the admission table allows (decision 0300): a new `Incoming` takes a
/// handshake slot, is answered with a Retry, or is refused; a verified connection takes an
/// established slot or is closed naming the cap.
/// Owns the endpoint's serving context (the endpoint keeps only a weak reference to it): it is
/// dropped when the endpoint closes and this loop ends.
pub(crate) async fn accept_loop(endpoint: quinn::Endpoint, context: Arc<ServeContext>) {
    while let Some(incoming) = endpoint.accept().await {
        let addr = incoming.remote_address();
        if context.faults.is_cut_off(addr) {
            incoming.ignore();
            continue;
        }
        let validated = incoming.remote_address_validated();
        let slot = match context.admission.incoming(addr, validated) {
            Start::Handshake(slot) => slot,
            Start::Retry => {
                // Unvalidated means a Retry is allowed (quinn's `Incoming` docs); if not, refuse.
                if let Err(e) = incoming.retry() {
                    e.into_incoming().refuse();
                }
                continue;
            }
            Start::Refuse => {
                incoming.refuse();
                continue;
            }
        };
        let task = handshake(incoming, addr, slot, ServeContext::clone(&context));
        // quinn drives a connection on the runtime that accepts it (its driver is spawned
        // where the handshake is awaited), and the requests it carries are served there too.
        match context.preferred_for(addr) {
            Some(runtime) => {
                runtime.spawn(task);
            }
            None => {
                context.serving.spawn(task);
            }
        }
    }
}

async fn handshake(
    incoming: quinn::Incoming,
    addr: SocketAddr,
    slot: HandshakeSlot,
    context: ServeContext,
) {
    // Bounded by its own deadline, apart from requests: its slot is not an established one.
    let timeout = context.admission.handshake_deadline();
    // Before any verification: a trust change from here on is seen by `track` below.
    let since = context.open.since();
    let handshaken = tokio::time::timeout(timeout, incoming).await;
    drop(slot);
    let conn = match handshaken {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            let reason = crate::trust::handshake_reason(&e.to_string());
            return handshake_refused(&context, addr, &reason);
        }
        Err(_) => return handshake_refused(&context, addr, "no handshake before the deadline"),
    };
    let (principal, role) = match peer_principal(&conn) {
        Ok(named) => named,
        Err(reason) => {
            conn.close(VarInt::from_u32(stop_denied), b"no principal");
            return handshake_refused(&context, addr, &reason);
        }
    };
    // Held while the connection is served; refused, the close reason names the cap.
    let _slot = match context.admission.establish(&principal, role, addr) {
        Ok(slot) => slot,
        Err(over) => return crate::admit::close_refused(&conn, &over),
    };
    tracing::debug!(peer = %addr, %principal, ?role, "accepted connection");
    context.faults.before_track().await;
    if let Err(reason) = context
        .open
        .track(&conn, crate::open::Side::Accepted, since)
    {
        return handshake_refused(&context, addr, &reason);
    }
    if crate::open::shares_connections(&context.principal, &principal) {
        // This side sends back over it rather than dialling a second one (decision 0316).
        context.open.share(&conn, &principal, addr);
    }
    let initial = crate::tls::streams_unproven.min(context.config.streams_per_connection_max());
    serve_connection(conn, addr, principal, role, initial, context).await;
}

fn handshake_refused(context: &ServeContext, addr: SocketAddr, reason: &str) {
    context
        .counters
        .handshakes_refused
        .fetch_add(1, Ordering::Relaxed);
    let due = context
        .warned_handshakes
        .due(addr.ip(), std::time::Instant::now());
    if let Some(held_back) = due {
        tracing::warn!(peer = %addr, %reason, held_back, "TLS handshake refused");
    }
}

/// Serves the streams `principal` opens on `conn`, which started with `initial` stream credit
/// (`streams_unproven` on an accepted connection, none on a dialled one, see
/// `tls::transport_config`). A dialled connection is served only when it is shared (decision
/// 0316): the permissions are those of the certificate the peer presented at the handshake,
/// whichever side dialled.
pub(crate) async fn serve_connection(
    conn: Connection,
    addr: SocketAddr,
    principal: Principal,
    role: Option<Role>,
    initial: u32,
    context: ServeContext,
) {
    let permissions = Arc::new(permissions_for(&principal));
    let framing = crate::version::framing_of(&conn);
    // The peer is known now: replicas and operators get the full stream credit, hosts fewer.
    let streams = crate::tls::streams_for(&principal, &context.config);
    if streams != initial {
        conn.set_max_concurrent_bi_streams(VarInt::from_u32(streams));
        conn.set_max_concurrent_uni_streams(VarInt::from_u32(streams));
    }
    // Bounds requests in flight on this connection, counting handlers still running after
    // their stream's credit went back to the peer.
    let in_flight = Arc::new(Semaphore::new(streams as usize));
    let cert = peer_cert(&conn);
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        tokio::select! {
            bi = conn.accept_bi() => match bi {
                Ok(_) if ended(cert.as_ref(), &conn) => return,
                Ok((send, recv)) => {
                    let job = serve_request(send, recv, addr, framing, permissions.clone(), role, context.clone());
                    tokio::spawn(async move { job.await; drop(permit) });
                }
                Err(e) => return closed(addr, &e),
            },
            uni = conn.accept_uni() => match uni {
                Ok(_) if ended(cert.as_ref(), &conn) => return,
                Ok(recv) => {
                    let job = serve_one_way(recv, addr, framing, permissions.clone(), context.clone());
                    tokio::spawn(async move { job.await; drop(permit) });
                }
                Err(e) => return closed(addr, &e),
            },
        }
    }
}

/// Whether the peer's certificate has ended while its connection was kept: then the connection
/// is closed with the refusal naming it (decision 0297), and the request just opened is not
/// served. Checked at each request, so no timer runs per connection.
fn ended(cert: Option<&crate::trust::CertInfo>, conn: &Connection) -> bool {
    let now = time::OffsetDateTime::now_utc();
    let Some(refusal) = cert.and_then(|c| crate::trust::ended(c, now)) else {
        return false;
    };
    crate::open::close_untrusted(conn, &refusal.to_string());
    true
}

fn closed(addr: SocketAddr, e: &quinn::ConnectionError) {
    tracing::debug!(peer = %addr, reason = %e, "connection ended");
}

/// Reads and checks one frame: the header if the writers table allows it and its body version
/// is one this endpoint speaks, else the refusal.
async fn read_checked(
    recv: &mut RecvStream,
    addr: SocketAddr,
    framing: crate::version::Framing,
    permissions: &Permissions,
    context: &ServeContext,
) -> Result<Header, (u32, String)> {
    // From the peer's certificate, before any byte of the frame: a host's frames are small.
    let max = permissions.frame_bytes_max(context.config.frame_bytes_max());
    let timeout = context.config.request_timeout();
    let header = match frame::read_frame(recv, max, timeout).await {
        Ok(bytes) => frame::decode_header_framed(&bytes, framing),
        Err(e) => Err(e),
    };
    let principal = permissions.principal();
    let header = match header {
        Ok(header) => header,
        // The sender withdrew it (its write gate closed, say): not a bad frame, and nothing to
        // answer but that no byte of it was acted on.
        Err(FrameError::Reset { code }) => {
            tracing::debug!(peer = %addr, principal = %permissions.principal(), code, "request withdrawn by its sender before it arrived whole");
            return Err((reset_unread, "withdrawn by its sender".into()));
        }
        Err(e) => {
            context.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
            let (code, reason) = match e {
                FrameError::TooLarge { len, max } => {
                    let reason = permissions.frame_too_large(len, max);
                    context.handler.frame_refused(principal, &reason);
                    (stop_frame_too_large, reason)
                }
                e => (stop_bad_frame, format!("bad frame from {principal}: {e}")),
            };
            let due = context
                .warned
                .due((principal.clone(), "bad frame"), Instant::now());
            if let Some(held_back) = due {
                tracing::warn!(peer = %addr, %principal, %reason, held_back, "bad frame refused");
            }
            return Err((code, reason));
        }
    };
    if let Err(denied) = permissions.check(&header.kind) {
        context.counters.denied.fetch_add(1, Ordering::Relaxed);
        let due = context
            .warned
            .due((principal.clone(), "denied"), Instant::now());
        if let Some(held_back) = due {
            tracing::warn!(peer = %addr, reason = %denied, held_back, "message denied by the writers table");
        }
        return Err((stop_denied, denied.to_string()));
    }
    let sender = permissions.principal();
    if let Err(e) = crate::version::check(&header.kind, header.version, sender, &context.principal)
    {
        context.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
        let due = context
            .warned
            .due((sender.clone(), "version"), Instant::now());
        if let Some(held_back) = due {
            tracing::warn!(peer = %addr, reason = %e, held_back, "message version refused");
        }
        return Err((stop_version, e.to_string()));
    }
    Ok(header)
}

async fn serve_request(
    mut send: SendStream,
    mut recv: RecvStream,
    addr: SocketAddr,
    framing: crate::version::Framing,
    permissions: Arc<Permissions>,
    role: Option<Role>,
    context: ServeContext,
) {
    let response: Response = match read_checked(&mut recv, addr, framing, &permissions, &context)
        .await
    {
        Ok(_) if context.faults.is_cut_off(addr) => return stay_silent(&context).await,
        Ok(header)
            if crate::stream::may_stream(&header.kind)
                && crate::stream::asked(&mut recv, context.config.request_timeout()).await =>
        {
            context
                .counters
                .requests_served
                .fetch_add(1, Ordering::Relaxed);
            let from = permissions.principal().clone();
            let max = context.config.frame_bytes_max();
            let (sink, rx) = crate::stream::Sink::open(max);
            let job =
                context
                    .handler
                    .request_with_role(from, role, header.kind, header.body, Some(sink));
            let timeout = context.config.request_timeout();
            match crate::stream::serve(&mut send, addr, max, timeout, rx, job).await {
                Some(response) => response,
                None => return,
            }
        }
        Ok(header) => {
            context
                .counters
                .requests_served
                .fetch_add(1, Ordering::Relaxed);
            let from = permissions.principal().clone();
            let answer = context
                .handler
                .request_with_role(from, role, header.kind, header.body, None)
                .await;
            answer.map_err(|reason| Refused { reason })
        }
        Err((code, _)) if code == reset_unread => {
            // Read as nothing done by a sender of this release, as a lost answer by an older one.
            let _ = send.reset(VarInt::from_u32(reset_unread));
            return;
        }
        Err((code, reason)) => {
            // Tell the sender to stop writing (a large frame may still be arriving), then answer.
            let _ = recv.stop(VarInt::from_u32(code));
            Err(Refused { reason })
        }
    };
    answer(&mut send, addr, &response, &context).await;
}

async fn answer(
    send: &mut SendStream,
    addr: SocketAddr,
    response: &Response,
    context: &ServeContext,
) {
    let max = context.config.frame_bytes_max();
    let timeout = context.config.request_timeout();
    let bytes = frame::encode_response(response).and_then(|bytes| {
        frame::check_len(bytes.len(), max)?;
        Ok(bytes)
    });
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!(peer = %addr, reason = %e, "answer could not be sent");
            let refused: Response = Err(Refused {
                reason: format!("the answer could not be sent: {e}"),
            });
            match frame::encode_response(&refused) {
                Ok(bytes) => bytes,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = frame::write_frame(send, &bytes, max, timeout).await {
        tracing::debug!(peer = %addr, reason = %e, "answer not delivered");
    }
}

async fn serve_one_way(
    mut recv: RecvStream,
    addr: SocketAddr,
    framing: crate::version::Framing,
    permissions: Arc<Permissions>,
    context: ServeContext,
) {
    match read_checked(&mut recv, addr, framing, &permissions, &context).await {
        // Already read and acknowledged by QUIC; the cut can only keep it from the handler.
        Ok(_) if context.faults.is_cut_off(addr) => {}
        Ok(header) => {
            context
                .counters
                .one_ways_served
                .fetch_add(1, Ordering::Relaxed);
            let from = permissions.principal().clone();
            context
                .handler
                .one_way(from, header.kind, header.body)
                .await;
        }
        Err((code, _)) => {
            let _ = recv.stop(VarInt::from_u32(code));
        }
    }
}

/// A cut-off peer gets no answer at all: the stream stays open (not finished, not reset) until the
/// request timeout, as if the packets had been lost.
async fn stay_silent(context: &ServeContext) {
    tokio::time::sleep(context.config.request_timeout()).await;
}
