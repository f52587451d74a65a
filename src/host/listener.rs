//! The host's side of QUIC: envelopes that passed the transport's writers table (G10: only
//! replicas may send them) go to [`Agent::receive`], and the outcome goes back as an
//! [`EnvelopeReply`]; a replica's log request (`MessageKind::Logs`, for `meshctl logs`) is answered
//! from the modules' log files ([`super::logs::answer`]). Everything else a permitted peer may send
//! a host is refused by name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mesh_transport::{
    BindError, BoxFuture, Endpoint, Handler, Identity, MessageKind, PkiError, Principal,
};
use tokio::sync::mpsc;

use super::agent::{Agent, Applied, HostError};
use super::config::HostConfig;
use super::durable::{self, StorageError};
use crate::core::envelope::Refusal;
use crate::core::wire::{
    EnvelopeReply, LogsAsk, envelope_reply_what, logs_answer_what, logs_ask_what,
};

/// Fatal errors waiting for the process to notice; one is enough to stop it.
pub const fatal_depth_max: usize = 1;

/// File under the state root holding the address the listener is bound to (useful with port 0).
pub const listen_file: &str = "listening";

/// Why mesh-host could not start listening. Each names what to fix in host.toml or on disk.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error(
        "host.toml has no [tls] section; add ca, cert and key paths (`meshctl init` writes them) so replicas can reach this host"
    )]
    NoTls,
    #[error("cannot load this host's TLS identity: {0}")]
    Identity(#[from] PkiError),
    #[error(
        "the certificate names {found}, but host.toml says this machine is `{name}`; use the certificate issued for host:{name}"
    )]
    WrongPrincipal { name: String, found: Principal },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: BindError },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Binds the host's QUIC endpoint on `listen` with the `[tls]` identity, which must name
/// `host:<name>`, and writes the bound address to `<root>/listening`. Serves nothing yet.
pub fn bind(config: &HostConfig) -> Result<Endpoint, ListenError> {
    let tls = config.tls().ok_or(ListenError::NoTls)?;
    let identity = Identity::load(&tls.ca, &tls.cert, &tls.key)?;
    let expected = Principal::Host(config.name().to_string());
    if identity.principal() != &expected {
        return Err(ListenError::WrongPrincipal {
            name: config.name().to_string(),
            found: identity.principal().clone(),
        });
    }
    let endpoint = Endpoint::bind(config.listen(), &identity, config.transport().clone()).map_err(
        |source| ListenError::Bind {
            addr: config.listen().to_string(),
            source,
        },
    )?;
    if let Some(advertise) = config.advertise() {
        tracing::info!(listen = %endpoint.local_addr(), %advertise, "replicas reach this host at its advertise address");
    }
    durable::create_dir(config.root(), 0o700)?;
    let shown = format!("{}\n", endpoint.local_addr());
    durable::write_atomic(&listen_path(config.root()), shown.as_bytes(), 0o644)?;
    Ok(endpoint)
}

/// Where [`bind`] writes the bound address.
pub fn listen_path(root: &Path) -> PathBuf {
    root.join(listen_file)
}

/// Serves envelopes to one agent.
pub struct EnvelopeHandler {
    agent: Arc<Agent>,
    fatal: mpsc::Sender<HostError>,
    endpoint: Endpoint,
}

/// Makes the endpoint refuse what the last applied declaration's deny list revokes (decision
/// 0172): replicas and operators presenting a revoked certificate are refused at their next
/// handshake and their open connections closed. Nothing applied yet: an empty list.
pub async fn enforce_deny_list(endpoint: &Endpoint, agent: &Agent) {
    let revoked = match agent.applied().await {
        Some((_, declaration)) => declaration.revoked,
        None => Default::default(),
    };
    let entries = revoked.iter().filter_map(|(key, why)| {
        let what = if let Some(serial) = key.strip_prefix("serial:") {
            mesh_transport::Revoked::Serial(serial.to_string())
        } else {
            let principal = key.strip_prefix("principal:")?.parse().ok()?;
            mesh_transport::Revoked::Principal(principal)
        };
        Some((what, why.clone()))
    });
    match mesh_transport::DenyList::new(entries) {
        Ok(list) => {
            let count = list.len();
            let closed = endpoint.set_denied(list);
            if count > 0 || closed > 0 {
                tracing::info!(
                    entries = count,
                    closed,
                    "deny list from the declaration in force"
                );
            }
        }
        Err(e) => tracing::error!(error = %e, "the declaration's deny list was not applied"),
    }
}

/// Starts serving `agent` on `endpoint`. The receiver yields the first error after which the
/// host cannot keep its promises (storage failed); the process must then stop.
pub fn serve(endpoint: &Endpoint, agent: Arc<Agent>) -> Option<mpsc::Receiver<HostError>> {
    let (fatal, fatal_rx) = mpsc::channel(fatal_depth_max);
    let handler = EnvelopeHandler {
        agent,
        fatal,
        endpoint: endpoint.clone(),
    };
    match endpoint.serve(Arc::new(handler)) {
        true => Some(fatal_rx),
        false => None,
    }
}

/// The answer to an envelope: applied or refused, as data; `Err` only when the envelope was not
/// even looked at to the end (state trouble, or the host is stopping).
pub fn reply_for(result: Result<Applied, HostError>) -> Result<EnvelopeReply, HostError> {
    match result {
        Ok(applied) => Ok(EnvelopeReply::Applied {
            position: applied.position,
            digest: applied.digest,
        }),
        Err(HostError::Refused(refusal)) => Ok(EnvelopeReply::Refused {
            older: matches!(refusal, Refusal::Older { .. }),
            refusal: refusal.to_string(),
        }),
        Err(e @ HostError::Declaration { .. }) => Ok(EnvelopeReply::Refused {
            refusal: e.to_string(),
            older: false,
        }),
        Err(other) => Err(other),
    }
}

impl EnvelopeHandler {
    async fn envelope(&self, from: Principal, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let machine = self.agent.config().name();
        let sender = match &from {
            Principal::Replica(id) => Some(*id),
            // The writers table lets only replicas send envelopes (G10): no other principal
            // reaches this handler with one.
            _ => None,
        };
        let reply = match reply_for(self.agent.receive_from(sender, &body).await) {
            Ok(reply) => reply,
            Err(e) => {
                let reason = e.to_string();
                if e.is_fatal() {
                    tracing::error!(machine, %from, error = %reason, "host state failed; stopping");
                    // A full channel already holds a fatal error: the process is stopping anyway.
                    let _ = self.fatal.try_send(e);
                }
                return Err(reason);
            }
        };
        match &reply {
            EnvelopeReply::Refused { refusal, older } => {
                tracing::info!(machine, %from, older, refusal = %refusal, "answered refused");
            }
            EnvelopeReply::Applied { .. } => enforce_deny_list(&self.endpoint, &self.agent).await,
        }
        mesh_codec::encode(envelope_reply_what, &reply)
            .map_err(|e| format!("mesh-host could not encode its answer: {e}"))
    }
}

impl EnvelopeHandler {
    /// The modules of the declaration in force: their logs, and no other file, may be read.
    async fn logs(&self, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let ask: LogsAsk = mesh_codec::decode(logs_ask_what, &body)
            .map_err(|e| format!("mesh-host could not read the log request: {e}"))?;
        let modules: Vec<String> = match self.agent.applied().await {
            Some((_, declaration)) => declaration.modules.iter().map(|m| m.name.clone()).collect(),
            None => Vec::new(),
        };
        let root = self.agent.config().root().to_path_buf();
        let machine = self.agent.config().name().to_string();
        let answer = tokio::task::spawn_blocking(move || {
            super::logs::answer(&root, &machine, &modules, &ask)
        })
        .await
        .map_err(|e| format!("mesh-host's log reader stopped: {e}"))?
        .map_err(|e| e.to_string())?;
        mesh_codec::encode(logs_answer_what, &answer)
            .map_err(|e| format!("mesh-host could not encode its answer: {e}"))
    }
}

impl Handler for EnvelopeHandler {
    fn request(
        &self,
        from: Principal,
        kind: MessageKind,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<Vec<u8>, String>> {
        Box::pin(async move {
            match kind {
                MessageKind::Envelope => self.envelope(from, body).await,
                MessageKind::Logs => self.logs(body).await,
                other => Err(format!(
                    "mesh-host answers only envelopes and log requests, not {other}; send it to a controller replica"
                )),
            }
        })
    }

    fn one_way(&self, from: Principal, kind: MessageKind, _body: Vec<u8>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // An envelope needs an answer (G2's outcome goes back to the leader): never one-way.
            tracing::warn!(%from, %kind, "one-way message to mesh-host ignored; envelopes are requests");
        })
    }
}
