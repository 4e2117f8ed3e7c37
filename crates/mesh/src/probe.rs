//! Talking to things inside a namespace from the orchestrator: a TCP connect made from a
//! thread that entered the namespace (the socket keeps it), and a minimal HTTP/1.0 GET for
//! the components' health, readiness and admin endpoints.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use ambit_netns::NetnsFd;

/// Connects to `addr` from inside the namespace at `netns`.
pub fn connect_in(netns: &Path, addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let fd = NetnsFd::open(netns).map_err(std::io::Error::other)?;
    ambit_netns::run_in_netns_thread(&fd, || TcpStream::connect_timeout(&addr, timeout))
        .map_err(std::io::Error::other)?
}

/// `GET path` over HTTP/1.0 from inside `netns`; `(status, body)` or `None` if unreachable.
pub fn http_get(netns: &Path, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    http_request(netns, addr, "GET", path)
}

/// `METHOD path` (no body) over HTTP/1.0 from inside `netns`; `(status, body)` or `None` if
/// unreachable.
pub fn http_request(
    netns: &Path,
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> Option<(u16, String)> {
    let timeout = Duration::from_secs(2);
    let mut s = connect_in(netns, addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    let length = if method == "GET" {
        ""
    } else {
        "Content-Length: 0\r\n"
    };
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\n{length}\r\n"
    )
    .ok()?;
    let mut resp = Vec::new();
    s.take(16 << 20).read_to_end(&mut resp).ok()?;
    let resp = String::from_utf8_lossy(&resp);
    let status = resp.split_whitespace().nth(1)?.parse().ok()?;
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Whether `GET path` answers 200.
pub fn ok(netns: &Path, addr: SocketAddr, path: &str) -> bool {
    matches!(http_get(netns, addr, path), Some((200, _)))
}
