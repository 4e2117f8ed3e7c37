//! The node-local endpoints (metrics, admin, readiness) on the one HTTP/1 server loop
//! ([`ambit_http`]): bounded request heads, a header-read deadline, a connection cap and an
//! accept-error backoff; bodies are never read.
//!
//! Listeners are bound synchronously (so a busy port is reported at start, before any task
//! is spawned) and served by [`serve`], which stops accepting when the drain is signaled,
//! lets in-flight requests finish (idle keep-alive connections close at once) and drops the
//! rest when the drain is forced.

use std::future::Future;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::task::JoinSet;

pub(crate) use ambit_http::{Body, text, with_type};

use crate::drain::DrainWatcher;

/// Binds a listening TCP socket, non-blocking, ready for [`serve`].
pub(crate) fn bind(addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    ambit_http::bind_tcp(addr)
}

/// Serves `handler` on every listener until the drain is forced or all connections finished
/// after the drain signal. `name` only labels logs.
pub(crate) async fn serve<H, F>(
    name: &'static str,
    listeners: Vec<std::net::TcpListener>,
    drain: DrainWatcher,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut loops = JoinSet::new();
    for listener in listeners {
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => {
                let (drain, handler) = (drain.clone(), handler.clone());
                loops.spawn(async move {
                    let limits = ambit_http::Limits::default();
                    let stop = async {
                        drain.signaled().await;
                    };
                    ambit_http::serve(name, l, limits, stop, drain.forced(), handler).await;
                });
            }
            Err(error) => tracing::error!(server = name, %error, "cannot register listener"),
        }
    }
    drop(drain);
    while loops.join_next().await.is_some() {}
}
