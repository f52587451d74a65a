//! What an endpoint trusts right now, and who it is right now: the CA set (one CA, or two while a
//! CA switch is under way), the deny list of revoked certificates and principals, and its own
//! certificate and key. All of it can be swapped while the endpoint runs (decision 0170); the TLS
//! verifiers and certificate resolvers in `tls.rs` read it at every handshake.
//!
//! Every refusal is one line naming the certificate (principal, serial) and the way out.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

use crate::principal::{Principal, Role};
use crate::tls::{TlsError, provider};

/// Most CA certificates trusted at once: the current CA and the one being switched to.
pub const cas_max: usize = 2;

/// Most entries in a deny list; a list over it is refused whole.
pub const deny_entries_max: usize = 10_000;

/// Most peer certificates remembered for expiry warnings; past it, new principals are not kept.
pub const seen_max: usize = 4096;

/// Longest reason kept with a revocation, in bytes.
pub const why_bytes_max: usize = 256;

/// What a certificate is, for refusals and expiry warnings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The principal its `mesh://` URI SAN names, if it names exactly one well-formed one.
    pub principal: Option<Principal>,
    /// The role it states, an operator's (decision 0295); `None` when it states none.
    pub role: Option<Role>,
    /// The serial number, lowercase hex without leading zero bytes.
    pub serial: String,
    pub not_after: OffsetDateTime,
}

impl CertInfo {
    /// Reads principal, serial and expiry from a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<CertInfo, String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("certificate could not be parsed: {e}"))?;
        let raw = cert.raw_serial();
        let skip = raw.iter().take_while(|b| **b == 0).count();
        let mut serial = String::with_capacity(raw.len() * 2);
        for b in &raw[skip.min(raw.len().saturating_sub(1))..] {
            serial.push_str(&format!("{b:02x}"));
        }
        let named = Principal::from_certificate_with_role(der).ok();
        Ok(CertInfo {
            principal: named.as_ref().map(|(principal, _)| principal.clone()),
            role: named.and_then(|(_, role)| role),
            serial,
            not_after: cert.validity().not_after.to_datetime(),
        })
    }

    /// `certificate host:ace serial 3f…` (or `certificate serial 3f…` when it names nobody).
    pub fn named(&self) -> String {
        match &self.principal {
            Some(p) => format!("certificate {p} serial {}", self.serial),
            None => format!("certificate serial {} (names no principal)", self.serial),
        }
    }

    fn renew_hint(&self) -> String {
        match &self.principal {
            Some(p) => format!(
                "issue a new one with `meshctl certs renew {p}` and reload it (`meshctl certs reload` or SIGHUP)"
            ),
            None => "issue one naming a principal with `meshctl certs renew <principal>`".into(),
        }
    }
}

/// The way out of a certificate from a CA the refusing process does not trust. An operator's
/// certificate (or the CA an operator checks replicas against) from another cluster is the usual
/// cause, and renewing the replica's certificate would not fix it: say to use this cluster's.
fn unknown_ca_hint(peer: Option<&Principal>, by: Option<&Principal>) -> String {
    match (peer, by) {
        (Some(Principal::Operator(name)), _) => format!(
            "this operator certificate is from another CA (another cluster's, or one replaced): use the operator certificate of this cluster's context, or issue one from this cluster's CA with `meshctl certs issue operator:{name} --role <role>`"
        ),
        (Some(Principal::Replica(_)), Some(Principal::Operator(_))) => "meshctl's context checks replicas against another CA than theirs: the context's [tls] ca (and its operator certificate) are from another cluster; use this cluster's context (`--context`, MESH_CONTEXT) or the ca.pem and operator certificate `meshctl init` wrote for it".to_string(),
        (Some(p), _) => format!(
            "issue a new one with `meshctl certs renew {p}` from the CA this process trusts and reload it (`meshctl certs reload` or SIGHUP), or add its CA to this process's ca.pem and reload"
        ),
        (None, _) => "issue one naming a principal with `meshctl certs renew <principal>`, or add its CA to this process's ca.pem and reload".into(),
    }
}

/// One entry of a deny list: a single certificate, or every certificate naming a principal.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Revoked {
    Serial(String),
    Principal(Principal),
}

impl fmt::Display for Revoked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Revoked::Serial(s) => write!(f, "serial {s}"),
            Revoked::Principal(p) => write!(f, "{p}"),
        }
    }
}

/// The revoked certificates and principals, each with why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DenyList {
    entries: BTreeMap<Revoked, String>,
}

impl DenyList {
    /// A deny list of at most [`deny_entries_max`] entries; serials are compared in lowercase.
    pub fn new(entries: impl IntoIterator<Item = (Revoked, String)>) -> Result<DenyList, String> {
        let mut out = BTreeMap::new();
        for (what, why) in entries {
            let what = match what {
                Revoked::Serial(s) => Revoked::Serial(s.to_ascii_lowercase()),
                other => other,
            };
            out.insert(what, why);
            if out.len() > deny_entries_max {
                return Err(format!(
                    "deny list over {deny_entries_max} entries; nothing was changed"
                ));
            }
        }
        Ok(DenyList { entries: out })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The refusal for `cert`, if this list revokes it.
    pub fn refusal(&self, cert: &CertInfo) -> Option<Refusal> {
        if let Some(why) = self.entries.get(&Revoked::Serial(cert.serial.clone())) {
            return Some(Refusal::Revoked {
                cert: cert.clone(),
                why: why.clone(),
            });
        }
        let principal = cert.principal.as_ref()?;
        let why = self.entries.get(&Revoked::Principal(principal.clone()))?;
        Some(Refusal::PrincipalRevoked {
            cert: cert.clone(),
            why: why.clone(),
        })
    }
}

/// Why a peer certificate is refused: one line naming the certificate and the way out.
#[derive(Clone, PartialEq, Eq)]
pub enum Refusal {
    Revoked {
        cert: CertInfo,
        why: String,
    },
    PrincipalRevoked {
        cert: CertInfo,
        why: String,
    },
    Expired {
        cert: CertInfo,
        detail: String,
    },
    NotYetValid {
        cert: CertInfo,
        detail: String,
    },
    UnknownCa {
        cert: CertInfo,
        detail: String,
        /// The principal of the process that refused it, when its own certificate names one:
        /// the way out depends on who refused whom (an operator's context from another cluster
        /// is not fixed by renewing the replicas' certificates).
        by: Option<Principal>,
    },
    Other {
        cert: Option<CertInfo>,
        reason: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Revoked { cert, why } => write!(
                f,
                "{} is revoked ({why}); {}",
                cert.named(),
                cert.renew_hint()
            ),
            Refusal::PrincipalRevoked { cert, why } => write!(
                f,
                "{} is refused: its principal is revoked ({why}); a revoked principal stays out (a machine removed from the model is let in again when it is added back)",
                cert.named()
            ),
            Refusal::Expired { cert, detail } => write!(
                f,
                "{} expired at {} ({detail}); {}",
                cert.named(),
                cert.not_after,
                cert.renew_hint()
            ),
            Refusal::NotYetValid { cert, detail } => write!(
                f,
                "{} is not valid yet ({detail}); check this machine's clock against the one that issued it",
                cert.named()
            ),
            Refusal::UnknownCa { cert, detail, by } => write!(
                f,
                "{} is not signed by a CA this process trusts ({detail}); {}",
                cert.named(),
                unknown_ca_hint(cert.principal.as_ref(), by.as_ref())
            ),
            Refusal::Other { cert, reason } => match cert {
                Some(cert) => write!(f, "{} refused: {reason}", cert.named()),
                None => write!(f, "peer certificate refused: {reason}"),
            },
        }
    }
}

/// rustls shows a carried error with `Debug`: show the line.
impl fmt::Debug for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Refusal {}

impl Refusal {
    /// Names what webpki refused in `end_entity`; `by` is the refusing process's own principal.
    pub(crate) fn from_webpki(
        end_entity: &[u8],
        e: &rustls::Error,
        by: Option<Principal>,
    ) -> Refusal {
        use rustls::CertificateError as C;
        let cert = CertInfo::from_der(end_entity).ok();
        let Some(cert) = cert else {
            return Refusal::Other {
                cert: None,
                reason: e.to_string(),
            };
        };
        let detail = e.to_string();
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                C::Expired | C::ExpiredContext { .. } => Refusal::Expired { cert, detail },
                C::NotValidYet | C::NotValidYetContext { .. } => {
                    Refusal::NotYetValid { cert, detail }
                }
                #[allow(deprecated)]
                C::UnknownIssuer | C::BadSignature => Refusal::UnknownCa { cert, detail, by },
                other => Refusal::Other {
                    cert: Some(cert),
                    reason: format!("{other:?}"),
                },
            },
            other => Refusal::Other {
                cert: Some(cert),
                reason: other.to_string(),
            },
        }
    }

    /// As a rustls error, whose text travels to the peer in the close frame.
    pub(crate) fn into_rustls(self) -> rustls::Error {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
            Arc::new(self),
        )))
    }
}

/// The one line of a failed handshake: a mesh refusal carried through rustls loses the
/// `Other(OtherError(…))` wrapping rustls prints around it; anything else (no mesh refusal, so
/// no way out named yet) gets the general hint.
pub(crate) fn handshake_reason(raw: &str) -> String {
    if crate::version::no_common_framing(raw) {
        return crate::version::no_common_framing_reason(raw);
    }
    const wrapped: &str = "Other(OtherError(";
    if let Some(at) = raw.find(wrapped) {
        let inner = &raw[at + wrapped.len()..];
        let inner = inner.rfind("))").map_or(inner, |end| &inner[..end]);
        return format!("{}{inner}", &raw[..at]);
    }
    format!(
        "{raw}; check that both certificates are issued by a mesh CA both trust, unexpired, and name a principal"
    )
}

/// The trust an endpoint checks peers against: verifiers built over the CA set, and the deny list.
pub(crate) struct TrustSet {
    pub(crate) cas: Vec<CertificateDer<'static>>,
    pub(crate) client: Arc<dyn ClientCertVerifier>,
    pub(crate) server: Arc<WebPkiServerVerifier>,
    pub(crate) deny: DenyList,
}

impl TrustSet {
    fn build(cas: &[CertificateDer<'static>], deny: DenyList) -> Result<TrustSet, TlsError> {
        if cas.is_empty() || cas.len() > cas_max {
            return Err(TlsError::BadRoot {
                reason: format!(
                    "ca.pem holds {} certificates; it must hold 1, or {cas_max} while switching CAs",
                    cas.len()
                ),
            });
        }
        let mut roots = RootCertStore::empty();
        for ca in cas {
            roots.add(ca.clone()).map_err(|e| TlsError::BadRoot {
                reason: e.to_string(),
            })?;
        }
        let roots = Arc::new(roots);
        let err = |side: &'static str| {
            move |e: rustls::server::VerifierBuilderError| TlsError::Config {
                side,
                reason: e.to_string(),
            }
        };
        let client = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(err("server"))?;
        let server = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(err("client"))?;
        Ok(TrustSet {
            cas: cas.to_vec(),
            client,
            server,
            deny,
        })
    }
}

/// An endpoint's live identity and trust, swapped whole under short locks never held across an
/// await; each handshake reads the values current when it starts.
pub struct Live {
    key: RwLock<Arc<CertifiedKey>>,
    own: RwLock<Option<CertInfo>>,
    trust: RwLock<Arc<TrustSet>>,
    /// Moves after every change of the trust (reload, deny list), once the new trust is in
    /// place: a connection verified under an older generation is checked again when tracked
    /// (decision 0297).
    generation: AtomicU64,
    seen: Mutex<HashMap<Principal, CertInfo>>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

fn read<T: Clone>(lock: &RwLock<T>) -> T {
    lock.read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

fn write<T>(lock: &RwLock<T>, value: T) {
    *lock
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = value;
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, TlsError> {
    if chain.is_empty() {
        return Err(TlsError::Config {
            side: "both",
            reason: "the certificate file holds no certificate".into(),
        });
    }
    CertifiedKey::from_der(chain, key, &provider())
        .map(Arc::new)
        .map_err(|e| TlsError::Config {
            side: "both",
            reason: format!("the key does not fit the certificate: {e}"),
        })
}

impl Live {
    /// From the CA set, a certificate chain and its key; the deny list starts empty.
    pub fn from_parts(
        cas: &[CertificateDer<'static>],
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Live, TlsError> {
        let own = chain.first().and_then(|c| CertInfo::from_der(c).ok());
        Ok(Live {
            key: RwLock::new(certified(chain, key)?),
            own: RwLock::new(own),
            trust: RwLock::new(Arc::new(TrustSet::build(cas, DenyList::default())?)),
            generation: AtomicU64::new(0),
            seen: Mutex::new(HashMap::new()),
        })
    }

    /// Swaps the certificate, key and CA set together, keeping the deny list. Checked whole
    /// first: on error nothing changed.
    pub fn reload(
        &self,
        cas: &[CertificateDer<'static>],
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), TlsError> {
        let own = chain.first().and_then(|c| CertInfo::from_der(c).ok());
        let key = certified(chain, key)?;
        let deny = self.trust().deny.clone();
        let trust = Arc::new(TrustSet::build(cas, deny)?);
        write(&self.key, key);
        write(&self.own, own);
        write(&self.trust, trust);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Replaces the deny list.
    pub fn set_denied(&self, deny: DenyList) {
        let current = self.trust();
        let next = TrustSet {
            cas: current.cas.clone(),
            client: current.client.clone(),
            server: current.server.clone(),
            deny,
        };
        write(&self.trust, Arc::new(next));
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The trust's generation: read before a handshake starts, compared when its connection is
    /// tracked. It moves only after the new trust is in place.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    pub(crate) fn key(&self) -> Arc<CertifiedKey> {
        read(&self.key)
    }

    pub(crate) fn trust(&self) -> Arc<TrustSet> {
        read(&self.trust)
    }

    /// This endpoint's own certificate as loaded last.
    pub fn own(&self) -> Option<CertInfo> {
        read(&self.own)
    }

    /// The CA certificates trusted now.
    pub fn cas(&self) -> Vec<CertificateDer<'static>> {
        self.trust().cas.clone()
    }

    /// The deny list in force.
    pub fn denied(&self) -> DenyList {
        self.trust().deny.clone()
    }

    /// The certificate each peer principal presented at its last accepted handshake.
    pub fn seen(&self) -> Vec<CertInfo> {
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut out: Vec<CertInfo> = seen.values().cloned().collect();
        out.sort_by(|a, b| a.principal.cmp(&b.principal));
        out
    }

    pub(crate) fn remember(&self, cert: CertInfo) {
        let Some(principal) = cert.principal.clone() else {
            return;
        };
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if seen.len() < seen_max || seen.contains_key(&principal) {
            seen.insert(principal, cert);
        }
    }
}

/// The refusal for a peer certificate whose validity ended at `now` while its connection stayed
/// open (a TLS check happens only at the handshake, so a kept connection would outlive it).
/// Compared in whole seconds, as webpki compares at a handshake: a connection dropped here is
/// refused by the redial's handshake too, never let in again within the same second.
pub fn ended(cert: &CertInfo, now: OffsetDateTime) -> Option<Refusal> {
    (now.unix_timestamp() > cert.not_after.unix_timestamp()).then(|| Refusal::Expired {
        cert: cert.clone(),
        detail: "its validity ended while a connection it opened was kept".into(),
    })
}

/// Certificates that end within `within` of `now`, soonest first: the expiry warning.
pub fn expiring(
    certs: impl IntoIterator<Item = CertInfo>,
    now: OffsetDateTime,
    within: time::Duration,
) -> Vec<CertInfo> {
    let mut out: Vec<CertInfo> = certs
        .into_iter()
        .filter(|c| c.not_after - now <= within)
        .collect();
    out.sort_by_key(|c| c.not_after);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Ca, Validity};
    use rustls_pki_types::pem::PemObject;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")
    }

    #[test]
    fn deny_list_refuses_by_serial_and_by_principal_and_names_the_way_out() {
        // Revocation: one entry refuses one certificate; a principal entry refuses all of its.
        let ca = Ca::create(Validity::days_from_now(1)).expect("ca");
        let host = Principal::Host("ace".into());
        let first = CertInfo::from_der(&der(ca
            .issue(&host, Validity::days_from_now(1))
            .expect("issue")
            .cert_pem()))
        .expect("info");
        let second = CertInfo::from_der(&der(ca
            .issue(&host, Validity::days_from_now(1))
            .expect("issue")
            .cert_pem()))
        .expect("info");
        assert_ne!(first.serial, second.serial);
        let by_serial =
            DenyList::new([(Revoked::Serial(first.serial.to_uppercase()), "lost".into())])
                .expect("list");
        let refusal = by_serial.refusal(&first).expect("refused").to_string();
        assert!(refusal.contains("host:ace"), "{refusal}");
        assert!(refusal.contains(&first.serial), "{refusal}");
        assert!(
            refusal.contains("meshctl certs renew host:ace"),
            "{refusal}"
        );
        assert_eq!(by_serial.refusal(&second), None);
        let by_principal =
            DenyList::new([(Revoked::Principal(host), "gone".into())]).expect("list");
        assert!(by_principal.refusal(&first).is_some());
        assert!(by_principal.refusal(&second).is_some());
    }

    #[test]
    fn expiring_lists_only_certificates_inside_the_window_soonest_first() {
        // Rotation: the warning names certificates ending within the window, nothing else.
        let now = OffsetDateTime::now_utc();
        let cert = |days: i64| CertInfo {
            principal: Some(Principal::Replica(days as u64)),
            role: None,
            serial: format!("{days}"),
            not_after: now + time::Duration::days(days),
        };
        let soon = expiring([cert(40), cert(29), cert(3)], now, time::Duration::days(30));
        let serials: Vec<&str> = soon.iter().map(|c| c.serial.as_str()).collect();
        assert_eq!(serials, ["3", "29"]);
    }
}
