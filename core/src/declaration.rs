//! A declaration: everything one machine should be. Canonically encoded; its digest never covers the
//! epoch, so the same declaration sent by two leaders has one digest.

use super::flat::FlatMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::model::{Mount, Placement, Probe};

/// blake3 of a declaration's canonical bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The first 12 hex characters, for one-line output.
    pub fn short(&self) -> String {
        let mut s = self.to_string();
        s.truncate(12);
        s
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

/// Everything one machine should run. Modules are sorted by name; every map is ordered, so encoding
/// is canonical.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declaration {
    pub machine: String,
    pub modules: Vec<DeclaredModule>,
    /// The mesh's deny list (decision 0172): `serial:<hex>` or `principal:<kind>:<name>` → why.
    /// The host refuses these certificates (replicas, operators) at its next handshake.
    pub revoked: BTreeMap<String, String>,
    /// Envelope keys of replicas added to the cluster after `meshctl init` (decision 0230):
    /// replica id → ed25519 verifying key. The host trusts them beside its own `trusted_keys`
    /// once it applied this declaration, so a replica's key arrives before that replica can lead.
    pub signers: BTreeMap<u64, [u8; 32]>,
}

/// The replicas a deny list retires (issue 27, decision 0294): every `principal:replica:<id>`
/// row. A retired replica's signing key is trusted by no host and no controller, whatever the
/// epoch it signs and whatever `host.toml` says; its certificate is refused at the handshake.
pub fn retired_replicas(revoked: &BTreeMap<String, String>) -> std::collections::BTreeSet<u64> {
    revoked
        .keys()
        // allow(empty-on-error): a row the store kept parsed as a principal; any other is no replica
        .filter_map(|key| key.strip_prefix("principal:replica:")?.parse().ok())
        .collect()
}

/// One module as its machine should run it, with effective settings and its provisions and grants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredModule {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: FlatMap<String, String>,
    /// Effective settings for this placement (mesh < machine < module < module@machine).
    pub settings: BTreeMap<String, String>,
    /// Relative path → content.
    pub files: FlatMap<String, String>,
    pub mounts: Vec<Mount>,
    pub ready: Option<Probe>,
    pub after: Vec<String>,
    /// Provisions this module consumes, with their secrets, sorted by id.
    pub provisions: Vec<ProvisionRef>,
    /// Provisions issued from this module as provider, sorted by id: never the secret, only its hash.
    pub grants: Vec<Grant>,
}

/// What a consumer gets of a provision: the secret, and where the provider listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisionRef {
    pub id: String,
    pub kind: String,
    pub provider: Placement,
    pub name: String,
    pub secret: String,
    /// `address:port` of the provider, when it declares a port; the consumer waits for it (G12).
    pub endpoint: Option<String>,
}

/// What a provider gets of a provision issued from it: a pure read, with the secret's blake3 hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub id: String,
    pub kind: String,
    pub consumer: Placement,
    pub name: String,
    pub secret_blake3: String,
}
