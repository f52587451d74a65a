//! QUIC with mutual TLS: the PKI, principals taken from certificates, framed messages, the writers table and fault hooks. Knows nothing of Raft or the domain.

pub mod addr;
pub mod admit;
pub mod config;
pub mod endpoint;
pub mod faults;
pub mod frame;
mod open;
pub mod pki;
pub mod principal;
pub mod ratelog;
pub mod serve;
pub mod stream;
pub mod tls;
pub mod trust;
pub mod version;
pub mod writers;

pub use admit::{CheckedLimits, ConnCounts, ConnLimits, LimitsError};
pub use config::{CheckedConfig, ConfigError, TransportConfig};
pub use endpoint::{BindError, Endpoint, Peer, ReloadError, TransportError};
pub use faults::{Faults, TrackPause};
pub use frame::{Header, Refused, Response};
pub use pki::{Ca, Identity, IssuedCert, PkiError, Validity};
pub use principal::{Principal, PrincipalError, Role};
pub use serve::{BoxFuture, Counts, Handler};
pub use stream::{Part, Sink, Streaming};
pub use trust::{CertInfo, DenyList, Refusal, Revoked};
pub use version::{Framing, Speaks, VersionError};
pub use writers::{Denied, MessageKind, Permissions, permissions_for, report_frame_bytes_max};
