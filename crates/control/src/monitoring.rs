//! The control plane's monitoring port: `GET /ready` (200 once the first snapshot is published
//! and the gRPC port is bound, 503 before; a Kubernetes readiness probe) and `GET /metrics`
//! (Prometheus text: what the last push contained, and readiness).
//!
//! An outage of the API server does not make the control plane unready: it keeps serving the
//! last snapshot it has (see [`crate::kube_source`]).
//!
//! Served by the one HTTP/1 server loop ([`ambit_http`]) with its default bounds plus a 30 s
//! lifetime per connection (a scrape or probe is one request).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ambit_http::Body;
use bytes::Bytes;
use hyper::{Method, Request, Response, StatusCode, header};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::server::ControlError;

/// How long one monitoring connection may stay open (a scrape or probe is one request).
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);

/// What `/metrics` reports; updated by the server.
#[derive(Debug, Default)]
pub struct Metrics {
    ready: AtomicBool,
    workloads: AtomicU64,
    services: AtomicU64,
    policies: AtomicU64,
    pushes: AtomicU64,
    /// 0 while the mesh config source holds a version that was refused.
    mesh_config_out_of_sync: AtomicBool,
    mesh_config_rejected: AtomicU64,
}

impl Metrics {
    /// A snapshot was published with these counts.
    pub fn published(&self, workloads: usize, services: usize, policies: usize) {
        self.workloads.store(workloads as u64, Ordering::Relaxed);
        self.services.store(services as u64, Ordering::Relaxed);
        self.policies.store(policies as u64, Ordering::Relaxed);
        self.pushes.fetch_add(1, Ordering::Relaxed);
    }

    /// The gRPC port is bound and a snapshot is published.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Whether the mesh config source's latest version is the one in force.
    pub fn mesh_config_in_sync(&self, in_sync: bool) {
        self.mesh_config_out_of_sync
            .store(!in_sync, Ordering::Relaxed);
    }

    /// A mesh config version was refused (the last good one stays).
    pub fn mesh_config_rejected(&self) {
        self.mesh_config_rejected.fetch_add(1, Ordering::Relaxed);
        self.mesh_config_in_sync(false);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let gauge = |name: &str, help: &str, value: u64| {
            format!("# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n")
        };
        let mut out = String::new();
        out.push_str(&gauge(
            "ambit_control_ready",
            "1 once the control plane serves xDS and certificates.",
            u64::from(self.is_ready()),
        ));
        out.push_str(&gauge(
            "ambit_control_workloads",
            "Workloads in the last pushed snapshot.",
            self.workloads.load(Ordering::Relaxed),
        ));
        out.push_str(&gauge(
            "ambit_control_services",
            "Services in the last pushed snapshot.",
            self.services.load(Ordering::Relaxed),
        ));
        out.push_str(&gauge(
            "ambit_control_policies",
            "Authorization policies in the last pushed snapshot.",
            self.policies.load(Ordering::Relaxed),
        ));
        let pushes = self.pushes.load(Ordering::Relaxed);
        out.push_str(&format!(
            "# HELP ambit_control_pushes_total Snapshots published to the xDS server.\n\
             # TYPE ambit_control_pushes_total counter\nambit_control_pushes_total {pushes}\n"
        ));
        out.push_str(&gauge(
            "ambit_control_mesh_config_in_sync",
            "1 when the mesh config source's latest version is in force, 0 after a refused one.",
            u64::from(!self.mesh_config_out_of_sync.load(Ordering::Relaxed)),
        ));
        let rejected = self.mesh_config_rejected.load(Ordering::Relaxed);
        out.push_str(&format!(
            "# HELP ambit_control_mesh_config_rejected_total Mesh config versions refused \
             (bad, or a trust domain change); the last good one stayed.\n\
             # TYPE ambit_control_mesh_config_rejected_total counter\n\
             ambit_control_mesh_config_rejected_total {rejected}\n"
        ));
        out
    }
}

/// The running listener; stops when dropped.
#[derive(Debug)]
pub struct Monitoring {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Monitoring {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` and serves until the returned handle is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<Monitoring, ControlError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ControlError::Listen { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| ControlError::Listen { addr, source })?;
    let limits = ambit_http::Limits {
        connection_deadline: Some(CONNECTION_DEADLINE),
        ..ambit_http::Limits::default()
    };
    let handler = move |req: Request<hyper::body::Incoming>| {
        let metrics = metrics.clone();
        async move { answer(&metrics, &req) }
    };
    // Runs until the handle is dropped (the task is aborted then).
    let task = tokio::spawn(ambit_http::serve(
        "control monitoring",
        listener,
        limits,
        std::future::pending(),
        std::future::pending(),
        handler,
    ));
    Ok(Monitoring { addr, task })
}

fn answer<B>(metrics: &Metrics, req: &Request<B>) -> Response<Body> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/ready") if metrics.is_ready() => {
            (StatusCode::OK, "text/plain", "ready\n".to_string())
        }
        (&Method::GET, "/ready") => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready\n".to_string(),
        ),
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    let mut response = Response::new(Body::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.expect("write");
        let mut out = String::new();
        tcp.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn ready_only_after_the_first_push_and_metrics_say_what_was_pushed() {
        let metrics = Arc::new(Metrics::default());
        let m = serve("127.0.0.1:0".parse().expect("addr"), metrics.clone())
            .await
            .expect("bound");
        assert!(get(m.addr, "/ready").await.starts_with("HTTP/1.1 503"));
        metrics.published(3, 2, 1);
        metrics.set_ready();
        assert!(get(m.addr, "/ready").await.starts_with("HTTP/1.1 200"));
        let text = get(m.addr, "/metrics").await;
        for line in [
            "ambit_control_ready 1",
            "ambit_control_workloads 3",
            "ambit_control_services 2",
            "ambit_control_policies 1",
            "ambit_control_pushes_total 1",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
        assert!(get(m.addr, "/nope").await.starts_with("HTTP/1.1 404"));
    }
}
