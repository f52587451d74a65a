//! Asks the controller: one QUIC request with the operator's certificate to whichever replica of
//! the context completes its handshake first, then the others as they do (G13: any replica will
//! do; a follower forwards), all within one limit (`--timeout`), so a dead replica costs nothing
//! while another answers and a dead cluster costs one handshake timeout.

use mesh_transport::{
    Endpoint, Identity, MessageKind, Part, Peer, PkiError, Principal, TransportConfig,
    TransportError,
};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use super::context::Context;
use crate::controller::api::{Answer, Call, PushEvent, Request, push_event_what};

/// How long to wait for a replica to complete a handshake before trying the next one.
pub const dial_timeout_ms: u64 = 3_000;
/// How long one request may take, handshakes with every replica included, unless `--timeout`
/// says otherwise: a push waits for every host it sends to, so this is generous.
pub const request_timeout_ms: u64 = 60_000;

/// `--timeout` of this run (one meshctl process runs one command).
static request_limit: OnceLock<Duration> = OnceLock::new();

/// Sets how long each request of this run may take (`meshctl --timeout`); the first call wins.
pub fn limit_requests(limit: Duration) {
    // allow(empty-on-error): a second call in one process keeps the first limit, as documented
    let _ = request_limit.set(limit);
}

/// How long each request may take: `--timeout`, else [`request_timeout_ms`].
pub fn request_limit_now() -> Duration {
    request_limit
        .get()
        .copied()
        .unwrap_or(Duration::from_millis(request_timeout_ms))
}

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
        "no replica of {context} answered within {after_ms} ms ({tried}); is meshd running there? raise the limit with `--timeout`, or check `replicas` in the context"
    )]
    TimedOut {
        context: String,
        after_ms: u128,
        tried: String,
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
    let endpoint = Endpoint::bind(any_addr(&context.replicas), &identity, config)
        .map_err(|e| ClientError::Bind(e.to_string()))?;
    let limit = request_limit_now();
    let mut asked = Asked::default();
    let outcome = tokio::time::timeout(
        limit,
        ask_replicas(
            &endpoint,
            context,
            request,
            body,
            &mut asked,
            events.as_deref_mut(),
        ),
    )
    .await;
    match &outcome {
        Ok(Ok(_)) => endpoint.close().await,
        // No replica to say goodbye to, or one that did not answer: no wait for them to hear it.
        _ => endpoint.abandon(),
    }
    match outcome {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(e),
        // A change that reached a replica must not be repeated on another one unseen.
        Err(_) => match asked.taken {
            Some((id, addr)) if !may_ask_again(request) => Err(ClientError::NoAnswer {
                id,
                addr,
                reason: format!("no answer within {} ms, the --timeout", limit.as_millis()),
            }),
            _ => Err(ClientError::TimedOut {
                context: ctx_name,
                after_ms: limit.as_millis(),
                tried: asked.tried_text("none answered its handshake yet"),
            }),
        },
    }
}

/// What one ask did so far, kept outside its time limit so a timeout can say it.
#[derive(Default)]
struct Asked {
    /// Replicas that did not answer, by id, and why.
    tried: Vec<(u64, String)>,
    /// The replica the request was last sent to.
    taken: Option<(u64, SocketAddr)>,
}

impl Asked {
    fn tried_text(&self, none: &str) -> String {
        let mut tried = self.tried.clone();
        tried.sort();
        if tried.is_empty() {
            return none.to_string();
        }
        let lines: Vec<String> = tried.into_iter().map(|(_, line)| line).collect();
        lines.join("; ")
    }
}

/// The replica a request takes out of the cluster (`replicas remove N`, `certs revoke
/// replica:N`): its connections close as the change commits (decision 0294), so asked through
/// it the answer could not come back. It is asked last, only when no other replica answers.
fn taken_out(request: &Request) -> Option<u64> {
    match request {
        Request::ReplicasRemove { id } => Some(*id),
        Request::CertsRevoke { target, .. } => target
            .strip_prefix("replica:")
            .and_then(|id| id.parse().ok()),
        _ => None,
    }
}

/// Dials every replica at once and asks them in the order their handshakes complete (the one the
/// request takes out last, [`taken_out`]), until one answers or says something final.
async fn ask_replicas<'e>(
    ep: &Endpoint,
    context: &Context,
    request: &Request,
    body: Vec<u8>,
    asked: &mut Asked,
    mut events: Option<&mut (dyn FnMut(PushEvent) + Send + 'e)>,
) -> Result<Answer, ClientError> {
    // A short handshake first, so a dead replica costs seconds, not the whole request limit;
    // all at once, so it costs nothing while another replica answers.
    let dial = Duration::from_millis(dial_timeout_ms);
    let mut dials = tokio::task::JoinSet::new();
    for &(id, addr) in &context.replicas {
        let ep = ep.clone();
        dials.spawn(async move { (id, addr, ep.peer_principal(addr, dial).await) });
    }
    let again = may_ask_again(request);
    let last = taken_out(request);
    let mut deferred = None;
    loop {
        let joined = match dials.join_next().await {
            Some(joined) => joined,
            None => match deferred.take() {
                Some(ready) => Ok(ready),
                None => break,
            },
        };
        let (id, addr) = match joined {
            Ok((id, addr, Ok(_))) if Some(id) == last && !dials.is_empty() => {
                deferred = Some((id, addr, Ok(mesh_transport::Principal::Replica(id))));
                continue;
            }
            Ok((id, addr, Ok(_))) => (id, addr),
            Ok((id, addr, Err(e))) => {
                asked
                    .tried
                    .push((id, format!("replica {id} at {addr}: {e}")));
                continue;
            }
            Err(e) => {
                asked
                    .tried
                    .push((u64::MAX, format!("a handshake task ended: {e}")));
                continue;
            }
        };
        asked.taken = Some((id, addr));
        match ask_one(ep, id, addr, body.clone(), again, events.as_deref_mut()).await {
            Ok(answer) => return Ok(answer),
            Err(Attempt::Final(e)) => return Err(e),
            Err(Attempt::Next(reason)) => {
                asked
                    .tried
                    .push((id, format!("replica {id} at {addr}: {reason}")));
            }
        }
    }
    Err(ClientError::Unreachable {
        context: context.path.display().to_string(),
        tried: asked.tried_text("the context names no replica"),
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
            | Request::ModelShow { .. }
            | Request::Rollback { .. }
            | Request::SettingsRollback { .. }
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
    let peer = Peer::expecting(addr, Principal::Replica(id));
    // The whole ask is bounded by `--timeout` around it; this bound is only a backstop.
    let timeout = request_limit_now();
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
