//! Certificates on a replica (issue 15 parts 4–5): reloading this replica's certificate, key and CA
//! set from its config's files (SIGHUP, `meshctl certs reload`; decision 0170), what it knows of
//! the cluster's certificates (its own, and each peer's from its last handshake) with the expiry
//! warning `status` and `/metrics` show, revocation through Raft (`meshctl certs revoke`), and the
//! task that hands the committed deny list to the endpoint (decision 0172).

use std::sync::Weak;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::api::{ApiError, Body, CertsError};
use super::service::Service;
use crate::store::command::{Applied, Command, RequestId};
use crate::store::revoked::{DenyMap, RevokedTarget, to_transport};

/// A certificate expiring within this many days is warned about in `status` and `/metrics`.
pub const expiry_warning_days: i64 = 30;

/// One certificate as `status` and `meshctl certs list` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertView {
    /// `replica:1`, `host:ace`, `operator:admin`; empty when it names no principal.
    pub principal: String,
    pub serial: String,
    /// When it expires, in milliseconds since the Unix epoch.
    pub not_after_ms: i64,
    /// The role an operator's certificate states (decision 0295); `None` for replicas, hosts and
    /// operator certificates from before roles (which hold admin).
    pub role: Option<mesh_transport::Role>,
}

/// One deny-list entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyView {
    /// `serial <hex>` or a principal.
    pub target: String,
    pub why: String,
    pub actor: String,
    pub time_ms: u64,
}

/// What one replica knows of the cluster's certificates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertsView {
    pub replica: u64,
    /// Its own certificate, as loaded last.
    pub own: Option<CertView>,
    /// The certificate each peer presented at its last handshake with this replica.
    pub peers: Vec<CertView>,
    /// CA certificates it trusts: 1, or 2 during a CA switch (decision 0171).
    pub cas: usize,
    /// The committed deny list.
    pub denied: Vec<DenyView>,
}

/// What a reload did on one replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadView {
    pub replica: u64,
    pub own: Option<CertView>,
    pub cas: usize,
    /// Open connections closed because their peer is no longer trusted.
    pub closed: usize,
}

fn view(info: &mesh_transport::CertInfo) -> CertView {
    CertView {
        principal: info
            .principal
            .as_ref()
            .map(|p| p.to_string())
            // allow(empty-on-error): a certificate naming no principal is shown with an empty one
            .unwrap_or_default(),
        serial: info.serial.clone(),
        not_after_ms: (info.not_after.unix_timestamp_nanos() / 1_000_000) as i64,
        role: info.role,
    }
}

fn deny_views(list: &DenyMap) -> Vec<DenyView> {
    list.values()
        .map(|e| DenyView {
            target: e.target.to_string(),
            why: e.why.clone(),
            actor: e.actor.clone(),
            time_ms: e.time_ms,
        })
        .collect()
}

impl Service {
    /// Loads this replica's certificate, key and CA set again from the files its config names.
    /// On error nothing changed and the replica goes on with what it had.
    pub fn reload_certs(&self) -> Result<ReloadView, ApiError> {
        let tls = self.config.tls();
        let closed = self
            .endpoint
            .reload_from_files(&tls.ca, &tls.cert, &tls.key)
            .map_err(|e| {
                let error = CertsError::NotReloaded {
                    replica: self.id,
                    reason: e.to_string(),
                };
                tracing::error!("{error}");
                ApiError::from(error)
            })?;
        let (own, _) = self.endpoint.certificates();
        let own = own.as_ref().map(view);
        if let Some(own) = &own {
            tracing::info!(replica = self.id, serial = %own.serial, cas = self.endpoint.trusted_cas(), closed,
                "certificates reloaded");
        }
        Ok(ReloadView {
            replica: self.id,
            own,
            cas: self.endpoint.trusted_cas(),
            closed,
        })
    }

    /// Every certificate this replica knows of and the deny list, answered by this replica.
    pub fn certs_view(&self) -> Result<CertsView, ApiError> {
        let (own, peers) = self.endpoint.certificates();
        Ok(CertsView {
            replica: self.id,
            own: own.as_ref().map(view),
            peers: peers.iter().map(view).collect(),
            cas: self.endpoint.trusted_cas(),
            denied: deny_views(&self.state()?.revoked),
        })
    }

    /// The certificates this replica knows of that expire within [`expiry_warning_days`] (or
    /// have expired), soonest first.
    pub fn certs_expiring(&self) -> Vec<CertView> {
        let (own, peers) = self.endpoint.certificates();
        let soon = mesh_transport::trust::expiring(
            own.into_iter().chain(peers),
            OffsetDateTime::now_utc(),
            time::Duration::days(expiry_warning_days),
        );
        soon.iter().map(view).collect()
    }

    /// For `/metrics`: how many known certificates expire within [`expiry_warning_days`], and
    /// the seconds until the soonest expiry of any.
    pub(crate) fn cert_gauges(&self) -> (usize, Option<i64>) {
        let (own, peers) = self.endpoint.certificates();
        let now = OffsetDateTime::now_utc();
        let soonest = own
            .iter()
            .chain(&peers)
            .map(|c| (c.not_after - now).whole_seconds())
            .min();
        (self.certs_expiring().len(), soonest)
    }

    /// `Request::CertsRevoke`: adds a certificate or principal to the deny list through Raft.
    pub(crate) async fn revoke(
        &self,
        actor: &str,
        id: RequestId,
        target: String,
        why: String,
    ) -> Result<Body, ApiError> {
        let term = self.leading_term()?;
        let target = RevokedTarget::parse(&target)
            .map_err(|reason| CertsError::BadTarget { target, reason })?;
        if let Some(id) = crate::store::revoked::retired_replica(&target)
            && self.replica.members().contains_key(&id)
        {
            return Err(CertsError::RevokingAMember { id }.into());
        }
        let command = Command::Once {
            request: id,
            command: Box::new(Command::Revoke { target, why }),
        };
        let applied = self.propose(term, None, actor, command).await?;
        revoked_answer(applied)
    }
}

/// The answer to a revocation, first time or remembered.
pub(crate) fn revoked_answer(applied: Applied) -> Result<Body, ApiError> {
    match applied {
        Applied::Revoked { target, entries } => Ok(Body::CertsRevoked {
            target: target.to_string(),
            entries,
        }),
        other => Err(ApiError::internal(format!(
            "a revocation was answered with {other:?}; this is a bug in meshd, report it"
        ))),
    }
}

/// Hands the committed deny list to the endpoint at start and after every commit that changed
/// it: the next handshake of a revoked certificate is refused, and its open connections close.
pub(crate) async fn keep_denied(service: Weak<Service>) {
    let Some(mut metrics) = service.upgrade().map(|s| s.replica().metrics()) else {
        return;
    };
    let mut applied: Option<DenyMap> = None;
    loop {
        {
            let Some(s) = service.upgrade() else { return };
            match s.app().state() {
                Ok(state) if applied.as_ref() != Some(&state.revoked) => {
                    match to_transport(&state.revoked) {
                        Ok(list) => {
                            let closed = s.endpoint().set_denied(list);
                            tracing::info!(
                                replica = s.id(),
                                entries = state.revoked.len(),
                                closed,
                                "deny list in force"
                            );
                            applied = Some(state.revoked.clone());
                        }
                        Err(e) => tracing::error!(error = %e, "cannot apply the deny list"),
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "cannot read the deny list from the store"),
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
