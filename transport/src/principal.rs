//! Who is on the other end of a connection: a principal, read from the peer certificate's
//! `mesh://` URI SAN and never from anything the peer says on the wire; for an operator, also the
//! role the certificate grants (`mesh://operator/alice?role=viewer`, decision 0295).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use x509_parser::extensions::GeneralName;

/// Longest host or operator name, in bytes; keeps names readable in logs and paths.
pub const name_bytes_max: usize = 63;

/// The scheme every principal URI SAN starts with.
pub const uri_scheme: &str = "mesh://";

/// The query an operator certificate's URI SAN states its role in: `?role=viewer`.
pub const role_query: &str = "role=";

/// What an operator's certificate lets it ask (decision 0295). Ordered: each role may ask
/// everything the one before it may. Which request needs which role is decided by the mesh
/// crate (`controller::roles`); the transport only reads the role from the certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    /// Reads: status, plan, history, logs, settings show, certs and replicas list.
    Viewer,
    /// A viewer's reads, plus changes to the model and its hosts: apply, settings, push,
    /// machines add.
    Operator,
    /// Everything: also certificates, membership and backups.
    Admin,
}

impl Role {
    pub const all: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = PrincipalError;

    fn from_str(text: &str) -> Result<Role, PrincipalError> {
        for role in Role::all {
            if role.name() == text {
                return Ok(role);
            }
        }
        Err(PrincipalError::BadRole {
            text: text.to_string(),
        })
    }
}

/// An authenticated peer: a controller replica, a machine's agent, or a human operator.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Principal {
    Replica(u64),
    Host(String),
    Operator(String),
}

/// Why a string or certificate does not name a principal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    #[error(
        "principal `{text}` is not one of replica:<id>, host:<name>, operator:<name> (or mesh://replica/<id> …); fix the certificate or config"
    )]
    Malformed { text: String },
    #[error(
        "principal name `{name}` must be 1..={max} characters of [a-z0-9-]; reissue the certificate with such a name",
        max = name_bytes_max
    )]
    BadName { name: String },
    #[error("certificate could not be parsed: {reason}; it is not a valid X.509 certificate")]
    BadCertificate { reason: String },
    #[error(
        "certificate carries no mesh:// URI SAN, so it names no principal; issue it with `meshctl` (pki::Ca::issue)"
    )]
    Missing,
    #[error(
        "certificate carries {count} mesh:// URI SANs; exactly one is allowed so the principal is unambiguous"
    )]
    Ambiguous { count: usize },
    #[error(
        "role `{text}` is not one of viewer, operator, admin (written `?role=viewer` after the operator's name); reissue the certificate with `meshctl certs issue operator:<name> --role <role>`"
    )]
    BadRole { text: String },
    #[error(
        "{principal}'s certificate states a role; only an operator certificate carries one; reissue it without `?role=`"
    )]
    RoleNotOperator { principal: Principal },
}

impl Principal {
    /// The URI SAN form written into certificates: `mesh://replica/1`.
    pub fn to_uri(&self) -> String {
        match self {
            Principal::Replica(id) => format!("{uri_scheme}replica/{id}"),
            Principal::Host(name) => format!("{uri_scheme}host/{name}"),
            Principal::Operator(name) => format!("{uri_scheme}operator/{name}"),
        }
    }

    /// The URI SAN form with a role: `mesh://operator/alice?role=viewer`; `None` writes no role
    /// (the form certificates had before roles). A role only goes with an operator.
    pub fn to_uri_with_role(&self, role: Option<Role>) -> Result<String, PrincipalError> {
        match (self, role) {
            (_, None) => Ok(self.to_uri()),
            (Principal::Operator(_), Some(role)) => {
                Ok(format!("{}?{role_query}{role}", self.to_uri()))
            }
            (other, Some(_)) => Err(PrincipalError::RoleNotOperator {
                principal: other.clone(),
            }),
        }
    }

    /// Parses the URI SAN form `mesh://<kind>/<name>`, with or without a role.
    pub fn from_uri(uri: &str) -> Result<Principal, PrincipalError> {
        Principal::from_uri_with_role(uri).map(|(principal, _)| principal)
    }

    /// Parses `mesh://<kind>/<name>`, or `mesh://operator/<name>?role=<role>`: the principal, and
    /// the role if the URI states one. Anything after `?` other than exactly one known role of an
    /// operator is refused by name.
    pub fn from_uri_with_role(uri: &str) -> Result<(Principal, Option<Role>), PrincipalError> {
        let malformed = || PrincipalError::Malformed {
            text: uri.to_string(),
        };
        let (path, query) = match uri.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (uri, None),
        };
        let rest = path.strip_prefix(uri_scheme).ok_or_else(malformed)?;
        let (kind, name) = rest.split_once('/').ok_or_else(malformed)?;
        let principal = Principal::from_parts(kind, name).map_err(|e| match e {
            PrincipalError::Malformed { .. } => malformed(),
            other => other,
        })?;
        let Some(query) = query else {
            return Ok((principal, None));
        };
        let role: Role = query
            .strip_prefix(role_query)
            .ok_or_else(|| PrincipalError::BadRole {
                text: query.to_string(),
            })?
            .parse()?;
        match principal {
            Principal::Operator(_) => Ok((principal, Some(role))),
            other => Err(PrincipalError::RoleNotOperator { principal: other }),
        }
    }

    /// Reads the principal from a DER certificate: exactly one `mesh://` URI SAN.
    pub fn from_certificate(der: &[u8]) -> Result<Principal, PrincipalError> {
        Principal::from_certificate_with_role(der).map(|(principal, _)| principal)
    }

    /// Reads the principal and the role it states (an operator's, decision 0295) from a DER
    /// certificate: exactly one `mesh://` URI SAN.
    pub fn from_certificate_with_role(
        der: &[u8],
    ) -> Result<(Principal, Option<Role>), PrincipalError> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| {
            PrincipalError::BadCertificate {
                reason: e.to_string(),
            }
        })?;
        let san = cert
            .subject_alternative_name()
            .map_err(|e| PrincipalError::BadCertificate {
                reason: e.to_string(),
            })?;
        let Some(san) = san else {
            return Err(PrincipalError::Missing);
        };
        let mut uris = Vec::new();
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name
                && uri.starts_with(uri_scheme)
            {
                uris.push(*uri);
            }
        }
        match uris.as_slice() {
            [] => Err(PrincipalError::Missing),
            [uri] => Principal::from_uri_with_role(uri),
            more => Err(PrincipalError::Ambiguous { count: more.len() }),
        }
    }

    fn from_parts(kind: &str, name: &str) -> Result<Principal, PrincipalError> {
        let malformed = || PrincipalError::Malformed {
            text: format!("{kind}:{name}"),
        };
        match kind {
            "replica" => {
                let id: u64 = name.parse().map_err(|_| malformed())?;
                // Only the canonical spelling, so one replica has one name ("01" is not "1").
                if id.to_string() != name {
                    return Err(malformed());
                }
                Ok(Principal::Replica(id))
            }
            "host" => Ok(Principal::Host(checked_name(name)?)),
            "operator" => Ok(Principal::Operator(checked_name(name)?)),
            _ => Err(malformed()),
        }
    }
}

fn checked_name(name: &str) -> Result<String, PrincipalError> {
    let good = !name.is_empty()
        && name.len() <= name_bytes_max
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if good {
        Ok(name.to_string())
    } else {
        Err(PrincipalError::BadName {
            name: name.to_string(),
        })
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Replica(id) => write!(f, "replica:{id}"),
            Principal::Host(name) => write!(f, "host:{name}"),
            Principal::Operator(name) => write!(f, "operator:{name}"),
        }
    }
}

/// Parses the display form `replica:1`, `host:ace`, `operator:alice` (as written in configs).
impl FromStr for Principal {
    type Err = PrincipalError;

    fn from_str(text: &str) -> Result<Principal, PrincipalError> {
        let (kind, name) = text
            .split_once(':')
            .ok_or_else(|| PrincipalError::Malformed {
                text: text.to_string(),
            })?;
        Principal::from_parts(kind, name).map_err(|e| match e {
            PrincipalError::Malformed { .. } => PrincipalError::Malformed {
                text: text.to_string(),
            },
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_uri_forms_round_trip() {
        // G10: a principal has one spelling in logs and one in certificates.
        let all = [
            Principal::Replica(1),
            Principal::Host("ace".into()),
            Principal::Operator("alice".into()),
        ];
        let shown = ["replica:1", "host:ace", "operator:alice"];
        let uris = [
            "mesh://replica/1",
            "mesh://host/ace",
            "mesh://operator/alice",
        ];
        for ((p, s), u) in all.iter().zip(shown).zip(uris) {
            assert_eq!(p.to_string(), s);
            assert_eq!(p.to_uri(), u);
            assert_eq!(&s.parse::<Principal>().expect("must succeed"), p);
            assert_eq!(&Principal::from_uri(u).expect("must succeed"), p);
        }
    }

    #[test]
    fn names_outside_lowercase_digits_and_dash_are_refused() {
        // G10: names are plain so a principal cannot impersonate another by spelling.
        for bad in [
            "host:Ace",
            "host:",
            "host:a_b",
            "host:a/b",
            "operator:al ice",
            "host:é",
        ] {
            assert!(bad.parse::<Principal>().is_err(), "{bad} accepted");
        }
        let long = format!("host:{}", "a".repeat(name_bytes_max + 1));
        assert!(long.parse::<Principal>().is_err());
        for bad in [
            "replica:01",
            "replica:-1",
            "replica:x",
            "machine:ace",
            "ace",
        ] {
            assert!(bad.parse::<Principal>().is_err(), "{bad} accepted");
        }
        assert!(Principal::from_uri("https://host/ace").is_err());
        assert!(Principal::from_uri("mesh://host/ace/x").is_err());
    }

    #[test]
    fn g10_an_operator_role_is_read_from_the_uri_and_a_bad_one_is_refused_by_name() {
        // G10, decision 0295: the role is part of the one URI SAN; a certificate without one
        // (issued before roles) still names its principal, with no role stated.
        let alice = Principal::Operator("alice".into());
        for role in Role::all {
            let uri = alice.to_uri_with_role(Some(role)).expect("operator role");
            assert_eq!(uri, format!("mesh://operator/alice?role={role}"));
            assert_eq!(
                Principal::from_uri_with_role(&uri),
                Ok((alice.clone(), Some(role)))
            );
            assert_eq!(Principal::from_uri(&uri), Ok(alice.clone()));
        }
        assert_eq!(
            Principal::from_uri_with_role("mesh://operator/alice"),
            Ok((alice.clone(), None))
        );
        for (bad, named) in [
            ("mesh://operator/alice?role=root", "root"),
            ("mesh://operator/alice?role=Viewer", "Viewer"),
            ("mesh://operator/alice?role=", ""),
            ("mesh://operator/alice?", ""),
            ("mesh://operator/alice?roles=viewer", "roles=viewer"),
            (
                "mesh://operator/alice?role=viewer&role=admin",
                "viewer&role=admin",
            ),
        ] {
            let got = Principal::from_uri_with_role(bad);
            assert_eq!(
                got,
                Err(PrincipalError::BadRole { text: named.into() }),
                "{bad}"
            );
            let text = got.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(text.contains("viewer, operator, admin"), "{text}");
            assert!(Principal::from_uri(bad).is_err(), "{bad} accepted");
        }
        for not_operator in ["mesh://host/ace?role=admin", "mesh://replica/1?role=viewer"] {
            assert!(
                matches!(
                    Principal::from_uri_with_role(not_operator),
                    Err(PrincipalError::RoleNotOperator { .. })
                ),
                "{not_operator}"
            );
        }
        assert!(
            Principal::Host("ace".into())
                .to_uri_with_role(Some(Role::Admin))
                .is_err()
        );
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
    }

    #[test]
    fn certificate_with_two_or_malformed_principals_names_nobody() {
        // G10: exactly one well-formed mesh:// URI SAN, or no principal at all.
        use crate::pki::{Ca, Validity};
        let ca = Ca::create(Validity::days_from_now(1)).expect("CA");
        let der = |uris: &[&str]| {
            let uris: Vec<String> = uris.iter().map(|u| u.to_string()).collect();
            let issued = ca
                .issue_with_uris("test", &uris, Validity::days_from_now(1))
                .expect("issue");
            rustls_pki_types::pem::PemObject::from_pem_slice(issued.cert_pem().as_bytes())
                .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
                .expect("pem")
        };
        let two = der(&["mesh://host/ace", "mesh://host/g14"]);
        assert_eq!(
            Principal::from_certificate(&two),
            Err(PrincipalError::Ambiguous { count: 2 })
        );
        let bad = der(&["mesh://host/Ace"]);
        assert!(matches!(
            Principal::from_certificate(&bad),
            Err(PrincipalError::BadName { .. })
        ));
        let other_scheme_too = der(&["https://example.org", "mesh://operator/alice"]);
        assert_eq!(
            Principal::from_certificate(&other_scheme_too),
            Ok(Principal::Operator("alice".into()))
        );
        let bad_role = der(&["mesh://operator/alice?role=root"]);
        assert!(matches!(
            Principal::from_certificate(&bad_role),
            Err(PrincipalError::BadRole { .. })
        ));
        let viewer = der(&["mesh://operator/alice?role=viewer"]);
        assert_eq!(
            Principal::from_certificate_with_role(&viewer),
            Ok((Principal::Operator("alice".into()), Some(Role::Viewer)))
        );
        assert!(Principal::from_certificate(b"not a certificate").is_err());
    }
}
