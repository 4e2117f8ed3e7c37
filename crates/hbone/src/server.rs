//! HBONE server: accepts classic HTTP/2 CONNECT requests on one connection and lets a
//! handler decide each stream's fate (spec §3.2): 200 and a tunnel, or an error status
//! with an empty body.
//!
//! Requests that are not CONNECT, or whose authority does not parse, are answered 400
//! here and never reach the handler. Drain sends GOAWAY, lets in-flight streams finish
//! until [`H2Settings::drain_deadline`], then closes the connection.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::authority::{AuthorityError, ConnectTarget, parse_authority};
use crate::keepalive::{self, KeepaliveFailure};
use crate::settings::H2Settings;
use crate::stream::H2Stream;
use crate::tasks::TaskSet;

/// Failures of a served connection. Each variant names the side that failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("client: HTTP/2 handshake failed")]
    Handshake(#[source] h2::Error),
    #[error("client: no HTTP/2 preface within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("client: HTTP/2 connection failed")]
    Connection(#[source] h2::Error),
    #[error("client: no PONG within {0:?}, connection dropped")]
    KeepaliveTimeout(Duration),
    #[error("server: sending the CONNECT response failed")]
    Respond(#[source] h2::Error),
}

/// Why a request was refused before reaching the handler (always answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("client: method {0} is not CONNECT")]
    NotConnect(Method),
    #[error("client: CONNECT without an authority")]
    MissingAuthority,
    #[error("client: CONNECT authority is invalid")]
    BadAuthority(#[source] AuthorityError),
}

impl RequestError {
    /// The status to answer with.
    pub fn status(&self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }
}

/// Checks that a request is a classic CONNECT with a valid authority. Pure; the server
/// calls it on every request before the handler.
pub fn validate_request<B>(req: &Request<B>) -> Result<ConnectTarget, RequestError> {
    if req.method() != Method::CONNECT {
        return Err(RequestError::NotConnect(req.method().clone()));
    }
    let authority = req
        .uri()
        .authority()
        .ok_or(RequestError::MissingAuthority)?;
    parse_authority(authority.as_str()).map_err(RequestError::BadAuthority)
}

/// A validated CONNECT request, handed to the handler.
#[derive(Debug)]
pub struct ConnectRequest {
    /// The parsed `:authority`.
    pub target: ConnectTarget,
    /// Request headers (baggage, forwarded, traceparent, …).
    pub headers: HeaderMap,
}

/// The handler's way to answer one CONNECT stream. Dropping it unanswered answers 503, so
/// a handler that bails out early never leaves the client hanging.
#[derive(Debug)]
pub struct Responder {
    respond: Option<SendResponse<Bytes>>,
    recv: Option<RecvStream>,
}

impl Responder {
    /// Answers 200 with `headers` (e.g. response baggage) and returns the tunnel.
    pub fn accept(mut self, headers: HeaderMap) -> Result<H2Stream, ServerError> {
        let (Some(mut respond), Some(recv)) = (self.respond.take(), self.recv.take()) else {
            // Both are only taken here or in reject/drop, which consume self.
            unreachable!("responder answered twice");
        };
        let mut resp = Response::new(());
        *resp.headers_mut() = headers;
        let send = respond
            .send_response(resp, false)
            .map_err(ServerError::Respond)?;
        Ok(H2Stream::new(send, recv, None))
    }

    /// Answers `status` (400, 401, 503 …) with an empty body and END_STREAM.
    pub fn reject(mut self, status: StatusCode) -> Result<(), ServerError> {
        self.reject_inner(status, HeaderMap::new())
    }

    /// Like [`Responder::reject`] with response headers.
    pub fn reject_with_headers(
        mut self,
        status: StatusCode,
        headers: HeaderMap,
    ) -> Result<(), ServerError> {
        self.reject_inner(status, headers)
    }

    fn reject_inner(&mut self, status: StatusCode, headers: HeaderMap) -> Result<(), ServerError> {
        self.recv = None;
        let Some(mut respond) = self.respond.take() else {
            return Ok(());
        };
        respond_empty(&mut respond, status, headers)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if self.respond.is_some() {
            let _ = self.reject_inner(StatusCode::SERVICE_UNAVAILABLE, HeaderMap::new());
        }
    }
}

fn respond_empty(
    respond: &mut SendResponse<Bytes>,
    status: StatusCode,
    headers: HeaderMap,
) -> Result<(), ServerError> {
    let mut resp = Response::new(());
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    respond
        .send_response(resp, true)
        .map(drop)
        .map_err(ServerError::Respond)
}

/// How a served connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionEnd {
    /// The client closed the connection (or it ended without a drain).
    Closed,
    /// Drained: GOAWAY sent and every in-flight stream finished before the deadline.
    Drained,
    /// Drained, but streams were still open at the deadline and were cut.
    DrainForced,
}

/// Serves HBONE on one connection until the client closes it, it fails, or `drain`
/// completes and the graceful drain ends.
///
/// `handler` is called on the connection's task and should only build its future (an
/// `async` block or `async fn` call); that future runs in its own task per stream. Tasks are
/// owned by this call and aborted when it returns.
pub async fn serve_connection<IO, H, Fut>(
    io: IO,
    settings: &H2Settings,
    handler: H,
    drain: impl Future<Output = ()>,
) -> Result<ConnectionEnd, ServerError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(ConnectRequest, Responder) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let handshake = settings.server_builder().handshake(io);
    let mut conn = tokio::time::timeout(settings.server_handshake_timeout, handshake)
        .await
        .map_err(|_| ServerError::HandshakeTimeout(settings.server_handshake_timeout))?
        .map_err(ServerError::Handshake)?;
    let keepalive = keepalive::run(
        conn.ping_pong(),
        settings.keepalive_interval,
        settings.keepalive_timeout,
    );
    let mut keepalive = std::pin::pin!(keepalive);
    let mut drain = std::pin::pin!(drain);
    let mut tasks = TaskSet::new();
    let mut drain_deadline: Option<Instant> = None;

    let end = loop {
        tokio::select! {
            accepted = conn.accept() => match accepted {
                Some(Ok((req, respond))) => on_request(req, respond, &handler, &mut tasks),
                Some(Err(e)) => return Err(ServerError::Connection(e)),
                None if drain_deadline.is_some() => break ConnectionEnd::Drained,
                None => break ConnectionEnd::Closed,
            },
            () = &mut drain, if drain_deadline.is_none() => {
                tracing::debug!("draining HBONE connection: sending GOAWAY");
                conn.graceful_shutdown();
                drain_deadline = Some(Instant::now() + settings.drain_deadline);
            }
            () = sleep_until_opt(drain_deadline) => {
                tracing::debug!(streams = tasks.len(), "drain deadline passed: closing connection");
                conn.abrupt_shutdown(Reason::NO_ERROR);
                // Give h2 a bounded chance to flush the final GOAWAY.
                let flush = async { while conn.accept().await.is_some() {} };
                let _ = tokio::time::timeout(Duration::from_millis(100), flush).await;
                break ConnectionEnd::DrainForced;
            }
            failure = &mut keepalive => return Err(match failure {
                KeepaliveFailure::Timeout(t) => ServerError::KeepaliveTimeout(t),
                KeepaliveFailure::H2(e) => ServerError::Connection(e),
            }),
        }
    };
    if end != ConnectionEnd::DrainForced {
        // The connection is gone, so tunnels fail promptly; give handlers a bounded moment
        // to finish their own cleanup (upstream sockets) before they are aborted.
        let _ = tokio::time::timeout(settings.drain_deadline, tasks.wait()).await;
    }
    tasks.abort_all();
    Ok(end)
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn on_request<H, Fut>(
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    handler: &H,
    tasks: &mut TaskSet,
) where
    H: Fn(ConnectRequest, Responder) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let target = match validate_request(&req) {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, "rejecting HBONE request");
            if let Err(e) = respond_empty(&mut respond, e.status(), HeaderMap::new()) {
                tracing::debug!(error = %e, "could not send 400");
            }
            return;
        }
    };
    let (parts, recv) = req.into_parts();
    let request = ConnectRequest {
        target,
        headers: parts.headers,
    };
    let responder = Responder {
        respond: Some(respond),
        recv: Some(recv),
    };
    // Calling the handler here only builds its future; spawning that future directly (not an
    // async block around the call) keeps the request and responder out of the task's state,
    // which lives as long as the tunnel.
    tasks.spawn(handler(request, responder));
}
