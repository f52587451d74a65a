//! The mesh PKI: a CA made with rcgen, certificates that carry a principal as a URI SAN, PEM files
//! written with tight permissions, and the [`Identity`] an endpoint is built from.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use time::{Duration, OffsetDateTime};

use crate::principal::{Principal, PrincipalError, Role};

/// The DNS name every mesh certificate carries and every dial uses as its TLS server name, so
/// standard webpki name checking works while the principal (not the name) identifies the peer.
pub const server_name: &str = "mesh";

/// Mode of every private key file: owner read/write, nobody else.
pub const key_file_mode: u32 = 0o600;

/// Mode of certificate files: public.
pub const cert_file_mode: u32 = 0o644;

/// Largest PEM file the loader reads, in bytes; a certificate chain is a few KiB.
pub const pem_file_bytes_max: u64 = 1024 * 1024;

/// Why a CA or certificate could not be made, written or loaded.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("could not generate {what}: {reason}")]
    Generate { what: &'static str, reason: String },
    #[error(
        "{path}: already exists; remove it first or write to another directory (mesh never overwrites keys)"
    )]
    Exists { path: String },
    #[error("{path}: could not {action}: {source}")]
    Io {
        path: String,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: key file mode is {mode:o}, readable by others; run `chmod 600 {path}`")]
    KeyExposed { path: String, mode: u32 },
    #[error(
        "{path}: is {len} bytes, over the limit of {max} for a PEM file; is it the right file?"
    )]
    TooLarge { path: String, len: u64, max: u64 },
    #[error("{what}: not valid PEM: {reason}")]
    Pem { what: String, reason: String },
    #[error("{what}: holds no certificate")]
    NoCertificate { what: String },
    #[error(
        "{what}: holds {count} CA certificates; it must hold one, or two while switching CAs (the old and the new)"
    )]
    TooManyCas { what: String, count: usize },
    #[error("{what}: the certificate names no usable principal: {source}")]
    Principal {
        what: String,
        source: PrincipalError,
    },
    #[error("validity ends ({not_after}) before it starts ({not_before}); pick a later end")]
    Validity {
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    },
}

/// When a certificate is valid. Tests use a window in the past to get an expired certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From an hour ago (to allow for clock skew between machines) until `days` from now.
    pub fn days_from_now(days: u32) -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity {
            not_before: now - Duration::hours(1),
            not_after: now + Duration::days(days.into()),
        }
    }

    fn checked(self) -> Result<Validity, PkiError> {
        if self.not_after <= self.not_before {
            return Err(PkiError::Validity {
                not_before: self.not_before,
                not_after: self.not_after,
            });
        }
        Ok(self)
    }
}

fn generate_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |e| PkiError::Generate {
        what,
        reason: e.to_string(),
    }
}

/// The mesh certificate authority: signs every replica, host and operator certificate.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// Makes a new CA with a fresh key.
    pub fn create(validity: Validity) -> Result<Ca, PkiError> {
        let validity = validity.checked()?;
        let key = KeyPair::generate().map_err(generate_err("CA key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "mesh CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        let cert = params
            .self_signed(&key)
            .map_err(generate_err("CA certificate"))?;
        let key_pem = key.serialize_pem();
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA written by [`Ca::write`].
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Ca, PkiError> {
        let cert_pem = read_pem_file(cert_path, false)?;
        let key_pem = read_pem_file(key_path, true)?;
        let what = key_path.display().to_string();
        let key = KeyPair::from_pem(&key_pem).map_err(|e| PkiError::Pem {
            what: what.clone(),
            reason: e.to_string(),
        })?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| PkiError::Pem {
            what: cert_path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(Ca {
            cert_pem,
            key_pem,
            issuer,
        })
    }

    /// Writes the CA certificate (0644) and key (0600); refuses to overwrite either.
    pub fn write(&self, cert_path: &Path, key_path: &Path) -> Result<(), PkiError> {
        write_new_file(key_path, self.key_pem.as_bytes(), key_file_mode)?;
        write_new_file(cert_path, self.cert_pem.as_bytes(), cert_file_mode)
    }

    /// The CA certificate, PEM: what every process trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a certificate naming `principal`, usable both to serve and to dial. It states no
    /// role: an operator's such certificate is one from before roles (decision 0295).
    pub fn issue(&self, principal: &Principal, validity: Validity) -> Result<IssuedCert, PkiError> {
        self.issue_with_role(principal, None, validity)
    }

    /// Issues a certificate naming `principal` and, for an operator, the role it grants
    /// (`mesh://operator/alice?role=viewer`, decision 0295).
    pub fn issue_with_role(
        &self,
        principal: &Principal,
        role: Option<Role>,
        validity: Validity,
    ) -> Result<IssuedCert, PkiError> {
        let uri = principal
            .to_uri_with_role(role)
            .map_err(|source| PkiError::Principal {
                what: format!("the certificate for {principal}"),
                source,
            })?;
        self.issue_with_uris(&principal.to_string(), &[uri], validity)
    }

    /// Issues a certificate carrying exactly these URI SANs, checked by nobody. Only for tests
    /// that need a certificate without a principal, or with a malformed one.
    pub fn issue_with_uris(
        &self,
        common_name: &str,
        uris: &[String],
        validity: Validity,
    ) -> Result<IssuedCert, PkiError> {
        let validity = validity.checked()?;
        let key = KeyPair::generate().map_err(generate_err("certificate key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        let dns = server_name.try_into().map_err(generate_err("DNS SAN"))?;
        params.subject_alt_names = vec![SanType::DnsName(dns)];
        for uri in uris {
            let uri = uri.as_str().try_into().map_err(generate_err("URI SAN"))?;
            params.subject_alt_names.push(SanType::URI(uri));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generate_err("certificate"))?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A certificate and its private key, as PEM, fresh from [`Ca::issue`].
pub struct IssuedCert {
    cert_pem: String,
    key_pem: String,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert").finish_non_exhaustive()
    }
}

impl IssuedCert {
    /// Writes the certificate (0644) and key (0600); refuses to overwrite either.
    pub fn write(&self, cert_path: &Path, key_path: &Path) -> Result<(), PkiError> {
        write_new_file(key_path, self.key_pem.as_bytes(), key_file_mode)?;
        write_new_file(cert_path, self.cert_pem.as_bytes(), cert_file_mode)
    }

    /// Replaces the certificate and key files (renewal): each is written beside its target
    /// with its final mode, synced, then renamed over it, key first. A reload that runs between
    /// the two renames finds a key that does not fit the certificate, refuses it and keeps what
    /// it had; the next reload takes both.
    pub fn replace(&self, cert_path: &Path, key_path: &Path) -> Result<(), PkiError> {
        for (path, bytes, mode) in [
            (key_path, self.key_pem.as_bytes(), key_file_mode),
            (cert_path, self.cert_pem.as_bytes(), cert_file_mode),
        ] {
            let mut staged = path.as_os_str().to_owned();
            staged.push(".new");
            let staged = std::path::PathBuf::from(staged);
            // A leftover from an interrupted renewal is ours to replace.
            let _ = fs::remove_file(&staged);
            write_new_file(&staged, bytes, mode)?;
            fs::rename(&staged, path).map_err(|source| PkiError::Io {
                path: path.display().to_string(),
                action: "replace",
                source,
            })?;
            sync_dir(path).map_err(|source| PkiError::Io {
                path: path.display().to_string(),
                action: "fsync the directory of",
                source,
            })?;
        }
        Ok(())
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }
}

/// What an endpoint needs to prove who it is and to check others: the CAs it trusts (every
/// certificate in `ca.pem`: one, or two while switching CAs, decision 0171), its own certificate
/// chain and key, and the principal its certificate names.
pub struct Identity {
    principal: Principal,
    role: Option<Role>,
    cas: Vec<CertificateDer<'static>>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            principal: self.principal.clone(),
            role: self.role,
            cas: self.cas.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// Loads the CA certificate, this process's certificate and its key (which must be 0600).
    pub fn load(ca_cert: &Path, cert: &Path, key: &Path) -> Result<Identity, PkiError> {
        let ca_pem = read_pem_file(ca_cert, false)?;
        let cert_pem = read_pem_file(cert, false)?;
        let key_pem = read_pem_file(key, true)?;
        Identity::from_pem_named(
            [
                &ca_cert.display().to_string(),
                &cert.display().to_string(),
                &key.display().to_string(),
            ],
            &ca_pem,
            &cert_pem,
            &key_pem,
        )
    }

    /// Builds an identity from PEM text (the CA certificate, the certificate, its key).
    pub fn from_pem(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Identity, PkiError> {
        Identity::from_pem_named(
            ["CA certificate", "certificate", "key"],
            ca_pem,
            cert_pem,
            key_pem,
        )
    }

    fn from_pem_named(
        names: [&str; 3],
        ca_pem: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<Identity, PkiError> {
        let [ca_name, cert_name, key_name] = names;
        let mut cas = Vec::new();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            cas.push(cert.map_err(|e| pem_err(ca_name, e))?);
        }
        if cas.is_empty() {
            return Err(PkiError::NoCertificate {
                what: ca_name.to_string(),
            });
        }
        if cas.len() > crate::trust::cas_max {
            return Err(PkiError::TooManyCas {
                what: ca_name.to_string(),
                count: cas.len(),
            });
        }
        let mut chain = Vec::new();
        for cert in CertificateDer::pem_slice_iter(cert_pem.as_bytes()) {
            chain.push(cert.map_err(|e| pem_err(cert_name, e))?);
        }
        let leaf = chain.first().ok_or_else(|| PkiError::NoCertificate {
            what: cert_name.to_string(),
        })?;
        let (principal, role) =
            Principal::from_certificate_with_role(leaf).map_err(|source| PkiError::Principal {
                what: cert_name.to_string(),
                source,
            })?;
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| pem_err(key_name, e))?;
        Ok(Identity {
            principal,
            role,
            cas,
            chain,
            key,
        })
    }

    /// The principal this identity's certificate names.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// The role this identity's certificate states (an operator's, decision 0295); `None` when it
    /// states none.
    pub fn role(&self) -> Option<Role> {
        self.role
    }

    /// The CA certificates this identity trusts.
    pub fn cas(&self) -> &[CertificateDer<'static>] {
        &self.cas
    }

    /// This identity's certificate: principal, serial, expiry.
    pub fn cert_info(&self) -> Option<crate::trust::CertInfo> {
        let leaf = self.chain.first()?;
        crate::trust::CertInfo::from_der(leaf).ok()
    }

    /// The live trust and credentials an endpoint serves and dials with.
    pub(crate) fn live(&self) -> Result<crate::trust::Live, crate::tls::TlsError> {
        crate::trust::Live::from_parts(&self.cas, self.chain(), self.key())
    }

    pub(crate) fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.chain.clone()
    }

    pub(crate) fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }
}

fn pem_err(what: &str, e: rustls_pki_types::pem::Error) -> PkiError {
    PkiError::Pem {
        what: what.to_string(),
        reason: e.to_string(),
    }
}

/// Creates `path` with `mode` from the first instant (never wider, even briefly), atomically and
/// durably, and refuses to replace an existing file: the bytes go to `.<name>.mesh-tmp` beside it,
/// are synced, and appear under `path` by a hard link, which fails when something is there; then
/// the directory is synced. (The same steps as the mesh crate's `durable::write_new`, which this
/// crate sits below.)
fn write_new_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PkiError> {
    let shown = || path.display().to_string();
    let io = |action: &'static str| {
        move |source| PkiError::Io {
            path: shown(),
            action,
            source,
        }
    };
    let mut name = std::ffi::OsString::from(".");
    // allow(empty-on-error): no file name (`/`, `..`): still a hidden name, and the link fails
    name.push(path.file_name().unwrap_or_default());
    name.push(".mesh-tmp");
    let tmp = path.with_file_name(name);
    // A leftover from a crash may carry an older mode; start from nothing.
    if let Err(e) = fs::remove_file(&tmp)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(io("remove a leftover beside")(e));
    }
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut file| file.write_all(bytes).and_then(|()| file.sync_all()));
    let linked = written.and_then(|()| fs::hard_link(&tmp, path));
    // allow(empty-on-error): the temp name is ours; a failed removal leaves a hidden file the next write removes
    let _ = fs::remove_file(&tmp);
    linked.map_err(|source| match source.kind() {
        std::io::ErrorKind::AlreadyExists => PkiError::Exists { path: shown() },
        _ => io("create")(source),
    })?;
    sync_dir(path).map_err(io("fsync the directory of"))
}

/// fsyncs the directory holding `path`, so a new name in it survives a crash.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::File::open(dir).and_then(|d| d.sync_all())
}

fn read_pem_file(path: &Path, secret: bool) -> Result<String, PkiError> {
    let shown = || path.display().to_string();
    let meta = fs::metadata(path).map_err(|source| PkiError::Io {
        path: shown(),
        action: "read metadata of",
        source,
    })?;
    if meta.len() > pem_file_bytes_max {
        return Err(PkiError::TooLarge {
            path: shown(),
            len: meta.len(),
            max: pem_file_bytes_max,
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if secret && mode & 0o077 != 0 {
        return Err(PkiError::KeyExposed {
            path: shown(),
            mode,
        });
    }
    fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: shown(),
        action: "read",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_cert_names_its_principal_and_key_file_is_private() {
        // G10: the principal lives in the certificate; keys are never world-readable.
        let dir = tempfile::tempdir().expect("must succeed");
        let ca = Ca::create(Validity::days_from_now(1)).expect("must succeed");
        let host = Principal::Host("ace".into());
        let issued = ca
            .issue(&host, Validity::days_from_now(1))
            .expect("must succeed");
        let (ca_crt, ca_key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        let (crt, key) = (dir.path().join("ace.crt"), dir.path().join("ace.key"));
        ca.write(&ca_crt, &ca_key).expect("must succeed");
        issued.write(&crt, &key).expect("must succeed");
        for k in [&ca_key, &key] {
            let mode = fs::metadata(k).expect("must succeed").permissions().mode() & 0o777;
            assert_eq!(mode, key_file_mode);
        }
        let identity = Identity::load(&ca_crt, &crt, &key).expect("must succeed");
        assert_eq!(identity.principal(), &host);
        assert!(matches!(
            issued.write(&crt, &key),
            Err(PkiError::Exists { .. })
        ));
    }

    #[test]
    fn loaded_ca_issues_certificates_that_chain_to_it() {
        // PKI: a CA written to disk and loaded back still issues certificates.
        let dir = tempfile::tempdir().expect("must succeed");
        let ca = Ca::create(Validity::days_from_now(1)).expect("must succeed");
        let (ca_crt, ca_key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        ca.write(&ca_crt, &ca_key).expect("must succeed");
        let loaded = Ca::load(&ca_crt, &ca_key).expect("must succeed");
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        let issued = loaded
            .issue(&Principal::Replica(2), Validity::days_from_now(1))
            .expect("must succeed");
        let identity = Identity::from_pem(ca.cert_pem(), issued.cert_pem(), issued.key_pem())
            .expect("must succeed");
        assert_eq!(identity.principal(), &Principal::Replica(2));
    }

    #[test]
    fn exposed_key_file_is_refused_with_the_fix() {
        // PKI: private keys are never world-readable, even when loaded.
        let dir = tempfile::tempdir().expect("must succeed");
        let ca = Ca::create(Validity::days_from_now(1)).expect("must succeed");
        let (crt, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        ca.write(&crt, &key).expect("must succeed");
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).expect("must succeed");
        let err = Ca::load(&crt, &key).expect_err("must fail");
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn certificate_without_principal_does_not_make_an_identity() {
        // G10: no identity without a principal.
        let ca = Ca::create(Validity::days_from_now(1)).expect("must succeed");
        let bare = ca
            .issue_with_uris("nobody", &[], Validity::days_from_now(1))
            .expect("must succeed");
        let err = Identity::from_pem(ca.cert_pem(), bare.cert_pem(), bare.key_pem())
            .expect_err("must fail");
        assert!(matches!(
            err,
            PkiError::Principal {
                source: PrincipalError::Missing,
                ..
            }
        ));
    }
}
