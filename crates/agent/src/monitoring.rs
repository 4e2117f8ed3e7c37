//! The node agents' health and metrics servers (`spec/cni.md` §6.2, §6.3), one code path for
//! the Linux agent ([`crate::daemon`]) and the Windows one (`crate::windows::agent`): on the
//! health address `GET /healthz` answers `200 ok` while the process serves and `GET /readyz`
//! `200 ready` or `503 not ready` as [`Monitored::is_ready`] says; on the metrics address
//! `GET /metrics` answers the Prometheus text exposition [`Monitored::metrics_text`] renders.
//! Anything else is `404`. Both are plain TCP on the [`ambit_http`] loop, with the agent's
//! [`Limits`]; what each agent counts as ready and which metrics it has is its own.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use ambit_http::{Body, Limits};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the two servers read from a running agent.
pub trait Monitored: Send + Sync + 'static {
    /// Whether `/readyz` answers 200.
    fn is_ready(&self) -> bool;
    /// The `/metrics` body (Prometheus / OpenMetrics text).
    fn metrics_text(&self) -> String;
}

/// A server socket that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("binding {what} on {addr}: {source}")]
pub struct BindError {
    /// `health server` or `metrics server`.
    pub what: &'static str,
    /// The address asked for.
    pub addr: SocketAddr,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// The health and metrics listeners, bound, not yet serving.
#[derive(Debug)]
pub struct MonitoringServers {
    health: TcpListener,
    metrics: TcpListener,
    /// Where `/healthz` and `/readyz` are served (the port chosen when asked for 0).
    pub health_addr: SocketAddr,
    /// Where `/metrics` is served.
    pub metrics_addr: SocketAddr,
}

#[derive(Debug, Clone, Copy)]
enum Route {
    Health,
    Metrics,
}

impl MonitoringServers {
    /// Binds both, health first; a busy or forbidden address fails here, before anything
    /// is spawned.
    pub async fn bind(health: SocketAddr, metrics: SocketAddr) -> Result<Self, BindError> {
        async fn one(what: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
            TcpListener::bind(addr)
                .await
                .map_err(|source| BindError { what, addr, source })
        }
        let local = |what, addr, l: &TcpListener| {
            l.local_addr()
                .map_err(|source| BindError { what, addr, source })
        };
        let health_listener = one("health server", health).await?;
        let metrics_listener = one("metrics server", metrics).await?;
        Ok(Self {
            health_addr: local("health server", health, &health_listener)?,
            metrics_addr: local("metrics server", metrics, &metrics_listener)?,
            health: health_listener,
            metrics: metrics_listener,
        })
    }

    /// Serves both on `tasks` until `stop` turns true (open connections are then dropped).
    pub fn spawn<M: Monitored>(
        self,
        tasks: &mut JoinSet<()>,
        limits: Limits,
        state: Arc<M>,
        stop: watch::Receiver<bool>,
    ) {
        for (name, listener, route) in [
            ("health", self.health, Route::Health),
            ("metrics", self.metrics, Route::Metrics),
        ] {
            let state = state.clone();
            let handler = move |req: Request<Incoming>| {
                let state = state.clone();
                async move { respond(route, &req, state.as_ref()) }
            };
            tasks.spawn(serve_until(name, listener, limits, stop.clone(), handler));
        }
    }
}

/// Serves `handler` on `listener` ([`ambit_http::serve`]) until `stop` turns true; open
/// connections are then dropped at once, as the agent always has.
pub(crate) async fn serve_until<L, H, F>(
    name: &'static str,
    listener: L,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    handler: H,
) where
    L: ambit_http::Listener,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    ambit_http::serve(
        name,
        listener,
        limits,
        stopped,
        std::future::ready(()),
        handler,
    )
    .await;
}

/// A response with `status` and `body` and no content type.
pub(crate) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::new(body.into()));
    *r.status_mut() = status;
    r
}

fn respond(route: Route, req: &Request<Incoming>, state: &impl Monitored) -> Response<Body> {
    match (route, req.method(), req.uri().path()) {
        (Route::Health, &Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (Route::Health, &Method::GET, "/readyz") => {
            if state.is_ready() {
                text(StatusCode::OK, "ready")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready")
            }
        }
        (Route::Metrics, &Method::GET, "/metrics") => {
            let mut r = text(StatusCode::OK, state.metrics_text());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}
