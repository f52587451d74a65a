//! TLS for the mesh: rustls on the ring provider (always passed explicitly), mutual
//! authentication against the mesh CA set only, and the principal and deny-list checks inside the
//! handshake so a certificate that names nobody, or is revoked, never gets a connection. The
//! certificate, key and trust are read from a [`Live`] at every handshake (decision 0170).

use std::fmt;
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::client::ResolvesClientCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::crypto::tls13::OkmBlock;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::config::CheckedConfig;
use crate::pki::Identity;
use crate::principal::Principal;
use crate::trust::{CertInfo, DenyList, Live, Refusal};

/// ALPN protocols offered, one per framing this build speaks, preferred first (decision 0240,
/// `version.rs`); a peer with none of them fails the handshake.
fn alpn_protocols() -> Vec<Vec<u8>> {
    crate::version::alpn_offered
        .iter()
        .map(|p| p.to_vec())
        .collect()
}

/// Why TLS or QUIC could not be configured from an identity.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the mesh CA certificate cannot be used as a trust root: {reason}; check ca.crt")]
    BadRoot { reason: String },
    #[error("could not build the {side} TLS config: {reason}; check the certificate and key files")]
    Config { side: &'static str, reason: String },
}

/// The crypto provider every mesh TLS config uses. Never the process default: another crate
/// installing a different default must not change what mesh accepts.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Rejects, inside the handshake, a chain-valid certificate that names no principal.
fn principal_check(end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
    Principal::from_certificate(end_entity)
        .map(|_| ())
        .map_err(|e| {
            let e = Arc::new(NoPrincipal(e));
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
                e,
            )))
        })
}

/// Carries a principal error through rustls, which logs `Debug`: show the readable message.
struct NoPrincipal(crate::principal::PrincipalError);

impl fmt::Debug for NoPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for NoPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for NoPrincipal {}

/// After webpki accepted the chain: a principal, and not on the deny list. Remembers the
/// certificate for expiry warnings.
fn mesh_checks(
    live: &Live,
    deny: &DenyList,
    end_entity: &CertificateDer<'_>,
) -> Result<(), rustls::Error> {
    principal_check(end_entity)?;
    let info = CertInfo::from_der(end_entity)
        .map_err(|reason| Refusal::Other { cert: None, reason }.into_rustls())?;
    if let Some(refusal) = deny.refusal(&info) {
        return Err(refusal.into_rustls());
    }
    live.remember(info);
    Ok(())
}

/// Checks a peer's chain now against the current trust, as the handshake would: used to close
/// open connections of a peer revoked (or no longer trusted) after it connected. `dialled` says
/// this side dialled, so the peer served.
pub(crate) fn recheck(
    live: &Live,
    chain: &[CertificateDer<'static>],
    dialled: bool,
) -> Result<(), String> {
    let Some((end_entity, intermediates)) = chain.split_first() else {
        return Err("peer presented an empty chain".into());
    };
    let trust = live.trust();
    let now = UnixTime::now();
    let verified = if dialled {
        let name = ServerName::try_from(crate::pki::server_name).map_err(|e| e.to_string())?;
        trust
            .server
            .verify_server_cert(end_entity, intermediates, &name, &[], now)
            .map(|_| ())
    } else {
        trust
            .client
            .verify_client_cert(end_entity, intermediates, now)
            .map(|_| ())
    };
    verified.map_err(|e| Refusal::from_webpki(end_entity, &e, own_principal(live)).to_string())?;
    let info = CertInfo::from_der(end_entity)?;
    match trust.deny.refusal(&info) {
        Some(refusal) => Err(refusal.to_string()),
        None => Ok(()),
    }
}

/// The principal this endpoint's own certificate names, if any.
fn own_principal(live: &Live) -> Option<Principal> {
    live.own().and_then(|c| c.principal)
}

/// webpki client verification against the current CA set, plus the principal and deny checks.
struct MeshClientVerifier {
    live: Arc<Live>,
}

impl fmt::Debug for MeshClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MeshClientVerifier")
    }
}

impl ClientCertVerifier for MeshClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: the CA set can change while this verifier lives, and every mesh client has
        // exactly one certificate to offer anyway.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let trust = self.live.trust();
        let verified = trust
            .client
            .verify_client_cert(end_entity, intermediates, now)
            .map_err(|e| {
                Refusal::from_webpki(end_entity, &e, own_principal(&self.live)).into_rustls()
            })?;
        mesh_checks(&self.live, &trust.deny, end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.live
            .trust()
            .client
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.live
            .trust()
            .client
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.live.trust().client.supported_verify_schemes()
    }
}

/// webpki server verification against the current CA set for the fixed name
/// [`crate::pki::server_name`], plus the principal and deny checks.
struct MeshServerVerifier {
    live: Arc<Live>,
}

impl fmt::Debug for MeshServerVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MeshServerVerifier")
    }
}

impl ServerCertVerifier for MeshServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let trust = self.live.trust();
        let verified = trust
            .server
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map_err(|e| {
                Refusal::from_webpki(end_entity, &e, own_principal(&self.live)).into_rustls()
            })?;
        mesh_checks(&self.live, &trust.deny, end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.live
            .trust()
            .server
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.live
            .trust()
            .server
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.live.trust().server.supported_verify_schemes()
    }
}

/// Hands every handshake the certificate and key loaded last, on both sides.
struct LiveCert {
    live: Arc<Live>,
}

impl fmt::Debug for LiveCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LiveCert")
    }
}

impl ResolvesServerCert for LiveCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.live.key())
    }
}

impl ResolvesClientCert for LiveCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.live.key())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Which side of a connection a QUIC transport config is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// Connections this endpoint accepts: the dialler opens streams on them.
    Serving,
    /// Connections this endpoint dials: only this side opens streams on them.
    Dialling,
    /// [`Side::Dialling`] to a host: sends of a few KiB (envelopes, log requests), one such
    /// connection per host kept by a leader, so sent without GSO ([`gso_on`]).
    DiallingHost,
}

/// Whether quinn may hand the kernel up to ten packets at once (generic segmentation offload) on
/// a connection of `side`. quinn keeps each connection's send buffer as large as its largest
/// send: up to ten packets (12–14 KiB) once anything longer than one packet left, with GSO; one
/// packet without. A leader keeps a connection to every host (one both ways, decision 0316):
/// with envelopes of more than a packet that is about 12 KiB a host, 120 MiB at 10,000 (measured
/// in process, decision 0325; the memory bench's one-packet envelopes do not show it). Dials to
/// anything but a host keep GSO: a replica's Raft appends and snapshots to another replica are
/// the one bulk sender, and a host or operator holds few connections. An accepted connection
/// cannot be told apart before its handshake, so none has it (what goes back on it is answers:
/// Raft's are small; an operator's large `status` costs one send call a packet).
pub(crate) fn gso_on(side: Side) -> bool {
    match side {
        Side::Dialling => true,
        Side::Serving | Side::DiallingHost => false,
    }
}

/// Streams a peer may open on an accepted connection before its certificate is read, and all a
/// host ever may: a host sends one report at a time (the writers table lets it send nothing
/// else). Replicas and operators get `streams_per_connection_max` once they are known
/// ([`streams_for`]).
pub const streams_unproven: u32 = 16;

/// Streams a host may have open at once on one connection once it is known to be a host: it sends
/// one report at a time, and a hostile host's concurrent frames (each up to
/// `report_frame_bytes_max`) are what its connections times this allow (issue 23).
pub const host_streams_max: u32 = 4;

/// The stream limit a peer of `principal` gets on a connection this endpoint accepted.
pub(crate) fn streams_for(principal: &crate::Principal, config: &CheckedConfig) -> u32 {
    match principal {
        crate::Principal::Host(_) => host_streams_max.min(config.streams_per_connection_max()),
        crate::Principal::Replica(_) | crate::Principal::Operator(_) => {
            config.streams_per_connection_max()
        }
    }
}

/// QUIC transport parameters for one side: timeouts from the checked config, stream credit, and
/// whether sends may use GSO ([`gso_on`]).
///
/// quinn keeps a slot for every stream id the peer may open, from the connection's start: 2 ×
/// 256 ids cost a connection about 33 KiB, 330 MiB for a leader dialling 10,000 hosts (measured
/// with heaptrack, decision 0282). So a dialled connection lets the peer open none (nothing on
/// it is served: `serve.rs` accepts streams only on accepted connections), and an accepted one
/// starts at [`streams_unproven`] and is raised for replicas and operators after the handshake.
pub(crate) fn transport_config(config: &CheckedConfig, side: Side) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    let streams = match side {
        Side::Dialling | Side::DiallingHost => quinn::VarInt::from_u32(0),
        Side::Serving => {
            quinn::VarInt::from_u32(streams_unproven.min(config.streams_per_connection_max()))
        }
    };
    t.max_concurrent_bidi_streams(streams);
    t.max_concurrent_uni_streams(streams);
    // The idle timeout is checked to be at most an hour, far inside QUIC's 2^62 ms limit.
    t.max_idle_timeout(quinn::IdleTimeout::try_from(config.idle_timeout()).ok());
    t.keep_alive_interval(Some(config.keep_alive()));
    t.enable_segmentation_offload(gso_on(side));
    Arc::new(t)
}

/// The server side of an identity, fixed at the values given: requires a client certificate
/// chaining to its CA and naming a principal.
pub fn server_config(
    identity: &Identity,
    config: &CheckedConfig,
) -> Result<quinn::ServerConfig, TlsError> {
    server_config_live(Arc::new(identity.live()?), config)
}

/// The server side reading `live` at every handshake: a reload or a new deny list takes effect
/// on the next connection.
pub fn server_config_live(
    live: Arc<Live>,
    config: &CheckedConfig,
) -> Result<quinn::ServerConfig, TlsError> {
    server_config_alpn(live, config, alpn_protocols())
}

/// [`server_config`] offering exactly `alpn`: tests stand up a peer of another framing
/// (an older release's `mesh/1` only, or one this build does not speak) with it.
pub fn server_config_offering(
    identity: &Identity,
    config: &CheckedConfig,
    alpn: &[&[u8]],
) -> Result<quinn::ServerConfig, TlsError> {
    let alpn = alpn.iter().map(|p| p.to_vec()).collect();
    server_config_alpn(Arc::new(identity.live()?), config, alpn)
}

fn server_config_alpn(
    live: Arc<Live>,
    config: &CheckedConfig,
    alpn: Vec<Vec<u8>>,
) -> Result<quinn::ServerConfig, TlsError> {
    let err = |reason: String| TlsError::Config {
        side: "server",
        reason,
    };
    let verifier = Arc::new(MeshClientVerifier { live: live.clone() });
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| err(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(LiveCert { live }));
    // No resumption: a resumed session skips certificate verification, so a peer revoked (or
    // whose CA left the trusted set) after its first handshake would get back in on a ticket.
    tls.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    tls.send_tls13_tickets = 0;
    tls.alpn_protocols = alpn;
    let quic = QuicServerConfig::try_from(tls).map_err(|e| err(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(quic));
    server.transport_config(transport_config(config, Side::Serving));
    Ok(server)
}

/// The dialling side of an identity, fixed at the values given.
pub fn client_config(
    identity: &Identity,
    config: &CheckedConfig,
) -> Result<quinn::ClientConfig, TlsError> {
    client_config_live(Arc::new(identity.live()?), config)
}

/// The dialling side from raw parts, whatever the certificate names. Tools and tests use it to
/// present a certificate the server must refuse, or to write raw bytes on a stream.
pub fn client_config_from_parts(
    ca: &CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    config: &CheckedConfig,
) -> Result<quinn::ClientConfig, TlsError> {
    let live = Live::from_parts(std::slice::from_ref(ca), chain, key)?;
    client_config_live(Arc::new(live), config)
}

/// [`client_config_from_parts`] offering exactly `alpn`: tests dial as a peer of another
/// framing (an older release's `mesh/1` only, or one this build does not speak).
pub fn client_config_offering(
    ca: &CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    config: &CheckedConfig,
    alpn: &[&[u8]],
) -> Result<quinn::ClientConfig, TlsError> {
    let live = Live::from_parts(std::slice::from_ref(ca), chain, key)?;
    let alpn = alpn.iter().map(|p| p.to_vec()).collect();
    client_config_alpn(Arc::new(live), config, alpn)
}

/// The dialling side reading `live` at every handshake.
pub fn client_config_live(
    live: Arc<Live>,
    config: &CheckedConfig,
) -> Result<quinn::ClientConfig, TlsError> {
    client_config_alpn(live, config, alpn_protocols())
}

fn client_config_alpn(
    live: Arc<Live>,
    config: &CheckedConfig,
    alpn: Vec<Vec<u8>>,
) -> Result<quinn::ClientConfig, TlsError> {
    let err = |reason: String| TlsError::Config {
        side: "client",
        reason,
    };
    let verifier = Arc::new(MeshServerVerifier { live: live.clone() });
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| err(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(LiveCert { live }));
    // Every dial verifies the server in full (see server_config_live).
    tls.resumption = rustls::client::Resumption::disabled();
    tls.alpn_protocols = alpn;
    let quic = QuicClientConfig::try_from(tls).map_err(|e| err(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(quic));
    client.transport_config(transport_config(config, Side::Dialling));
    Ok(client)
}

/// `client` for a dial to a host: the same TLS side, the transport of [`Side::DiallingHost`].
pub(crate) fn to_host(client: &quinn::ClientConfig, config: &CheckedConfig) -> quinn::ClientConfig {
    let mut client = client.clone();
    client.transport_config(transport_config(config, Side::DiallingHost));
    client
}

/// Stateless-reset key derived from the identity's private key, so a process restarted with the
/// same certificate can tell peers at once that their old connection is gone (instead of them
/// waiting out the idle timeout before re-dialling).
pub(crate) struct ResetKey {
    hkdf: &'static dyn rustls::crypto::tls13::Hkdf,
    secret: OkmBlock,
}

const reset_key_label: &[u8] = b"mesh quic stateless reset key v1";

impl ResetKey {
    /// `None` only if the ring provider lost its TLS 1.3 suite; the caller then falls back to a
    /// random key, which costs peers an idle timeout after a restart and nothing else.
    pub(crate) fn from_identity(identity: &Identity) -> Option<ResetKey> {
        let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256.tls13()?;
        let hkdf = suite.hkdf_provider;
        let key = identity.key();
        let derived = hkdf.hmac_sign(&OkmBlock::new(reset_key_label), key.secret_der());
        Some(ResetKey {
            hkdf,
            secret: OkmBlock::new(derived.as_ref()),
        })
    }
}

impl quinn::crypto::HmacKey for ResetKey {
    fn sign(&self, data: &[u8], signature_out: &mut [u8]) {
        let tag = self.hkdf.hmac_sign(&self.secret, data);
        let tag = tag.as_ref();
        let n = signature_out.len().min(tag.len());
        signature_out[..n].copy_from_slice(&tag[..n]);
    }

    fn signature_len(&self) -> usize {
        32
    }

    fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), quinn::crypto::CryptoError> {
        let tag = self.hkdf.hmac_sign(&self.secret, data);
        let tag = tag.as_ref();
        // Compare every byte so the time taken does not reveal where a forgery goes wrong.
        let mut diff = u8::from(tag.len() != signature.len());
        for (a, b) in tag.iter().zip(signature) {
            diff |= a ^ b;
        }
        if diff == 0 {
            Ok(())
        } else {
            Err(quinn::crypto::CryptoError)
        }
    }
}

/// Random 8-byte connection IDs that any restart of this endpoint accepts as possibly its own.
/// quinn's default generator keys its CIDs per process, so a restarted process would silently
/// drop packets of old connections instead of answering them with the stateless reset above.
pub(crate) struct RestartableCids {
    counter: u64,
}

/// Bytes in every connection ID this endpoint issues.
pub const connection_id_bytes: usize = 8;

impl RestartableCids {
    pub(crate) fn new() -> RestartableCids {
        RestartableCids { counter: 0 }
    }
}

impl quinn::ConnectionIdGenerator for RestartableCids {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        let mut bytes = [0u8; connection_id_bytes];
        if rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut bytes)
            .is_err()
        {
            // No system randomness: distinct IDs still matter more than unpredictable ones.
            self.counter = self.counter.wrapping_add(1);
            bytes = self.counter.to_le_bytes();
        }
        quinn::ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        connection_id_bytes
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What quinn was told about GSO for `side`, read off the config it gets.
    fn gso(side: Side) -> bool {
        let config = CheckedConfig::default();
        let shown = format!("{:?}", transport_config(&config, side));
        assert!(
            shown.contains("enable_segmentation_offload"),
            "quinn's config no longer shows the GSO switch: {shown}"
        );
        shown.contains("enable_segmentation_offload: true")
    }

    #[test]
    fn host_connections_keep_a_one_packet_send_buffer_and_replica_dials_keep_gso() {
        // Decision 0325: the leader's 10,000 host connections send without GSO, so quinn's send
        // buffer on each stays one packet; dials to replicas (Raft among them) keep it.
        assert!(
            !gso(Side::Serving),
            "accepted connections send one packet at a time"
        );
        assert!(
            !gso(Side::DiallingHost),
            "a dial to a host sends one packet at a time"
        );
        assert!(gso(Side::Dialling), "a dial to a replica keeps GSO");
    }
}
