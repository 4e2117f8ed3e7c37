//! The one HTTP/1 server loop behind every local endpoint ambit serves: ztunnel's admin,
//! metrics and readiness, the CNI agent's health, metrics, plugin-event (`/cmdadd`) and
//! plugin-log sockets, the control plane's monitoring port.
//!
//! Peers of these endpoints are local but not trusted to behave, so every wait and buffer is
//! bounded ([`Limits`], ztunnel's settings by default):
//!
//! - a request head (request line + headers) of at most [`Limits::max_head`] bytes, read
//!   within [`Limits::header_read_timeout`] (a client that holds its headers open is cut:
//!   slowloris);
//! - a request body of at most [`Limits::max_body`] bytes: a larger `Content-Length` is
//!   answered `413` before the handler runs, and [`read_body`] stops a chunked body at the
//!   limit (also `413`);
//! - at most [`Limits::max_connections`] connections at once; further clients wait in the
//!   kernel's listen backlog until one ends;
//! - a failed `accept` (`EMFILE` and friends) pauses the loop for [`Limits::accept_backoff`]
//!   instead of spinning on a listener that stays readable;
//! - optionally a whole-connection deadline ([`Limits::connection_deadline`]).
//!
//! [`serve`] runs until `stop` resolves, then stops accepting, lets in-flight requests finish
//! (idle keep-alive connections close at once) and drops what is left when `force` resolves.

#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// The response body every handler returns.
pub type Body = Full<Bytes>;

/// Bounds of one server (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request head buffered (hyper's floor is 8 KiB).
    pub max_head: usize,
    /// A client that has not sent a complete head by then is dropped.
    pub header_read_timeout: Duration,
    /// Largest request body accepted.
    pub max_body: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// Pause after a failed accept.
    pub accept_backoff: Duration,
    /// Longest a connection may stay open, whatever it does (`None`: no limit).
    pub connection_deadline: Option<Duration>,
}

impl Default for Limits {
    /// ztunnel's local-endpoint settings: 16 KiB heads, 10 s to send them, 1 MiB bodies,
    /// 256 connections, 50 ms after a failed accept, no connection deadline.
    fn default() -> Self {
        Self {
            max_head: 16 * 1024,
            header_read_timeout: Duration::from_secs(10),
            max_body: 1 << 20,
            max_connections: 256,
            accept_backoff: Duration::from_millis(50),
            connection_deadline: None,
        }
    }
}

/// Something connections are accepted from.
pub trait Listener: Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Waits for the next connection.
    fn accept(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&self) -> io::Result<Self::Io> {
        tokio::net::TcpListener::accept(self)
            .await
            .map(|(io, _)| io)
    }
}

// Unix sockets exist on Unix only (the Windows build has none).
#[cfg(unix)]
impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;

    async fn accept(&self) -> io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self)
            .await
            .map(|(io, _)| io)
    }
}

/// Binds a listening TCP socket, non-blocking, with `SO_REUSEADDR` (a restarted process
/// rebinds while old connections sit in `TIME_WAIT`); `[::]` also serves IPv4. Binding is
/// synchronous so a busy port is reported at start, before anything is spawned.
pub fn bind_tcp(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    with_type(status, "text/plain; charset=utf-8", body)
}

/// A response with an explicit content type.
pub fn with_type(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Longer than the limit.
    #[error("request body larger than {max} bytes")]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// The connection failed while reading.
    #[error("reading request body: {0}")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl BodyError {
    /// The answer to give: `413` for a body that is too large, `400` otherwise.
    pub fn response(&self) -> Response<Body> {
        let status = match self {
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Read(_) => StatusCode::BAD_REQUEST,
        };
        text(status, self.to_string())
    }
}

/// Reads a whole request body of at most `max` bytes.
pub async fn read_body(body: Incoming, max: usize) -> Result<Bytes, BodyError> {
    match Limited::new(body, max).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(BodyError::TooLarge { max }),
        Err(e) => Err(BodyError::Read(e)),
    }
}

/// The declared `Content-Length`, when there is a valid one.
fn content_length<B>(req: &Request<B>) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Serves `handler` on `listener` until `stop` resolves; then accepting stops, in-flight
/// requests finish and idle connections close, and whatever still runs when `force`
/// resolves is dropped. Returns when every connection has ended. `name` labels logs.
pub async fn serve<L, H, F>(
    name: &'static str,
    listener: L,
    limits: Limits,
    stop: impl Future<Output = ()>,
    force: impl Future<Output = ()>,
    handler: H,
) where
    L: Listener,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (draining_tx, draining) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        // Reap finished connections so the set does not grow without bound.
        while conns.try_join_next().is_some() {}
        let slot = tokio::select! {
            () = &mut stop => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                // The semaphore is never closed.
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(io) => {
                let (handler, draining) = (handler.clone(), draining.clone());
                conns.spawn(async move {
                    serve_conn(name, io, limits, draining, handler).await;
                    drop(slot);
                });
            }
            Err(error) => {
                tracing::warn!(server = name, %error, "accept failed");
                drop(slot);
                tokio::select! {
                    () = &mut stop => break,
                    () = tokio::time::sleep(limits.accept_backoff) => {}
                }
            }
        }
    }
    drop(listener);
    let _ = draining_tx.send(true);
    tokio::select! {
        () = async { while conns.join_next().await.is_some() {} } => {}
        () = force => conns.abort_all(),
    }
    while conns.join_next().await.is_some() {}
    tracing::debug!(server = name, "server drained");
}

async fn serve_conn<IO, H, F>(
    name: &'static str,
    io: IO,
    limits: Limits,
    mut draining: watch::Receiver<bool>,
    handler: H,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let max_body = limits.max_body;
    let service = service_fn(move |req: Request<Incoming>| {
        let too_large = content_length(&req).is_some_and(|n| n > max_body as u64);
        let fut = (!too_large).then(|| handler(req));
        async move {
            Ok::<_, Infallible>(match fut {
                Some(fut) => fut.await,
                None => BodyError::TooLarge { max: max_body }.response(),
            })
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .max_buf_size(limits.max_head)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let deadline = async {
        match limits.connection_deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = async {
            // A closed channel means the server is gone: drain too.
            let _ = draining.wait_for(|d| *d).await;
        } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = deadline => {
            tracing::debug!(server = name, "connection deadline passed");
            return;
        }
    };
    if let Err(error) = result {
        tracing::debug!(server = name, %error, "http connection ended with error");
    }
}

#[cfg(test)]
mod tests;
