//! Readiness (§8.4): a registry of named start-up tasks and the `/healthz/ready` server (15021).
//!
//! Each component that must finish before the node is ready registers a task
//! (`"state manager"`, `"workload proxy manager"`, `"proxy"`, `"dns proxy"`) and holds the
//! returned [`BlockReady`] until it is done; dropping the guard (or
//! [`BlockReady::mark_ready`]) clears it. The process is ready when nothing is pending.
//! The same name may be registered more than once; it stays pending until every guard of
//! that name is gone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::{Method, Request, StatusCode, header};
use hyper::body::Incoming;
use tokio::sync::watch;

use crate::drain::DrainWatcher;
use crate::telemetry::http_server::{self as srv, Body};

/// Errors at the readiness boundary.
#[derive(Debug, thiserror::Error)]
pub enum ReadinessError {
    #[error("failed to bind readiness server on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[derive(Debug)]
struct Inner {
    /// Name → number of live guards with that name.
    pending: Mutex<BTreeMap<String, usize>>,
    /// Mirrors "nothing pending", for [`Ready::wait_ready`].
    ready: watch::Sender<bool>,
}

/// The readiness registry. Cheap to clone; all clones share the same tasks.
#[derive(Debug, Clone)]
pub struct Ready {
    inner: Arc<Inner>,
}

impl Default for Ready {
    fn default() -> Self {
        Self::new()
    }
}

impl Ready {
    /// A registry with nothing pending (ready until a task is registered).
    pub fn new() -> Self {
        let (ready, _) = watch::channel(true);
        Ready {
            inner: Arc::new(Inner {
                pending: Mutex::new(BTreeMap::new()),
                ready,
            }),
        }
    }

    /// Registers a pending task; the process is not ready until the guard is gone.
    pub fn register_task(&self, name: impl Into<String>) -> BlockReady {
        let name = name.into();
        self.update(|p| *p.entry(name.clone()).or_insert(0) += 1);
        BlockReady {
            ready: self.clone(),
            name,
        }
    }

    /// The names of the pending tasks, sorted, each once.
    pub fn pending(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Whether nothing is pending.
    pub fn is_ready(&self) -> bool {
        self.lock().is_empty()
    }

    /// Resolves once nothing is pending.
    pub async fn wait_ready(&self) {
        let mut rx = self.inner.ready.subscribe();
        // The sender lives in `inner`, which `self` keeps alive: this cannot fail.
        let _ = rx.wait_for(|r| *r).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, usize>> {
        // The map stays consistent even if a holder panicked: every update is one statement.
        self.inner.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut BTreeMap<String, usize>)) {
        let mut pending = self.lock();
        f(&mut pending);
        let ready = pending.is_empty();
        // Under the lock so concurrent updates cannot publish out of order.
        self.inner
            .ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }

    fn release(&self, name: &str) {
        self.update(|p| {
            if let Some(n) = p.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    p.remove(name);
                }
            }
        });
    }
}

/// A pending readiness task; clears itself when dropped.
#[derive(Debug)]
#[must_use = "the task is cleared as soon as the guard is dropped"]
pub struct BlockReady {
    ready: Ready,
    name: String,
}

impl BlockReady {
    /// The task is done (same as dropping the guard, but says so at the call site).
    pub fn mark_ready(self) {}

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for BlockReady {
    fn drop(&mut self) {
        self.ready.release(&self.name);
    }
}

/// A bound, not yet serving, readiness server.
#[derive(Debug)]
pub struct ReadinessServer {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    ready: Ready,
}

impl ReadinessServer {
    /// Binds `addr` (normally `[::]:15021`). Does not need a runtime.
    pub fn bind(addr: SocketAddr, ready: Ready) -> Result<Self, ReadinessError> {
        let bind_err = |source| ReadinessError::Bind { addr, source };
        let listener = srv::bind(addr).map_err(bind_err)?;
        let local_addr = listener.local_addr().map_err(bind_err)?;
        Ok(ReadinessServer {
            listener,
            local_addr,
            ready,
        })
    }

    /// The bound address (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves probes until `drain` is signaled.
    pub async fn serve(self, drain: DrainWatcher) {
        let ready = self.ready;
        srv::serve("readiness", vec![self.listener], drain, move |req| {
            let ready = ready.clone();
            async move { handle(&ready, &req) }
        })
        .await;
    }
}

fn handle(ready: &Ready, req: &Request<Incoming>) -> http::Response<Body> {
    if req.uri().path() != "/healthz/ready" {
        return srv::text(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET {
        let mut resp = srv::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        resp.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
        return resp;
    }
    let pending = ready.pending();
    if pending.is_empty() {
        srv::text(StatusCode::OK, "ready\n")
    } else {
        srv::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("not ready, pending: {}\n", pending.join(", ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn duplicate_names_stay_pending_until_all_guards_drop() {
        let ready = Ready::new();
        assert!(ready.is_ready());
        let a1 = ready.register_task("proxy");
        let a2 = ready.register_task("proxy");
        let b = ready.register_task("dns proxy");
        assert_eq!(ready.pending(), ["dns proxy", "proxy"]);
        drop(a1);
        assert_eq!(ready.pending(), ["dns proxy", "proxy"]);
        a2.mark_ready();
        b.mark_ready();
        ready.wait_ready().await;
        assert!(ready.is_ready());
    }
}
