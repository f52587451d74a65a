//! The one codec: every frame, envelope, Raft entry and table value becomes bytes here and only here.
//!
//! bincode is pinned at `=2.0.1` (see `docs/decisions/0001-bincode-2.0.1.md`); callers see only
//! [`encode`] and [`decode`], so swapping the format later touches this file alone.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest value the codec will decode, in bytes: a replica's snapshot (a model of up to 8 MiB, decision 0298,
/// and up to `staging_bytes_max` of staged uploads, decision 0185) fits. Frames have their own, smaller limit
/// in transport.
pub const value_bytes_max: usize = 512 * 1024 * 1024;

/// Why bytes could not become a value.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("could not encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("could not decode {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("could not decode {what}: {trailing} unexpected bytes after the value")]
    Trailing { what: &'static str, trailing: usize },
    #[error("could not decode {what}: {len} bytes is over the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
}

fn config() -> impl bincode::config::Config {
    config_limited::<{ value_bytes_max }>()
}

fn config_limited<const LIMIT: usize>() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<LIMIT>()
}

/// Decodes from `bytes` with bincode's limit on claimed bytes at the smallest tier at least
/// [`claim_per_input_byte`] times the input's size. bincode allocates a string or byte buffer at
/// the length it claims before it reads it, so a 5-byte input that claims 380 MiB must be refused
/// instead of allocating it (found by `mesh-chaos fuzz`, decision 0201). The budget is a multiple
/// of the input, not the input itself: bincode also counts containers' claims at their size in
/// memory, which is larger than on the wire (a tier equal to the input refused valid proposals).
fn decode_tiered<T: DeserializeOwned>(
    bytes: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    use bincode::serde::decode_from_slice as from;
    const tiers: [usize; 3] = [1 << 20, 16 << 20, 128 << 20];
    let budget = bytes.len().saturating_mul(claim_per_input_byte);
    match tiers.iter().position(|t| budget <= *t) {
        Some(0) => from(bytes, config_limited::<{ tiers[0] }>()),
        Some(1) => from(bytes, config_limited::<{ tiers[1] }>()),
        Some(2) => from(bytes, config_limited::<{ tiers[2] }>()),
        _ => from(bytes, config()),
    }
}

/// How many bytes a decode may claim per byte of input (the fuzz run counts more than
/// 2 MiB + 64 bytes per input byte as a finding).
pub const claim_per_input_byte: usize = 64;

/// Encodes `value` canonically: the same value always gives the same bytes (maps must be ordered).
pub fn encode<T: Serialize + ?Sized>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    // One pass straight into the vector: `encode_to_vec` walks the value twice (size, then write),
    // which is most of a digest's cost on large declarations.
    let mut out = Vec::new();
    bincode::serde::encode_into_std_write(value, &mut out, config()).map_err(|e| {
        CodecError::Encode {
            what,
            reason: e.to_string(),
        }
    })?;
    Ok(out)
}

/// How many bytes [`encode`] would give `value`, counted without holding them: sizing a large
/// value against a limit (a declaration against `declaration_bytes_max`) allocates nothing.
pub fn encoded_len<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<usize, CodecError> {
    let mut counter = Counter(0);
    bincode::serde::encode_into_std_write(value, &mut counter, config()).map_err(|e| {
        CodecError::Encode {
            what,
            reason: e.to_string(),
        }
    })?;
    Ok(counter.0)
}

/// A writer that only counts what it is given.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Decodes exactly one value from `bytes`; trailing bytes are an error, never ignored.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > value_bytes_max {
        return Err(CodecError::TooLarge {
            what,
            len: bytes.len(),
            max: value_bytes_max,
        });
    }
    let (value, used) = decode_tiered(bytes).map_err(|e| CodecError::Decode {
        what,
        reason: e.to_string(),
    })?;
    if used != bytes.len() {
        return Err(CodecError::Trailing {
            what,
            trailing: bytes.len() - used,
        });
    }
    Ok(value)
}

/// Decodes one value from the start of `bytes`, ignoring what follows. Only for reading a known
/// prefix (an envelope's head) before the rest is checked; everything else uses [`decode`].
pub fn decode_prefix<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, CodecError> {
    if bytes.len() > value_bytes_max {
        return Err(CodecError::TooLarge {
            what,
            len: bytes.len(),
            max: value_bytes_max,
        });
    }
    let (value, _) = decode_tiered(bytes).map_err(|e| CodecError::Decode {
        what,
        reason: e.to_string(),
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn encoded_len_is_the_length_encode_gives() {
        // Issue 23: limits are checked on the counted length; it must be the real one.
        let mut m = BTreeMap::new();
        for i in 0..300u32 {
            m.insert(format!("key-{i}"), "v".repeat(i as usize * 7));
        }
        let bytes = encode("map", &m).expect("encode");
        assert_eq!(encoded_len("map", &m).expect("counts"), bytes.len());
    }

    #[test]
    fn round_trip_is_exact_and_canonical() {
        let mut m = BTreeMap::new();
        m.insert("b".to_string(), 2u64);
        m.insert("a".to_string(), 1u64);
        let bytes = encode("map", &m).expect("encode");
        let back: BTreeMap<String, u64> = decode("map", &bytes).expect("decode");
        assert_eq!(back, m);
        assert_eq!(encode("map", &back).expect("encode"), bytes);
    }

    #[test]
    fn values_much_larger_in_memory_than_on_the_wire_still_decode() {
        // The claim budget grows with the input: a valid value whose containers are far larger in
        // memory than in bytes (empty strings and maps: one byte each on the wire, 24 in memory)
        // must decode, at every tier (a budget equal to the input refused real proposals).
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Sparse {
            a: String,
            b: Vec<String>,
            c: BTreeMap<String, String>,
            d: Option<u64>,
            e: Vec<u8>,
        }
        for count in [10usize, 1_000, 100_000] {
            let value: Vec<Sparse> = (0..count)
                .map(|_| Sparse {
                    a: String::new(),
                    b: vec![],
                    c: BTreeMap::new(),
                    d: None,
                    e: vec![],
                })
                .collect();
            let bytes = encode("sparse", &value).expect("encode");
            let back: Vec<Sparse> = decode("sparse", &bytes).expect("a valid value decodes");
            assert_eq!(back, value);
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = encode("n", &7u64).expect("encode");
        bytes.push(0);
        assert!(matches!(
            decode::<u64>("n", &bytes),
            Err(CodecError::Trailing { trailing: 1, .. })
        ));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let r: Result<String, _> = decode("s", &[0xff, 0xff, 0xff, 0xff, 0xff]);
        assert!(r.is_err());
    }
}
