//! A minimal HTTP/1.1 server loop for the node-local endpoints (metrics, admin, readiness).
//!
//! Listeners are bound synchronously (so a busy port is reported at start, before any task
//! is spawned) and served by [`serve`], which stops accepting when the drain is signaled,
//! lets in-flight requests finish (idle keep-alive connections close at once) and drops the
//! rest when the drain is forced. Request heads are bounded; bodies are never read.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::task::JoinSet;

use crate::drain::DrainWatcher;

pub(crate) type Body = Full<Bytes>;

/// Largest request head (request line + headers) we buffer; hyper's floor is 8 KiB.
const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// A client that has not sent its head by then is dropped (slowloris guard).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Back-off after a failed accept (EMFILE and friends) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Binds a listening TCP socket, non-blocking, ready for [`serve`].
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    // A restarted ztunnel must be able to rebind while old connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // `[::]` serves IPv4 too, like upstream's listeners.
        socket.set_only_v6(false)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A plain-text response.
pub(crate) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A response with an explicit content type.
pub(crate) fn with_type(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut resp = text(status, body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
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
                loops.spawn(accept_loop(name, l, drain.clone(), handler.clone()));
            }
            Err(error) => tracing::error!(server = name, %error, "cannot register listener"),
        }
    }
    drop(drain);
    while loops.join_next().await.is_some() {}
}

async fn accept_loop<H, F>(
    name: &'static str,
    listener: tokio::net::TcpListener,
    drain: DrainWatcher,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = drain.signaled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    conns.spawn(serve_conn(stream, peer, drain.clone(), handler.clone()));
                }
                Err(error) => {
                    tracing::warn!(server = name, %error, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                }
            },
            // Reap finished connections so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    tokio::select! {
        () = async { while conns.join_next().await.is_some() {} } => {}
        () = drain.forced() => conns.abort_all(),
    }
    tracing::debug!(server = name, "server drained");
}

async fn serve_conn<H, F>(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    drain: DrainWatcher,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let service = service_fn(move |req| {
        let fut = handler(req);
        async move { Ok::<_, Infallible>(fut.await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .max_buf_size(MAX_REQUEST_HEAD)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = drain.signaled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%peer, %error, "http connection ended with error");
    }
}
