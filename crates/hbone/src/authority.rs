//! Parsing of the CONNECT `:authority` (spec §3.2): `IP:port`, `[v6]:port` or
//! `hostname:port`.
//!
//! The input comes straight from a peer, so the parser is a total function over `&str`:
//! bounded, allocation-light, never panics (a fuzz target calls it directly).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Longest hostname accepted (RFC 1035 presentation form without the trailing dot).
pub const MAX_HOSTNAME_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

/// Where a CONNECT request asks to be tunnelled to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ConnectTarget {
    /// A literal socket address: the normal pod `IP:targetPort` case.
    Addr(SocketAddr),
    /// A service hostname and service port (double HBONE, waypoints).
    Host {
        /// Lower-cased DNS name, validated per RFC 1123.
        host: String,
        /// Never zero.
        port: u16,
    },
}

impl ConnectTarget {
    /// The port part of the target.
    pub fn port(&self) -> u16 {
        match self {
            ConnectTarget::Addr(a) => a.port(),
            ConnectTarget::Host { port, .. } => *port,
        }
    }
}

impl fmt::Display for ConnectTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Written by hand rather than via SocketAddr's Display so a v6 scope id or
            // flow info can never leak into the wire authority.
            ConnectTarget::Addr(SocketAddr::V4(a)) => write!(f, "{}:{}", a.ip(), a.port()),
            ConnectTarget::Addr(SocketAddr::V6(a)) => write!(f, "[{}]:{}", a.ip(), a.port()),
            ConnectTarget::Host { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl std::str::FromStr for ConnectTarget {
    type Err = AuthorityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_authority(s)
    }
}

/// Why an authority was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    #[error("authority is empty")]
    Empty,
    #[error("authority is longer than {MAX_HOSTNAME_LEN} + port characters")]
    TooLong,
    #[error("authority has no `:port`")]
    MissingPort,
    #[error("authority port is not a number in 1..=65535")]
    InvalidPort,
    #[error("authority has a bracketed part that is not an IPv6 address")]
    InvalidIpv6,
    #[error("authority host is neither an IP address nor a valid DNS name")]
    InvalidHost,
}

/// Parses a CONNECT authority. Never panics, whatever the input.
pub fn parse_authority(s: &str) -> Result<ConnectTarget, AuthorityError> {
    if s.is_empty() {
        return Err(AuthorityError::Empty);
    }
    // Host, ':' and at most five port digits; anything longer cannot be valid and is
    // rejected before any further work.
    if s.len() > MAX_HOSTNAME_LEN + 2 + 6 {
        return Err(AuthorityError::TooLong);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, after) = rest.split_once(']').ok_or(AuthorityError::InvalidIpv6)?;
        let port = after.strip_prefix(':').ok_or(AuthorityError::MissingPort)?;
        let ip: Ipv6Addr = ip.parse().map_err(|_| AuthorityError::InvalidIpv6)?;
        let port = parse_port(port)?;
        return Ok(ConnectTarget::Addr(SocketAddr::new(IpAddr::V6(ip), port)));
    }
    let (host, port) = s.rsplit_once(':').ok_or(AuthorityError::MissingPort)?;
    if host.contains(':') {
        // An unbracketed IPv6 literal is ambiguous (which colon starts the port?).
        return Err(AuthorityError::InvalidHost);
    }
    let port = parse_port(port)?;
    if host.is_empty() {
        return Err(AuthorityError::InvalidHost);
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // All-numeric hosts must be a dotted-quad IPv4; `1.2.3` or `999.1.1.1` are not
        // hostnames either (RFC 1123 §2.1: the top label is not all-numeric).
        let ip: std::net::Ipv4Addr = host.parse().map_err(|_| AuthorityError::InvalidHost)?;
        return Ok(ConnectTarget::Addr(SocketAddr::new(IpAddr::V4(ip), port)));
    }
    let host = validate_hostname(host)?;
    Ok(ConnectTarget::Host { host, port })
}

fn parse_port(s: &str) -> Result<u16, AuthorityError> {
    // u16::from_str accepts a leading '+'; a port is digits only.
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AuthorityError::InvalidPort);
    }
    match s.parse::<u16>() {
        Ok(0) | Err(_) => Err(AuthorityError::InvalidPort),
        Ok(p) => Ok(p),
    }
}

fn validate_hostname(host: &str) -> Result<String, AuthorityError> {
    // A single trailing dot (absolute name) is accepted and dropped.
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > MAX_HOSTNAME_LEN {
        return Err(AuthorityError::InvalidHost);
    }
    for label in host.split('.') {
        let bytes = label.as_bytes();
        let valid_chars = bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-');
        let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
            return Err(AuthorityError::InvalidHost);
        };
        if !valid_chars || label.len() > MAX_LABEL_LEN || *first == b'-' || *last == b'-' {
            return Err(AuthorityError::InvalidHost);
        }
    }
    Ok(host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_table() {
        use AuthorityError as E;
        let long_label = "a".repeat(64);
        // 25 nine-letter labels + ".comx" = 254 characters: one over the limit.
        let long_host = format!("{}.comx:80", ["abcdefghi"; 25].join("."));
        let cases: Vec<(&str, Result<ConnectTarget, AuthorityError>)> = vec![
            (
                "10.0.0.1:8080",
                Ok(ConnectTarget::Addr("10.0.0.1:8080".parse().unwrap())),
            ),
            (
                "[::1]:80",
                Ok(ConnectTarget::Addr("[::1]:80".parse().unwrap())),
            ),
            (
                "[fd00::2]:65535",
                Ok(ConnectTarget::Addr("[fd00::2]:65535".parse().unwrap())),
            ),
            (
                "Svc1.Default.svc.cluster.local:80",
                Ok(ConnectTarget::Host {
                    host: "svc1.default.svc.cluster.local".into(),
                    port: 80,
                }),
            ),
            (
                "svc.:1",
                Ok(ConnectTarget::Host {
                    host: "svc".into(),
                    port: 1,
                }),
            ),
            (
                "a-b:9",
                Ok(ConnectTarget::Host {
                    host: "a-b".into(),
                    port: 9,
                }),
            ),
            ("", Err(E::Empty)),
            ("10.0.0.1", Err(E::MissingPort)),
            ("10.0.0.1:", Err(E::InvalidPort)),
            ("10.0.0.1:0", Err(E::InvalidPort)),
            ("10.0.0.1:65536", Err(E::InvalidPort)),
            ("10.0.0.1:+80", Err(E::InvalidPort)),
            ("10.0.0.1:008080", Err(E::InvalidPort)),
            ("999.0.0.1:80", Err(E::InvalidHost)),
            ("1.2.3:80", Err(E::InvalidHost)),
            (":80", Err(E::InvalidHost)),
            ("::1:80", Err(E::InvalidHost)),
            ("[::1]", Err(E::MissingPort)),
            ("[::1:80", Err(E::InvalidIpv6)),
            ("[10.0.0.1]:80", Err(E::InvalidIpv6)),
            ("[fe80::1%eth0]:80", Err(E::InvalidIpv6)),
            ("-a.com:80", Err(E::InvalidHost)),
            ("a-.com:80", Err(E::InvalidHost)),
            ("a..com:80", Err(E::InvalidHost)),
            ("a_b.com:80", Err(E::InvalidHost)),
            ("exa mple:80", Err(E::InvalidHost)),
            ("ünï.com:80", Err(E::InvalidHost)),
            ("user@host:80", Err(E::InvalidHost)),
            ("host/path:80", Err(E::InvalidHost)),
            (".:80", Err(E::InvalidHost)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_authority(input), want, "input {input:?}");
        }
        assert_eq!(
            parse_authority(&format!("{long_label}.com:80")),
            Err(E::InvalidHost)
        );
        assert_eq!(parse_authority(&long_host), Err(E::InvalidHost));
        assert_eq!(parse_authority(&"a".repeat(1000)), Err(E::TooLong));
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "10.0.0.1:8080",
            "[fd00::2]:80",
            "svc.ns.svc.cluster.local:80",
        ] {
            let t = parse_authority(s).unwrap();
            assert_eq!(t.to_string(), s);
            assert_eq!(parse_authority(&t.to_string()).unwrap(), t);
        }
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        // A poor man's fuzz pass: every short string over an alphabet of the characters
        // the parser branches on.
        let alphabet = ['[', ']', ':', '.', '-', '1', 'a', '0', '%', 'é'];
        let mut stack = vec![String::new()];
        while let Some(s) = stack.pop() {
            let _ = parse_authority(&s);
            if s.chars().count() < 5 {
                for c in alphabet {
                    stack.push(format!("{s}{c}"));
                }
            }
        }
    }
}
