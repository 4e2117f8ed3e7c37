//! `forwarded` header (RFC 7239): ztunnel sends `for="<client ip:port>"` plus
//! `;host=<service hostname>` when the destination was a known service.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

/// Longest `forwarded` value parsed.
pub const MAX_FORWARDED_LEN: usize = 8192;
/// A chain of proxies longer than this is refused rather than parsed.
const MAX_ELEMENTS: usize = 64;

/// A node (`for=` / `by=` value) of RFC 7239 §6.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardedNode {
    /// Address with a port, e.g. `"10.0.0.1:4000"` or `"[::1]:4000"`.
    Addr(SocketAddr),
    /// Address without a port, e.g. `10.0.0.1` or `"[::1]"`.
    Ip(IpAddr),
    /// The literal `unknown` (optionally with a port).
    Unknown,
    /// An obfuscated identifier (`_hidden`, optionally with a port), kept verbatim.
    Obfuscated(String),
}

/// One comma-separated element: the view of one proxy hop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardedElement {
    pub for_node: Option<ForwardedNode>,
    pub by: Option<ForwardedNode>,
    pub host: Option<String>,
    pub proto: Option<String>,
}

/// A parsed `forwarded` value: elements in header order (the first is closest to the
/// original client).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forwarded {
    pub elements: Vec<ForwardedElement>,
}

impl Forwarded {
    /// The original client's socket address, if the first hop recorded one with a port.
    pub fn client_addr(&self) -> Option<SocketAddr> {
        match self.elements.first()?.for_node.as_ref()? {
            ForwardedNode::Addr(a) => Some(*a),
            _ => None,
        }
    }
}

/// Why a `forwarded` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardedError {
    #[error("forwarded header longer than {MAX_FORWARDED_LEN} bytes")]
    TooLong,
    #[error("forwarded header has more than {MAX_ELEMENTS} elements")]
    TooManyElements,
    #[error("forwarded header has an unterminated quoted string")]
    UnterminatedQuote,
    #[error("forwarded pair is not `name=value`")]
    MalformedPair,
    #[error("forwarded parameter `{0}` appears twice in one element")]
    DuplicateParameter(&'static str),
    #[error(
        "forwarded node is not an IP, `[IPv6]`, `unknown` or `_obfuscated` (with optional port)"
    )]
    InvalidNode,
}

/// Builds the value ztunnel sends: `for="IP:port"` and, when known, `;host=<hostname>`.
pub fn build_forwarded(client: SocketAddr, host: Option<&str>) -> String {
    let mut out = String::with_capacity(64);
    // Writing to a String cannot fail. The v6 form is bracketed by hand so a scope id
    // never appears on the wire.
    let _ = match client {
        SocketAddr::V4(a) => write!(out, "for=\"{}:{}\"", a.ip(), a.port()),
        SocketAddr::V6(a) => write!(out, "for=\"[{}]:{}\"", a.ip(), a.port()),
    };
    if let Some(host) = host.filter(|h| !h.is_empty()) {
        out.push_str(";host=");
        push_value(&mut out, host);
    }
    out
}

fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

fn push_value(out: &mut String, v: &str) {
    if !v.is_empty() && v.chars().all(is_tchar) {
        out.push_str(v);
        return;
    }
    out.push('"');
    for c in v.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// Parses a `forwarded` value. Never panics, whatever the input.
pub fn parse_forwarded(s: &str) -> Result<Forwarded, ForwardedError> {
    if s.len() > MAX_FORWARDED_LEN {
        return Err(ForwardedError::TooLong);
    }
    let mut out = Forwarded::default();
    for element in split_unquoted(s, ',')? {
        if out.elements.len() >= MAX_ELEMENTS {
            return Err(ForwardedError::TooManyElements);
        }
        let mut el = ForwardedElement::default();
        for pair in split_unquoted(element, ';')? {
            let pair = pair.trim_matches([' ', '\t']);
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=').ok_or(ForwardedError::MalformedPair)?;
            if name.is_empty() || !name.chars().all(is_tchar) {
                return Err(ForwardedError::MalformedPair);
            }
            let value = unquote(value)?;
            let name = name.to_ascii_lowercase();
            match name.as_str() {
                "for" => set_once(&mut el.for_node, parse_node(&value)?, "for")?,
                "by" => set_once(&mut el.by, parse_node(&value)?, "by")?,
                "host" => set_once(&mut el.host, value, "host")?,
                "proto" => set_once(&mut el.proto, value, "proto")?,
                // Extensions (RFC 7239 §5.5) are allowed and not needed here.
                _ => {}
            }
        }
        out.elements.push(el);
    }
    Ok(out)
}

fn set_once<T>(slot: &mut Option<T>, v: T, name: &'static str) -> Result<(), ForwardedError> {
    if slot.is_some() {
        return Err(ForwardedError::DuplicateParameter(name));
    }
    *slot = Some(v);
    Ok(())
}

/// Splits on `sep` outside quoted strings, skipping empty pieces (RFC 7230 `#rule`).
fn split_unquoted(s: &str, sep: char) -> Result<Vec<&str>, ForwardedError> {
    let mut parts = Vec::new();
    let (mut start, mut in_quotes, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if in_quotes && c == '\\' {
            escaped = true;
        } else if c == '"' {
            in_quotes = !in_quotes;
        } else if c == sep && !in_quotes {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    if in_quotes {
        return Err(ForwardedError::UnterminatedQuote);
    }
    parts.push(&s[start..]);
    parts.retain(|p| !p.trim_matches([' ', '\t']).is_empty());
    Ok(parts)
}

fn unquote(v: &str) -> Result<String, ForwardedError> {
    let Some(inner) = v.strip_prefix('"') else {
        if v.is_empty() || !v.chars().all(is_tchar) {
            return Err(ForwardedError::MalformedPair);
        }
        return Ok(v.to_owned());
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next().ok_or(ForwardedError::UnterminatedQuote)?),
            // The closing quote must be the last character.
            '"' if chars.as_str().is_empty() => return Ok(out),
            '"' => return Err(ForwardedError::MalformedPair),
            c => out.push(c),
        }
    }
    Err(ForwardedError::UnterminatedQuote)
}

fn parse_node(v: &str) -> Result<ForwardedNode, ForwardedError> {
    if let Some(rest) = v.strip_prefix('[') {
        let (ip, after) = rest.split_once(']').ok_or(ForwardedError::InvalidNode)?;
        let ip: std::net::Ipv6Addr = ip.parse().map_err(|_| ForwardedError::InvalidNode)?;
        return match after {
            "" => Ok(ForwardedNode::Ip(IpAddr::V6(ip))),
            _ => {
                let port = parse_node_port(after.strip_prefix(':'))?;
                Ok(ForwardedNode::Addr(SocketAddr::new(IpAddr::V6(ip), port)))
            }
        };
    }
    let (name, port) = match v.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (v, None),
    };
    if name.eq_ignore_ascii_case("unknown") {
        return Ok(ForwardedNode::Unknown);
    }
    if name.starts_with('_') {
        let valid = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        if !valid(name) || !port.is_none_or(valid) {
            return Err(ForwardedError::InvalidNode);
        }
        return Ok(ForwardedNode::Obfuscated(v.to_owned()));
    }
    let ip: std::net::Ipv4Addr = name.parse().map_err(|_| ForwardedError::InvalidNode)?;
    match port {
        None => Ok(ForwardedNode::Ip(IpAddr::V4(ip))),
        Some(p) => Ok(ForwardedNode::Addr(SocketAddr::new(
            IpAddr::V4(ip),
            parse_node_port(Some(p))?,
        ))),
    }
}

fn parse_node_port(p: Option<&str>) -> Result<u16, ForwardedError> {
    let p = p.ok_or(ForwardedError::InvalidNode)?;
    // Port 0 is allowed here: it is informational, not something we connect to.
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ForwardedError::InvalidNode);
    }
    p.parse().map_err(|_| ForwardedError::InvalidNode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ForwardedNode as N;

    fn el(for_node: Option<N>, host: Option<&str>) -> ForwardedElement {
        ForwardedElement {
            for_node,
            host: host.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn parse_table() {
        let addr = |s: &str| Some(N::Addr(s.parse().unwrap()));
        let ip = |s: &str| Some(N::Ip(s.parse().unwrap()));
        let cases: Vec<(&str, Result<Vec<ForwardedElement>, ForwardedError>)> = vec![
            ("", Ok(vec![])),
            (
                "for=\"10.99.0.2:53352\";host=remote.default.svc.cluster.local",
                Ok(vec![el(
                    addr("10.99.0.2:53352"),
                    Some("remote.default.svc.cluster.local"),
                )]),
            ),
            ("For=10.0.0.1", Ok(vec![el(ip("10.0.0.1"), None)])),
            (
                "for=\"[2001:db8::1]:80\"",
                Ok(vec![el(addr("[2001:db8::1]:80"), None)]),
            ),
            (
                "for=\"[2001:db8::1]\"",
                Ok(vec![el(ip("2001:db8::1"), None)]),
            ),
            (
                "for=unknown, for=_hidden",
                Ok(vec![
                    el(Some(N::Unknown), None),
                    el(Some(N::Obfuscated("_hidden".into())), None),
                ]),
            ),
            (
                "for=\"_h:_p\"",
                Ok(vec![el(Some(N::Obfuscated("_h:_p".into())), None)]),
            ),
            (
                "for=1.2.3.4;proto=https;by=\"[::1]:9\";ext=\"x,;y\" , for=\"5.6.7.8:1\"",
                Ok(vec![
                    ForwardedElement {
                        for_node: ip("1.2.3.4"),
                        by: addr("[::1]:9"),
                        proto: Some("https".into()),
                        host: None,
                    },
                    el(addr("5.6.7.8:1"), None),
                ]),
            ),
            ("host=\"a\\\"b\"", Ok(vec![el(None, Some("a\"b"))])),
            (";;for=1.1.1.1;", Ok(vec![el(ip("1.1.1.1"), None)])),
            ("for=\"1.1.1.1:80", Err(ForwardedError::UnterminatedQuote)),
            (
                "for=\"1.1.1.1:80\\\"",
                Err(ForwardedError::UnterminatedQuote),
            ),
            ("for", Err(ForwardedError::MalformedPair)),
            ("for=", Err(ForwardedError::MalformedPair)),
            ("=1.1.1.1", Err(ForwardedError::MalformedPair)),
            ("for=\"a\"b", Err(ForwardedError::MalformedPair)),
            (
                "for=1.1.1.1;for=2.2.2.2",
                Err(ForwardedError::DuplicateParameter("for")),
            ),
            ("for=\"[::1]:\"", Err(ForwardedError::InvalidNode)),
            ("for=\"[::1]x\"", Err(ForwardedError::InvalidNode)),
            ("for=\"1.1.1.1:99999\"", Err(ForwardedError::InvalidNode)),
            ("for=\"::1\"", Err(ForwardedError::InvalidNode)),
            ("for=example.com", Err(ForwardedError::InvalidNode)),
            ("for=_a/b", Err(ForwardedError::MalformedPair)),
        ];
        for (input, want) in cases {
            let got = parse_forwarded(input).map(|f| f.elements);
            assert_eq!(got, want, "input {input:?}");
        }
        let many = "for=1.1.1.1,".repeat(MAX_ELEMENTS + 1);
        assert_eq!(parse_forwarded(&many), Err(ForwardedError::TooManyElements));
        let long = "x".repeat(MAX_FORWARDED_LEN + 1);
        assert_eq!(parse_forwarded(&long), Err(ForwardedError::TooLong));
    }

    #[test]
    fn build_table() {
        let cases = [
            ("10.99.0.2:53352", None, "for=\"10.99.0.2:53352\""),
            (
                "10.99.0.2:53352",
                Some("remote.default.svc.cluster.local"),
                "for=\"10.99.0.2:53352\";host=remote.default.svc.cluster.local",
            ),
            ("[fd00::1]:80", Some(""), "for=\"[fd00::1]:80\""),
            (
                "1.1.1.1:1",
                Some("we\"ird host"),
                "for=\"1.1.1.1:1\";host=\"we\\\"ird host\"",
            ),
        ];
        for (client, host, want) in cases {
            let client: SocketAddr = client.parse().unwrap();
            let built = build_forwarded(client, host);
            assert_eq!(built, want);
            let parsed = parse_forwarded(&built).unwrap();
            assert_eq!(parsed.client_addr(), Some(client));
            assert_eq!(
                parsed.elements[0].host.as_deref(),
                host.filter(|h| !h.is_empty())
            );
        }
    }
}
