//! Lower-case hex for keys and secrets in config files and on the wire of logs: one encoder and
//! one strict 32-byte decoder, shared by the host, the controller and meshctl.

/// Decodes exactly 32 bytes of hex; `None` for any other length or a non-hex character.
pub fn decode_hex_32(hex: &str) -> Option<[u8; 32]> {
    let digits = hex.trim().as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let high = (pair[0] as char).to_digit(16)?;
        let low = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(high * 16 + low).ok()?;
    }
    Some(out)
}

/// Encodes bytes as lower-case hex.
pub fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}
