//! The admin server (§8.3): HTTP/1.1 on localhost only (127.0.0.1 and ::1, port 15000).
//!
//! | path | method | |
//! |---|---|---|
//! | `/` | GET | HTML index |
//! | `/config_dump` | GET | JSON from a [`ConfigDumpSource`] |
//! | `/logging` | POST | see [`logging`](self::logging) docs; GET → 405 + usage |
//! | `/quitquitquit` | POST | starts a graceful shutdown through the callback |
//!
//! Anything else is 404. The server refuses to bind a non-loopback address: these endpoints
//! dump secrets' metadata and can stop the proxy, so they must not be reachable off-node.

mod config_dump;
mod logging;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::{Method, Request, StatusCode, header};
use hyper::body::Incoming;

pub use config_dump::{ConfigDumpSource, DumpSection, build_version, empty_source, rfc3339};

use crate::drain::DrainWatcher;
use crate::telemetry::LogHandle;
use crate::telemetry::http_server::{self as srv, Body};

/// Errors at the admin boundary.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("admin server must listen on localhost only, refusing {addr}")]
    NotLoopback { addr: SocketAddr },
    #[error("failed to bind admin server on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// What the admin endpoints act on.
#[derive(Clone)]
pub struct AdminState {
    config_dump: Arc<dyn ConfigDumpSource>,
    log: Option<LogHandle>,
    shutdown: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// `config_dump` answers `/config_dump`; `shutdown` is called on `POST /quitquitquit`
    /// (it must only *start* the shutdown, e.g. send on a channel, and return).
    pub fn new(
        config_dump: impl ConfigDumpSource,
        shutdown: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        AdminState {
            config_dump: Arc::new(config_dump),
            log: None,
            shutdown: Arc::new(shutdown),
        }
    }

    /// Enables `/logging` (without it the endpoint answers 503).
    pub fn with_log_handle(mut self, log: LogHandle) -> Self {
        self.log = Some(log);
        self
    }
}

/// A bound, not yet serving, admin server.
#[derive(Debug)]
pub struct AdminServer {
    listeners: Vec<std::net::TcpListener>,
    local_addrs: Vec<SocketAddr>,
    state: AdminState,
}

impl AdminServer {
    /// Binds `addr`, which must be a loopback address. For `127.0.0.1` or `::1` the other
    /// family's loopback is bound on the same port too when the host has it (best effort:
    /// no IPv6 on lo is normal).
    pub fn bind(addr: SocketAddr, state: AdminState) -> Result<Self, AdminError> {
        if !addr.ip().is_loopback() {
            return Err(AdminError::NotLoopback { addr });
        }
        let bind_err = |source| AdminError::Bind { addr, source };
        let first = srv::bind(addr).map_err(bind_err)?;
        let first_addr = first.local_addr().map_err(bind_err)?;
        let mut listeners = vec![first];
        let mut local_addrs = vec![first_addr];
        let twin = match addr.ip() {
            IpAddr::V4(Ipv4Addr::LOCALHOST) => Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            IpAddr::V6(Ipv6Addr::LOCALHOST) => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            _ => None,
        };
        if let Some(ip) = twin {
            let twin_addr = SocketAddr::new(ip, first_addr.port());
            match srv::bind(twin_addr).and_then(|l| Ok((l.local_addr()?, l))) {
                Ok((a, l)) => {
                    local_addrs.push(a);
                    listeners.push(l);
                }
                Err(error) => {
                    tracing::debug!(addr = %twin_addr, %error, "admin: second loopback not bound")
                }
            }
        }
        Ok(AdminServer {
            listeners,
            local_addrs,
            state,
        })
    }

    /// The first bound address (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addrs[0]
    }

    /// Every bound address.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// Serves until `drain` is signaled.
    pub async fn serve(self, drain: DrainWatcher) {
        let state = self.state;
        srv::serve("admin", self.listeners, drain, move |req| {
            let state = state.clone();
            async move { handle(&state, req).await }
        })
        .await;
    }
}

const INDEX: &str = "<!DOCTYPE html>
<html><head><title>ztunnel admin</title></head><body>
<h1>ztunnel admin</h1>
<table>
<tr><td><a href=\"/config_dump\">/config_dump</a></td><td>GET</td><td>workloads, services, policies, certificates and config as JSON</td></tr>
<tr><td>/logging</td><td>POST</td><td>print or change log levels: ?level=debug, ?level=mod:lvl,..., ?reset</td></tr>
<tr><td>/quitquitquit</td><td>POST</td><td>start a graceful shutdown</td></tr>
</table>
</body></html>
";

fn method_not_allowed(allow: &'static str, usage: &str) -> http::Response<Body> {
    let mut resp = srv::text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("Invalid HTTP method\n{usage}"),
    );
    resp.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    resp
}

async fn handle(state: &AdminState, req: Request<Incoming>) -> http::Response<Body> {
    let method = req.method();
    match req.uri().path() {
        "/" => {
            if method != Method::GET {
                return method_not_allowed("GET", "");
            }
            srv::with_type(StatusCode::OK, "text/html; charset=utf-8", INDEX)
        }
        "/config_dump" => {
            if method != Method::GET {
                return method_not_allowed("GET", "");
            }
            let dump = config_dump::collect(state.config_dump.as_ref()).await;
            match serde_json::to_vec_pretty(&dump) {
                Ok(body) => srv::with_type(StatusCode::OK, "application/json", body),
                Err(e) => srv::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("config dump: {e}\n"),
                ),
            }
        }
        "/logging" => {
            if method != Method::POST {
                return method_not_allowed("POST", logging::USAGE);
            }
            let Some(log) = &state.log else {
                return srv::text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "log levels are not reloadable\n",
                );
            };
            let query = parse_query(req.uri().query().unwrap_or_default());
            let (status, body) = logging::handle(log, &query);
            srv::text(status, body)
        }
        "/quitquitquit" => {
            if method != Method::POST {
                return method_not_allowed("POST", "usage: POST /quitquitquit\n");
            }
            tracing::info!("shutdown requested through admin /quitquitquit");
            (state.shutdown)();
            srv::text(StatusCode::OK, "shutdown now\n")
        }
        _ => srv::text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// `a=b&c` → [("a","b"), ("c","")], percent- and `+`-decoded. Undecodable escapes are kept
/// verbatim (the values are then rejected as invalid levels, not as a server error).
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                if let Some(b) = hex {
                    out.push(b);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing() {
        let cases: [(&str, &[(&str, &str)]); 5] = [
            ("", &[]),
            ("reset", &[("reset", "")]),
            ("level=debug", &[("level", "debug")]),
            (
                "level=access%3Adebug%2Cwarn",
                &[("level", "access:debug,warn")],
            ),
            ("level=%zz&x", &[("level", "%zz"), ("x", "")]),
        ];
        for (input, want) in cases {
            let got = parse_query(input);
            let got: Vec<(&str, &str)> =
                got.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            assert_eq!(got, want, "{input:?}");
        }
    }
}
