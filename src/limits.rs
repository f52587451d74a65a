//! Limits that must agree end to end (issue 23, decision 0298): the largest envelope frame a model
//! within `validate`'s rules can give a host, checked against every replica's and host's
//! `frame_bytes_max` when its config is loaded, and the size of one envelope's frame, which the
//! push checks before it records the send; and the leader's silence threshold against the hosts'
//! report intervals (decision 0301).

use mesh_transport::CheckedConfig;
use mesh_transport::principal::name_bytes_max as principal_name_bytes_max;

use crate::core::envelope::{Envelope, sealed_bytes_len};
use crate::core::validate::declaration_bytes_max;
use crate::store::revoked::{deny_entries_max, serial_hex_max, why_bytes_max};
use crate::store::signers::signers_max;

/// Longest key of a deny-list row, in bytes: `principal:operator:` and a principal name of
/// [`principal_name_bytes_max`], longer than `serial:` and [`serial_hex_max`] hex digits.
pub const deny_key_bytes_max: usize = {
    let principal = "principal:operator:".len() + principal_name_bytes_max;
    let serial = "serial:".len() + serial_hex_max;
    if principal > serial {
        principal
    } else {
        serial
    }
};

/// Most bytes the deny list adds to a declaration, encoded: [`deny_entries_max`] rows, each a
/// key and a why with their length prefixes (one byte under 251, three up to 65,535), and the
/// map's own length prefix.
pub const deny_list_bytes_max: usize =
    9 + deny_entries_max * (1 + deny_key_bytes_max + 3 + why_bytes_max);

/// Most bytes the added replicas' keys add to a declaration, encoded: [`signers_max`] ids (up to
/// 9 bytes each) with a 32-byte key, and the map's length prefix.
pub const signers_bytes_max: usize = 9 + signers_max * (9 + 32);

/// Most bytes an envelope's frame adds around its declaration: the machine name, epoch, sequence
/// and signer, the `--move` list (room for 1,000 module names), the two 64-byte signatures and the
/// length prefixes of the sealed envelope, and the frame header (version, kind, body length). The
/// push counts the real size of every envelope ([`envelope_frame_bytes`]); this bounds it.
pub const envelope_wrapping_bytes_max: usize = 64 * 1024;

/// Largest frame an envelope of a valid model can need, in bytes: a declaration of
/// [`declaration_bytes_max`] with the fullest deny list and every signer, wrapped. Every
/// replica's and host's `frame_bytes_max` must be at least this ([`check_frame_limit`], at
/// load), so whatever `validate` accepts can be delivered; about 7.5 MiB, under the default
/// 16 MiB frame.
pub const envelope_frame_bytes_max: usize =
    declaration_bytes_max + deny_list_bytes_max + signers_bytes_max + envelope_wrapping_bytes_max;

/// Most bytes a request's frame header adds to its body: the body version (up to 3 bytes), the
/// message kind (up to 5) and the body's length prefix (up to 9).
pub const frame_header_bytes_max: usize = 3 + 5 + 9;

const _: () = assert!(envelope_frame_bytes_max < 16 * 1024 * 1024);

// The leader's silence threshold counts the hosts' report intervals (decision 0301): its default
// and bounds are `silent_after_intervals` of mesh-host's default and bounds.
const _: () = {
    use crate::controller::{
        silent_after_intervals, silent_after_ms_default, silent_after_ms_max, silent_after_ms_min,
    };
    use crate::host::config::{
        reconcile_interval_ms_default, reconcile_interval_ms_max, reconcile_interval_ms_min,
    };
    assert!(silent_after_ms_default == silent_after_intervals * reconcile_interval_ms_default);
    assert!(silent_after_ms_min == silent_after_intervals * reconcile_interval_ms_min);
    assert!(silent_after_ms_max == silent_after_intervals * reconcile_interval_ms_max);
};

/// Refuses a transport config whose frames could not carry the largest envelope a valid model
/// gives a host: the replica could record sends it cannot deliver, or the host refuse them.
pub fn check_frame_limit(transport: &CheckedConfig) -> Result<(), String> {
    let max = transport.frame_bytes_max();
    if max >= envelope_frame_bytes_max {
        return Ok(());
    }
    Err(format!(
        "frame_bytes_max = {max} is under the {envelope_frame_bytes_max} bytes the largest envelope of a valid model needs (envelope_frame_bytes_max: a declaration of up to {declaration_bytes_max} bytes, the deny list, the signers and the envelope around them); set frame_bytes_max to at least {envelope_frame_bytes_max} in [transport], on every replica and host"
    ))
}

/// The bytes `envelope`'s frame will have once sealed and sent: the sealed envelope and at most
/// [`frame_header_bytes_max`] of header. Counted without sealing or holding the bytes.
pub fn envelope_frame_bytes(envelope: &Envelope) -> Result<usize, mesh_codec::CodecError> {
    Ok(sealed_bytes_len(envelope)? + frame_header_bytes_max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::declaration::{Declaration, DeclaredModule};
    use crate::core::envelope::seal;
    use crate::core::flat::FlatMap;
    use ed25519_dalek::SigningKey;
    use mesh_transport::{Header, MessageKind, TransportConfig};
    use std::collections::BTreeMap;

    fn module(name: &str, content: usize) -> DeclaredModule {
        let mut files = FlatMap::new();
        files.insert("blob".to_string(), "x".repeat(content));
        DeclaredModule {
            name: name.into(),
            command: "sh".into(),
            args: vec![],
            env: FlatMap::new(),
            settings: BTreeMap::new(),
            files,
            mounts: vec![],
            ready: None,
            after: vec![],
            provisions: vec![],
            grants: vec![],
        }
    }

    /// The largest envelope a valid model can give a host: a declaration's model part of
    /// exactly `declaration_bytes_max`, the fullest deny list with the longest keys and whys,
    /// every signer, a long machine name and a `--move` of 1,000 long module names.
    fn largest_envelope() -> Envelope {
        let machine = "m".repeat(63);
        let mut declaration = Declaration {
            machine: machine.clone(),
            modules: vec![module("big", 0)],
            revoked: BTreeMap::new(),
            signers: BTreeMap::new(),
        };
        let bare = mesh_codec::encoded_len("declaration", &declaration).expect("counts");
        declaration.modules = vec![module("big", declaration_bytes_max - bare - 8)];
        let grown = mesh_codec::encoded_len("declaration", &declaration).expect("counts");
        declaration.modules = vec![module(
            "big",
            declaration_bytes_max - bare - 8 + (declaration_bytes_max - grown),
        )];
        assert_eq!(
            mesh_codec::encoded_len("declaration", &declaration).expect("counts"),
            declaration_bytes_max
        );
        for i in 0..deny_entries_max {
            let key = format!("{i:0>width$}", width = deny_key_bytes_max);
            declaration.revoked.insert(key, "w".repeat(why_bytes_max));
        }
        for id in 0..signers_max as u64 {
            declaration.signers.insert(u64::MAX - id, [7; 32]);
        }
        Envelope {
            machine,
            epoch: 1 << 48,
            sequence: 1 << 48,
            signer: u64::MAX,
            moves: (0..1000).map(|i| format!("{i:0>63}")).collect(),
            declaration,
        }
    }

    #[test]
    fn the_largest_envelope_of_a_valid_model_fits_envelope_frame_bytes_max() {
        // Issue 23: the limits agree: what validate accepts, sealed and framed, is within the
        // frame every replica and host must allow, and that is within the default frame.
        let envelope = largest_envelope();
        let sealed = seal(&envelope, &SigningKey::from_bytes(&[1; 32])).expect("seals");
        let frame = mesh_transport::frame::encode_header(&Header::new(
            MessageKind::Envelope,
            sealed.clone(),
        ))
        .expect("encodes");
        assert!(
            frame.len() <= envelope_frame_bytes_max,
            "{} > {envelope_frame_bytes_max}",
            frame.len()
        );
        assert!(frame.len() - sealed.len() <= frame_header_bytes_max);
        assert_eq!(sealed_bytes_len(&envelope).expect("counts"), sealed.len());
        let default = TransportConfig::default().check().expect("valid");
        assert!(envelope_frame_bytes_max <= default.frame_bytes_max());
        assert_eq!(check_frame_limit(&default), Ok(()));
    }

    #[test]
    fn a_frame_limit_under_the_largest_envelope_is_refused_naming_both_numbers() {
        // Issue 23: a replica or host whose frames could not carry a valid model's envelope
        // does not start; the error says the limit, what is needed and what to set.
        let small = TransportConfig {
            frame_bytes_max: (envelope_frame_bytes_max - 1) as u32,
            ..TransportConfig::default()
        }
        .check()
        .expect("in the transport's own range");
        let e = check_frame_limit(&small).expect_err("refused");
        assert!(
            e.starts_with(&format!(
                "frame_bytes_max = {} is under the {envelope_frame_bytes_max} bytes",
                envelope_frame_bytes_max - 1
            )),
            "{e}"
        );
        assert!(e.contains("on every replica and host"), "{e}");
        let exact = TransportConfig {
            frame_bytes_max: envelope_frame_bytes_max as u32,
            ..TransportConfig::default()
        }
        .check()
        .expect("valid");
        assert_eq!(check_frame_limit(&exact), Ok(()));
    }
}
