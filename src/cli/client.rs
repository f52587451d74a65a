//! Asks the controller: one QUIC request with the operator's certificate, to the context's
//! replicas in id order until one answers (G13: any replica will do; a follower forwards).

use mesh_transport::{
    Endpoint, Identity, MessageKind, Part, Peer, PkiError, Principal, TransportConfig,
    TransportError,
};
use std::net::SocketAddr;
use std::time::Duration;

use super::context::Context;
use crate::controller::api::{Answer, Call, PushEvent, Request, push_event_what};

/// How long to wait for a replica to complete a handshake before trying the next one.
pub const dial_timeout_ms: u64 = 3_000;
/// How long a request may take once a replica answered the handshake: a push waits for every
/// host it sends to, so this is generous.
pub const request_timeout_ms: u64 = 60_000;

/// What the codec calls a request and an answer in its errors.
pub const request_what: &str = "request";
pub const answer_what: &str = "answer";

/// Why no replica gave an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "operator identity in {context}: {source}; check the context's [tls] paths, or run `meshctl init` again"
    )]
    Identity { context: String, source: PkiError },
    #[error("cannot start the QUIC endpoint: {0}")]
    Bind(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot encode the request: {0}")]
    Encode(String),
    #[error(
        "no replica of {context} answered ({tried}); is meshd running there? check `replicas` in the context"
    )]
    Unreachable { context: String, tried: String },
    #[error(
        "replica {id} ({addr}) refused the request: {reason}; the context's [tls] cert must name operator:<name>"
    )]
    Refused {
        id: u64,
        addr: SocketAddr,
        reason: String,
    },
    #[error(
        "replica {id} ({addr}) took the request but gave no answer ({reason}); it may have taken effect: check `meshctl history` before running it again"
    )]
    NoAnswer {
        id: u64,
        addr: SocketAddr,
        reason: String,
    },
    #[error(
        "replica {id} ({addr}) answered with bytes meshctl cannot read ({reason}); are meshctl and meshd the same version?"
    )]
    BadAnswer {
        id: u64,
        addr: SocketAddr,
        reason: String,
    },
    #[error(
        "replica {replica} answered {got} to a {asked} request; this is a bug in meshd, report it"
    )]
    Unexpected {
        replica: u64,
        asked: &'static str,
        got: String,
    },
}

impl ClientError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Identity { .. } => super::exit_bad_input,
            _ => super::exit_failed,
        }
    }
}

/// Sends `request` to the context's replicas in order and returns the first answer.
pub fn ask(context: &Context, request: &Request) -> Result<Answer, ClientError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClientError::Runtime)?;
    runtime.block_on(ask_async(context, request))
}

/// [`ask`], asking for a streamed answer: each event the replica sends before its answer goes
/// to `events` as it arrives (a push's lines, decision 0190). A replica that answers once (an
/// older one) sends none; the answer carries everything either way.
pub fn ask_streamed(
    context: &Context,
    request: &Request,
    events: Events<'_>,
) -> Result<Answer, ClientError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClientError::Runtime)?;
    runtime.block_on(ask_inner(context, request, Some(events)))
}

/// Where the events of a streamed answer go.
pub type Events<'a> = &'a mut (dyn FnMut(PushEvent) + Send);

/// [`ask`] inside a running tokio runtime.
pub async fn ask_async(context: &Context, request: &Request) -> Result<Answer, ClientError> {
    ask_inner(context, request, None).await
}

async fn ask_inner<'e>(
    context: &Context,
    request: &Request,
    mut events: Option<&mut (dyn FnMut(PushEvent) + Send + 'e)>,
) -> Result<Answer, ClientError> {
    let ctx_name = context.path.display().to_string();
    let identity = load_identity(context)?;
    let call = Call::new(request.clone()).ok_or_else(|| {
        ClientError::Encode("the OS random source failed while picking a request id".into())
    })?;
    let body =
        mesh_codec::encode(request_what, &call).map_err(|e| ClientError::Encode(e.to_string()))?;
    let config = TransportConfig::default()
        .check()
        .map_err(|e| ClientError::Bind(e.to_string()))?;
    let mut tried = Vec::new();
    let mut endpoint: Option<Endpoint> = None;
    for &(id, addr) in &context.replicas {
        let ep = match &endpoint {
            Some(ep) => ep.clone(),
            None => {
                let ep = Endpoint::bind(any_addr(&context.replicas), &identity, config.clone())
                    .map_err(|e| ClientError::Bind(e.to_string()))?;
                endpoint = Some(ep.clone());
                ep
            }
        };
        let again = may_ask_again(request);
        match ask_one(&ep, id, addr, body.clone(), again, events.as_deref_mut()).await {
            Ok(answer) => {
                ep.close().await;
                return Ok(answer);
            }
            Err(Attempt::Final(e)) => {
                ep.close().await;
                return Err(e);
            }
            Err(Attempt::Next(reason)) => tried.push(format!("replica {id} at {addr}: {reason}")),
        }
    }
    if let Some(ep) = endpoint {
        ep.close().await;
    }
    Err(ClientError::Unreachable {
        context: ctx_name,
        tried: tried.join("; "),
    })
}

/// Whether to try the next replica or stop with this error.
enum Attempt {
    Next(String),
    Final(ClientError),
}

/// Whether a request may be asked again of another replica after one took it and gave no
/// answer: reads, and writes of one proposal, which the leader runs once per request id (a
/// retried id is answered with its first outcome), and chunks of an upload, which the store keeps
/// once by upload and index. A push or a genesis is not asked again: it
/// sends to hosts, and its answer is what it sent.
fn may_ask_again(request: &Request) -> bool {
    matches!(
        request,
        Request::Status
            | Request::Plan { .. }
            | Request::SettingsShow { .. }
            | Request::History { .. }
            | Request::SnapshotChunk { .. }
            | Request::SettingsSet { .. }
            | Request::SettingsClear { .. }
            | Request::Apply { .. }
            | Request::ApplyChunk { .. }
            | Request::ApplyUpload { .. }
            | Request::CertsReload
            | Request::CertsList
            | Request::CertsRevoke { .. }
            | Request::Events { .. }
    )
}

async fn ask_one<'e>(
    ep: &Endpoint,
    id: u64,
    addr: SocketAddr,
    body: Vec<u8>,
    again: bool,
    events: Option<&mut (dyn FnMut(PushEvent) + Send + 'e)>,
) -> Result<Answer, Attempt> {
    // A short handshake first, so a dead replica costs seconds, not the whole request timeout.
    let dial = Duration::from_millis(dial_timeout_ms);
    ep.peer_principal(addr, dial)
        .await
        .map_err(|e| Attempt::Next(e.to_string()))?;
    let peer = Peer::expecting(addr, Principal::Replica(id));
    let timeout = Duration::from_millis(request_timeout_ms);
    let sent = match events {
        Some(events) => ask_stream(ep, peer, body, timeout, events).await,
        None => ep.request(peer, MessageKind::Command, body, timeout).await,
    };
    let bytes = match sent {
        Ok(bytes) => bytes,
        Err(TransportError::Refused { reason, .. }) => {
            return Err(Attempt::Final(ClientError::Refused { id, addr, reason }));
        }
        Err(e) if again => return Err(Attempt::Next(e.to_string())),
        // A change that reached a replica must not be repeated on another one unseen.
        Err(e) => {
            return Err(Attempt::Final(ClientError::NoAnswer {
                id,
                addr,
                reason: e.to_string(),
            }));
        }
    };
    mesh_codec::decode::<Answer>(answer_what, &bytes).map_err(|e| {
        Attempt::Final(ClientError::BadAnswer {
            id,
            addr,
            reason: e.to_string(),
        })
    })
}

/// Longest wait for the next part of a streamed answer: a push's first event comes once the
/// leader has the push lock (it waits up to a minute for the push before it) and a lease round.
pub const stream_idle_ms: u64 = crate::controller::relay::stream_idle_ms;

/// Sends `body` asking for a streamed answer and hands each event to `events` as it comes.
async fn ask_stream<'e>(
    ep: &Endpoint,
    peer: Peer,
    body: Vec<u8>,
    timeout: Duration,
    events: &mut (dyn FnMut(PushEvent) + Send + 'e),
) -> Result<Vec<u8>, TransportError> {
    let idle = Duration::from_millis(stream_idle_ms).min(timeout);
    let mut answer = ep
        .request_stream(peer, MessageKind::Command, body, timeout, idle)
        .await?;
    loop {
        match answer.next().await? {
            Part::Chunk(chunk) => match mesh_codec::decode::<PushEvent>(push_event_what, &chunk) {
                Ok(event) => events(event),
                // A newer replica's event: the answer carries what it said.
                Err(e) => tracing::debug!(error = %e, "an event meshctl cannot read was skipped"),
            },
            Part::Answer(bytes) => return Ok(bytes),
        }
    }
}

/// Where the one client endpoint binds, port 0 (the OS picks): `[::]` when any replica is on IPv6,
/// so the same socket dials both families (IPv4 through mapped addresses), else `0.0.0.0`.
/// The operator identity the context names.
pub fn load_identity(context: &Context) -> Result<Identity, ClientError> {
    Identity::load(&context.tls.ca, &context.tls.cert, &context.tls.key).map_err(|source| {
        ClientError::Identity {
            context: context.path.display().to_string(),
            source,
        }
    })
}

/// The wildcard address to bind meshctl's socket on: IPv6 as soon as any replica is IPv6.
pub fn any_addr(replicas: &[(u64, SocketAddr)]) -> SocketAddr {
    if replicas.iter().any(|(_, a)| a.is_ipv6()) {
        SocketAddr::from(([0u16; 8], 0))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    }
}
