//! `traceparent` (W3C trace context): a fresh random trace per downstream connection.

use rand::RngCore as _;
use std::fmt::Write as _;

/// A new random `traceparent` value: `00-<32 hex trace id>-<16 hex span id>-00`
/// (version 00, not sampled).
pub fn new_traceparent() -> String {
    let mut rng = rand::rng();
    let mut trace = [0u8; 16];
    let mut span = [0u8; 8];
    // W3C: an all-zero trace id or span id is invalid; redraw in that (unlikely) case.
    while trace == [0; 16] {
        rng.fill_bytes(&mut trace);
    }
    while span == [0; 8] {
        rng.fill_bytes(&mut span);
    }
    let mut out = String::with_capacity(55);
    out.push_str("00-");
    for b in trace {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out.push('-');
    for b in span {
        let _ = write!(out, "{b:02x}");
    }
    out.push_str("-00");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_and_randomness() {
        let a = new_traceparent();
        let b = new_traceparent();
        assert_ne!(a, b);
        for t in [a, b] {
            let parts: Vec<&str> = t.split('-').collect();
            assert_eq!(parts.len(), 4, "{t}");
            assert_eq!(parts[0], "00");
            assert_eq!(parts[1].len(), 32);
            assert_eq!(parts[2].len(), 16);
            assert_eq!(parts[3], "00");
            let hex = |s: &str| {
                s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            };
            assert!(hex(parts[1]) && hex(parts[2]), "{t}");
        }
    }
}
