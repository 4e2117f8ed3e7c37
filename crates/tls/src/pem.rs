//! PEM encoding (RFC 7468) of DER blobs.
//!
//! Decoding goes through `rustls_pki_types::pem`; encoding uses the `base64` crate (already
//! built for rcgen).

use base64::Engine as _;

/// Encodes `der` as a PEM block with the given label, 64 characters per line, trailing newline.
pub(crate) fn encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for line in b64.as_bytes().chunks(64) {
        // The alphabet is ASCII, so every chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_wraps_at_64_columns() {
        let pem = encode("TEST", &[0u8; 100]);
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines[0], "-----BEGIN TEST-----");
        assert_eq!(lines[1].len(), 64);
        assert_eq!(*lines.last().unwrap(), "-----END TEST-----");
    }
}
