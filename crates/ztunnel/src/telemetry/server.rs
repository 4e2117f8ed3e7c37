//! The Prometheus scrape endpoint (15020): `/metrics` and `/stats/prometheus`.
//!
//! OpenMetrics text when the `Accept` header asks for `application/openmetrics-text` (with a
//! non-zero `q`), the classic Prometheus text format otherwise. GET (and HEAD) only.

use std::net::SocketAddr;

use http::{Method, Request, StatusCode, header};
use hyper::body::Incoming;

use super::TelemetryError;
use super::http_server::{self as srv, Body};
use super::metrics::{Exposition, Metrics};
use crate::drain::DrainWatcher;

/// A bound, not yet serving, metrics server.
#[derive(Debug)]
pub struct MetricsServer {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    metrics: Metrics,
}

impl MetricsServer {
    /// Binds `addr` (normally `[::]:15020`). Does not need a runtime.
    pub fn bind(addr: SocketAddr, metrics: Metrics) -> Result<Self, TelemetryError> {
        let bind_err = |source| TelemetryError::Bind { addr, source };
        let listener = srv::bind(addr).map_err(bind_err)?;
        let local_addr = listener.local_addr().map_err(bind_err)?;
        Ok(MetricsServer {
            listener,
            local_addr,
            metrics,
        })
    }

    /// The bound address (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves scrapes until `drain` is signaled (and in-flight scrapes are done).
    pub async fn serve(self, drain: DrainWatcher) {
        let metrics = self.metrics;
        srv::serve("metrics", vec![self.listener], drain, move |req| {
            let metrics = metrics.clone();
            async move { handle(&metrics, &req) }
        })
        .await;
    }
}

fn handle(metrics: &Metrics, req: &Request<Incoming>) -> http::Response<Body> {
    if !matches!(req.uri().path(), "/metrics" | "/stats/prometheus") {
        return srv::text(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = srv::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        resp.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return resp;
    }
    let format = negotiate(
        req.headers()
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    match metrics.encode(format) {
        Ok(body) => srv::with_type(StatusCode::OK, format.content_type(), body),
        Err(_) => srv::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed to encode metrics\n",
        ),
    }
}

/// Picks OpenMetrics if any `Accept` entry names it with a non-zero quality.
pub(crate) fn negotiate<'a>(accept: impl Iterator<Item = &'a str>) -> Exposition {
    let wants_om = accept.flat_map(|v| v.split(',')).any(|entry| {
        let mut parts = entry.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        if !media.eq_ignore_ascii_case("application/openmetrics-text") {
            return false;
        }
        let q = parts
            .filter_map(|p| p.strip_prefix("q="))
            .find_map(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0);
        q > 0.0
    });
    if wants_om {
        Exposition::OpenMetrics
    } else {
        Exposition::Prometheus
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        let cases: [(&[&str], Exposition); 6] = [
            (&[], Exposition::Prometheus),
            (&["text/plain"], Exposition::Prometheus),
            (&["*/*"], Exposition::Prometheus),
            (
                &["application/openmetrics-text; version=1.0.0"],
                Exposition::OpenMetrics,
            ),
            (
                &[
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ],
                Exposition::OpenMetrics,
            ),
            (
                &["text/plain", "application/openmetrics-text;q=0"],
                Exposition::Prometheus,
            ),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(accept.iter().copied()), want, "{accept:?}");
        }
    }
}
