//! The value grammars upstream's configuration uses, once for every component: booleans as
//! Go's `strconv.ParseBool` reads them (istio-cni's environment and every boolean annotation)
//! and durations as Go's `time.ParseDuration` reads them, plus a bare whole number of seconds
//! where upstream ztunnel's reader (the `duration-str` crate) accepts one.

use std::time::Duration;

/// A value that is not a Go boolean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("expected a boolean (1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False)")]
pub struct BoolError;

/// Go's `strconv.ParseBool`: exactly these spellings, nothing else (no trimming).
pub fn parse_bool(s: &str) -> Result<bool, BoolError> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(BoolError),
    }
}

/// Why a duration did not parse; the text says what was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing to parse.
    #[error("empty duration (expected a duration like 500ms, 10s, 1h30m or whole seconds)")]
    Empty,
    /// Not a duration at all.
    #[error("expected a duration like 500ms, 10s, 1h30m or whole seconds")]
    Invalid,
    /// A number without a unit inside a longer duration (`1h30`).
    #[error("missing unit (use ns, us, ms, s, m or h)")]
    MissingUnit,
    /// A unit Go does not know (`d`, `w`, …).
    #[error("unknown unit (use ns, us, ms, s, m or h)")]
    UnknownUnit,
    /// Below zero.
    #[error("must not be negative")]
    Negative,
    /// Longer than Go's limit (about 292 years).
    #[error("out of range (at most 2562047h47m16.854775807s)")]
    Overflow,
}

/// Go's `time.ParseDuration` (`300ms`, `1.5h`, `2h45m`, `+5s`, units `ns` `us` `µs` `μs` `ms`
/// `s` `m` `h`, `0` without a unit), plus a bare whole number meaning seconds (`10` is 10 s),
/// as upstream ztunnel accepts. Surrounding whitespace is ignored. Negative durations are
/// refused: nothing ambit configures can wait a negative time.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = s.parse().map_err(|_| DurationError::Overflow)?;
        return go_limit(Duration::from_secs(secs));
    }
    let (negative, mut rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Invalid);
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        if !rest.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
            return Err(DurationError::Invalid);
        }
        let (whole, after_whole) = leading_int(rest)?;
        let has_whole = after_whole.len() != rest.len();
        rest = after_whole;
        let (mut fraction, mut scale, mut has_fraction) = (0u64, 1f64, false);
        if let Some(after_dot) = rest.strip_prefix('.') {
            let (f, sc, after_fraction) = leading_fraction(after_dot);
            has_fraction = after_fraction.len() != after_dot.len();
            (fraction, scale, rest) = (f, sc, after_fraction);
        }
        if !has_whole && !has_fraction {
            return Err(DurationError::Invalid);
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        if unit_len == 0 {
            return Err(DurationError::MissingUnit);
        }
        let nanos_per_unit: u64 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            _ => return Err(DurationError::UnknownUnit),
        };
        rest = &rest[unit_len..];
        let mut value = whole
            .checked_mul(nanos_per_unit)
            .filter(|v| *v <= GO_MAX_NANOS)
            .ok_or(DurationError::Overflow)?;
        if fraction > 0 {
            // As Go does: the fraction scaled in floating point, then truncated.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let part = (fraction as f64 * (nanos_per_unit as f64 / scale)) as u64;
            value = value
                .checked_add(part)
                .filter(|v| *v <= GO_MAX_NANOS)
                .ok_or(DurationError::Overflow)?;
        }
        total = total
            .checked_add(value)
            .filter(|v| *v <= GO_MAX_NANOS)
            .ok_or(DurationError::Overflow)?;
    }
    if negative && total != 0 {
        return Err(DurationError::Negative);
    }
    Ok(Duration::from_nanos(total))
}

/// Go's `time.Duration` is an `int64` of nanoseconds.
const GO_MAX_NANOS: u64 = i64::MAX as u64;

fn go_limit(d: Duration) -> Result<Duration, DurationError> {
    if d.as_nanos() > u128::from(GO_MAX_NANOS) {
        Err(DurationError::Overflow)
    } else {
        Ok(d)
    }
}

/// The leading decimal digits of `s` as a number, and the rest.
fn leading_int(s: &str) -> Result<(u64, &str), DurationError> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut v: u64 = 0;
    for b in s[..end].bytes() {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .filter(|v| *v <= GO_MAX_NANOS)
            .ok_or(DurationError::Overflow)?;
    }
    Ok((v, &s[end..]))
}

/// The leading digits of a fraction: their value, the power of ten they are scaled by, and
/// the rest. Digits beyond what fits are consumed and ignored, as Go does.
fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (mut v, mut scale, mut overflow) = (0u64, 1f64, false);
    for b in s[..end].bytes() {
        if overflow {
            continue;
        }
        match v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .filter(|v| *v <= GO_MAX_NANOS)
        {
            Some(next) => {
                v = next;
                scale *= 10.0;
            }
            None => overflow = true,
        }
    }
    (v, scale, &s[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_are_gos() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_bool(f), Ok(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", " true", "2", "on"] {
            assert_eq!(parse_bool(bad), Err(BoolError), "{bad:?}");
        }
    }

    #[test]
    fn durations_are_gos_plus_bare_seconds() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        let ok = [
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("10", s(10)),
            ("86400", s(86400)),
            (" 5s ", s(5)),
            ("+5s", s(5)),
            ("500ms", ms(500)),
            ("1.5s", ms(1500)),
            (".5s", ms(500)),
            ("1.s", s(1)),
            ("1h30m", s(5400)),
            ("2h45m10.5s", ms((2 * 3600 + 45 * 60 + 10) * 1000 + 500)),
            ("24h", s(86400)),
            ("10us", Duration::from_micros(10)),
            ("10\u{b5}s", Duration::from_micros(10)),
            ("10\u{3bc}s", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("1.0000000000000000000001s", s(1)),
            (
                "2562047h47m16.854775807s",
                Duration::from_nanos(i64::MAX as u64),
            ),
        ];
        for (input, want) in ok {
            assert_eq!(parse_duration(input), Ok(want), "{input:?}");
        }
        let bad = [
            ("", DurationError::Empty),
            ("   ", DurationError::Empty),
            ("s", DurationError::Invalid),
            (".s", DurationError::Invalid),
            ("+", DurationError::Invalid),
            ("1..5s", DurationError::MissingUnit),
            ("1.5", DurationError::MissingUnit),
            ("1h30", DurationError::MissingUnit),
            ("5x", DurationError::UnknownUnit),
            ("1d", DurationError::UnknownUnit),
            ("10 parsecs", DurationError::UnknownUnit),
            ("-5s", DurationError::Negative),
            ("2562048h", DurationError::Overflow),
            ("1e400h", DurationError::UnknownUnit),
            ("99999999999999999999", DurationError::Overflow),
            ("9223372037", DurationError::Overflow),
        ];
        for (input, want) in bad {
            assert_eq!(parse_duration(input), Err(want), "{input:?}");
        }
    }
}
