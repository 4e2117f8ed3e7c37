//! Go-style duration strings (`24h`, `1h30m`, `500ms`, `5s`), the format upstream's
//! environment variables use.

use std::time::Duration;

/// Parses a Go `time.ParseDuration` style string. A bare number is refused: upstream refuses it
/// too, and guessing the unit would silently change a timeout by a factor of 1000.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?}: missing unit (use ns, us, ms, s, m or h)"))?;
        if num_len == 0 {
            return Err(format!("{s:?}: expected a number before the unit"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("{s:?}: bad number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit: f64 = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            other => return Err(format!("{s:?}: unknown unit {other:?}")),
        };
        rest = &rest[unit_len..];
        let nanos = value * nanos_per_unit;
        if !nanos.is_finite() || nanos > u64::MAX as f64 {
            return Err(format!("{s:?}: out of range"));
        }
        total = total
            .checked_add(Duration::from_nanos(nanos as u64))
            .ok_or_else(|| format!("{s:?}: out of range"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let ok = [
            ("24h", Duration::from_secs(86400)),
            ("5m", Duration::from_secs(300)),
            ("1h30m", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("1.5s", Duration::from_millis(1500)),
            ("0", Duration::ZERO),
            ("10us", Duration::from_micros(10)),
        ];
        for (input, want) in ok {
            assert_eq!(parse_duration(input), Ok(want), "{input}");
        }
        for bad in ["", "10", "s", "5x", "-5s", "1e400h", "1..5s"] {
            assert!(parse_duration(bad).is_err(), "{bad} should fail");
        }
    }
}
