//! A mesh PKI for tests: one CA, and the replica, host and operator identities it issues, in memory
//! or as PEM files under the PKI's directory (a temp dir of its own unless the test names one).

use std::path::{Path, PathBuf};

use mesh_transport::{Ca, Identity, IssuedCert, Principal, Role, Validity};

/// How long every test certificate is valid.
pub const validity_days: u32 = 1;

/// A CA whose certificate is at [`Pki::ca_path`], issuing identities and certificate files.
pub struct Pki {
    pub ca: Ca,
    /// Holds `ca.pem` and one sub-directory per [`Pki::write`].
    pub dir: PathBuf,
    // Removed with the PKI when it made its own directory.
    _tmp: Option<tempfile::TempDir>,
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

impl Pki {
    /// A new CA in a temp dir of its own, removed when the PKI is dropped.
    pub fn new() -> Pki {
        let tmp = tempfile::tempdir().expect("a temp dir for the test PKI");
        let mut pki = Pki::in_dir(tmp.path());
        pki._tmp = Some(tmp);
        pki
    }

    /// A new CA whose files go under `dir` (made if missing; the test owns it).
    pub fn in_dir(dir: &Path) -> Pki {
        let ca = Ca::create(Validity::days_from_now(validity_days)).expect("create the test CA");
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("create PKI dir {}: {e}", dir.display()));
        let pki = Pki {
            ca,
            dir: dir.to_path_buf(),
            _tmp: None,
        };
        std::fs::write(pki.ca_path(), pki.ca.cert_pem())
            .unwrap_or_else(|e| panic!("write {}: {e}", pki.ca_path().display()));
        pki
    }

    /// The CA certificate's PEM file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A certificate and key for `principal`, issued now.
    pub fn issue(&self, principal: &Principal) -> IssuedCert {
        self.ca
            .issue(principal, Validity::days_from_now(validity_days))
            .unwrap_or_else(|e| panic!("issue a certificate for {principal}: {e}"))
    }

    /// An identity for `principal`, in memory. An operator's states no role (a certificate from
    /// before roles: it may ask everything, decision 0295).
    pub fn identity(&self, principal: &Principal) -> Identity {
        let issued = self.issue(principal);
        Identity::from_pem(self.ca.cert_pem(), issued.cert_pem(), issued.key_pem())
            .unwrap_or_else(|e| panic!("identity for {principal}: {e}"))
    }

    /// An identity for operator `name` whose certificate states `role` (decision 0295).
    pub fn operator_identity(&self, name: &str, role: Role) -> Identity {
        let principal = operator(name);
        let issued = self
            .ca
            .issue_with_role(
                &principal,
                Some(role),
                Validity::days_from_now(validity_days),
            )
            .unwrap_or_else(|e| panic!("issue a {role} certificate for {principal}: {e}"));
        Identity::from_pem(self.ca.cert_pem(), issued.cert_pem(), issued.key_pem())
            .unwrap_or_else(|e| panic!("identity for {principal} ({role}): {e}"))
    }

    /// Writes a certificate and key for `principal` as `<dir>/<sub>/cert.pem` and `key.pem`;
    /// returns (cert, key) paths.
    pub fn write(&self, sub: &str, principal: &Principal) -> (PathBuf, PathBuf) {
        let files = self.write_to(&self.dir.join(sub), principal);
        (files.cert, files.key)
    }

    /// Writes the CA certificate and a certificate and key for `principal` under `dir` (made if
    /// missing), for a process whose files must outlive this PKI.
    pub fn write_to(&self, dir: &Path, principal: &Principal) -> TlsFiles {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let files = TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        std::fs::write(&files.ca, self.ca.cert_pem())
            .unwrap_or_else(|e| panic!("write {}: {e}", files.ca.display()));
        self.issue(principal)
            .write(&files.cert, &files.key)
            .unwrap_or_else(|e| panic!("write {}: {e}", files.cert.display()));
        files
    }
}

/// Where [`Pki::write_to`] put a CA certificate and one identity.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Replica `id`'s principal.
pub fn replica(id: u64) -> Principal {
    Principal::Replica(id)
}

/// Machine `name`'s host principal.
pub fn host(name: &str) -> Principal {
    Principal::Host(name.to_string())
}

/// Operator `name`'s principal.
pub fn operator(name: &str) -> Principal {
    Principal::Operator(name.to_string())
}
