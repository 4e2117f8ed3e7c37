//! A minimal blocking HTTP/1.1 client over a Unix socket for the single `/cmdadd` POST.
//!
//! Blocking on purpose: the plugin is a short-lived process and [`super::plugin_main`]
//! may be called from inside a tokio runtime (tests, the CLI), where starting another
//! runtime would panic. One request per connection (`Connection: close`), so the response
//! ends at EOF or at `Content-Length`.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// POSTs `body` as JSON and returns (status, response body text).
pub fn post(
    socket: &Path,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let deadline = Instant::now() + timeout;
    let mut s = UnixStream::connect(socket)?;
    let remaining = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "agent did not answer in time"))
    };
    s.set_write_timeout(Some(remaining()?))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut resp = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        s.set_read_timeout(Some(remaining()?))?;
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "agent timed out"));
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        resp.extend_from_slice(&buf[..n]);
        if let Some(done) = complete(&resp) {
            return Ok(done);
        }
    }
    complete(&resp)
        .or_else(|| parse(&resp, resp.len()))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP response"))
}

/// The response once `Content-Length` bytes of body are in.
fn complete(resp: &[u8]) -> Option<(u16, String)> {
    let end = find(resp, b"\r\n\r\n")?;
    let head = std::str::from_utf8(&resp[..end]).ok()?;
    let len: usize = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    })?;
    (resp.len() >= end + 4 + len).then(|| parse(resp, end + 4 + len))?
}

fn parse(resp: &[u8], body_end: usize) -> Option<(u16, String)> {
    let end = find(resp, b"\r\n\r\n")?;
    let status_line = std::str::from_utf8(&resp[..end]).ok()?.lines().next()?;
    let mut parts = status_line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let status: u16 = parts.next()?.parse().ok()?;
    let body = resp.get(end + 4..body_end)?;
    Some((status, String::from_utf8_lossy(body).into_owned()))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
