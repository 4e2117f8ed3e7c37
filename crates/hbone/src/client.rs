//! HBONE client: HTTP/2 handshake over an established (normally mTLS) stream and classic
//! CONNECT requests on it (spec §3.2).

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::authority::ConnectTarget;
use crate::keepalive::{self, KeepaliveFailure};
use crate::settings::H2Settings;
use crate::stream::H2Stream;

/// Client-side failures. Each variant names the side that failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("client: HTTP/2 handshake with the server failed")]
    Handshake(#[source] h2::Error),
    #[error("client: connection to the server can no longer open streams")]
    ConnectionUnavailable(#[source] h2::Error),
    #[error("client: building the CONNECT request for `{authority}` failed")]
    InvalidRequest {
        authority: String,
        #[source]
        source: http::Error,
    },
    #[error("server: CONNECT stream failed before a response arrived")]
    NoResponse(#[source] h2::Error),
    #[error("server: answered CONNECT with status {status}")]
    Status {
        status: StatusCode,
        headers: HeaderMap,
    },
    #[error("server: no PONG within {0:?}, connection dropped")]
    KeepaliveTimeout(Duration),
    #[error("client: HTTP/2 connection failed")]
    Connection(#[source] h2::Error),
    #[error("client: reading the first bytes to send with the CONNECT request failed")]
    EarlyData(#[source] io::Error),
}

impl ClientError {
    /// True when the connection itself is unusable (as opposed to one request failing), so
    /// a pool should drop it and dial again.
    pub fn is_connection_level(&self) -> bool {
        match self {
            ClientError::Handshake(_)
            | ClientError::ConnectionUnavailable(_)
            | ClientError::KeepaliveTimeout(_)
            | ClientError::Connection(_) => true,
            ClientError::NoResponse(e) => e.is_go_away() || e.is_io(),
            ClientError::InvalidRequest { .. }
            | ClientError::Status { .. }
            | ClientError::EarlyData(_) => false,
        }
    }
}

/// The successful (200) CONNECT response.
#[derive(Debug, Clone)]
pub struct ConnectResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
}

/// Handle for opening CONNECT streams on one HTTP/2 connection. Cheap to clone; the
/// connection closes once every handle and stream is dropped.
#[derive(Debug, Clone)]
pub struct HboneClient {
    send: h2::client::SendRequest<Bytes>,
}

impl HboneClient {
    /// Performs the HTTP/2 handshake over `io`. The returned future drives the connection
    /// (frames, flow control, keepalive) and must be spawned; it resolves when the
    /// connection closes.
    pub async fn handshake<IO>(
        io: IO,
        settings: &H2Settings,
    ) -> Result<
        (
            HboneClient,
            impl Future<Output = Result<(), ClientError>> + Send + 'static,
        ),
        ClientError,
    >
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (send, mut conn) = settings
            .client_builder()
            .handshake(io)
            .await
            .map_err(ClientError::Handshake)?;
        let ping_pong = conn.ping_pong();
        let (interval, timeout) = (settings.keepalive_interval, settings.keepalive_timeout);
        let driver = async move {
            tokio::select! {
                r = conn => r.map_err(ClientError::Connection),
                failure = keepalive::run(ping_pong, interval, timeout) => Err(match failure {
                    KeepaliveFailure::Timeout(t) => ClientError::KeepaliveTimeout(t),
                    KeepaliveFailure::H2(e) => ClientError::Connection(e),
                }),
            }
        };
        Ok((HboneClient { send }, driver))
    }

    /// Opens a CONNECT tunnel to `target` with extra request `headers` (baggage,
    /// forwarded, traceparent …). Any status other than 200 is an error.
    pub async fn send_connect(
        &self,
        target: &ConnectTarget,
        headers: HeaderMap,
    ) -> Result<(ConnectResponse, H2Stream), ClientError> {
        self.send_connect_leased(target, headers, None, &mut EarlyData::none())
            .await
    }

    /// [`send_connect`](Self::send_connect), sending what `early`'s source has to say while
    /// the response is on its way (see [`EarlyData`]).
    pub async fn send_connect_early<S: AsyncRead + Unpin>(
        &self,
        target: &ConnectTarget,
        headers: HeaderMap,
        early: &mut EarlyData<'_, S>,
    ) -> Result<(ConnectResponse, H2Stream), ClientError> {
        self.send_connect_leased(target, headers, None, early).await
    }

    pub(crate) async fn send_connect_leased<S: AsyncRead + Unpin>(
        &self,
        target: &ConnectTarget,
        headers: HeaderMap,
        lease: Option<crate::pool::Lease>,
        early: &mut EarlyData<'_, S>,
    ) -> Result<(ConnectResponse, H2Stream), ClientError> {
        let authority = target.to_string();
        let mut req = Request::builder()
            .method(Method::CONNECT)
            .uri(authority.as_str())
            .body(())
            .map_err(|source| ClientError::InvalidRequest { authority, source })?;
        *req.headers_mut() = headers;
        let mut send = self
            .send
            .clone()
            .ready()
            .await
            .map_err(ClientError::ConnectionUnavailable)?;
        let (mut response, mut send_stream) = send
            .send_request(req, false)
            .map_err(ClientError::ConnectionUnavailable)?;
        let response =
            poll_fn(|cx| early.poll_while_pending(cx, &mut send_stream, &mut response)).await?;
        let (parts, recv) = response.into_parts();
        if parts.status != StatusCode::OK {
            // Dropping both halves resets the stream if the server left it open.
            return Err(ClientError::Status {
                status: parts.status,
                headers: parts.headers,
            });
        }
        let resp = ConnectResponse {
            status: parts.status,
            headers: parts.headers,
        };
        Ok((resp, H2Stream::new(send_stream, recv, lease)))
    }

    /// Streams the server currently allows this client to open at once
    /// (its SETTINGS_MAX_CONCURRENT_STREAMS, or the initial assumption before it arrives).
    pub fn peer_max_concurrent_streams(&self) -> usize {
        self.send.current_max_send_streams()
    }
}

/// Bytes read from the client's socket *before* the CONNECT response and sent right after
/// the request's HEADERS, so the server's ztunnel has the client's first flight (a request,
/// a TLS ClientHello) when the tunnel opens instead of one round trip later.
///
/// Bounded by `limit` (what h2 may buffer for a stream whose window is not yet known). The
/// server's ztunnel only passes the bytes on once it has authorised the request and
/// connected the application, so policy still decides before anything reaches a workload;
/// a refused CONNECT drops them with the stream. Until the response arrives the chunks are
/// kept (as shared [`Bytes`]) so a retry on another connection sends them again. The
/// source's end (EOF) is not sent here: the copy that follows reads it again.
pub struct EarlyData<'a, S> {
    source: Option<&'a mut S>,
    limit: usize,
    sent: Vec<Bytes>,
    total: usize,
    done: bool,
    /// Chunks of `sent` already handed to the current stream.
    queued: usize,
}

impl<S> std::fmt::Debug for EarlyData<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyData")
            .field("limit", &self.limit)
            .field("total", &self.total)
            .field("chunks", &self.sent.len())
            .field("done", &self.done)
            .finish()
    }
}

impl<'a, S: AsyncRead + Unpin> EarlyData<'a, S> {
    /// Reads up to `limit` bytes from `source` while a response is pending. A `limit` of 0
    /// sends nothing early.
    pub fn new(source: &'a mut S, limit: usize) -> Self {
        Self {
            source: Some(source),
            limit,
            sent: Vec::new(),
            total: 0,
            done: limit == 0,
            queued: 0,
        }
    }

    /// Bytes read from the source (and sent on the stream that got the response).
    pub fn bytes(&self) -> u64 {
        self.total as u64
    }

    /// Hands `send` what earlier attempts already sent, then reads and sends more until the
    /// response arrives or the limit is reached.
    fn poll_while_pending(
        &mut self,
        cx: &mut Context<'_>,
        send: &mut h2::SendStream<Bytes>,
        response: &mut h2::client::ResponseFuture,
    ) -> Poll<Result<http::Response<h2::RecvStream>, ClientError>> {
        // A retry on a new stream starts from the first chunk again.
        while self.queued < self.sent.len() {
            let chunk = self.sent[self.queued].clone();
            send.send_data(chunk, false)
                .map_err(ClientError::NoResponse)?;
            self.queued += 1;
        }
        // Read before polling the response, so a first flight already in the socket goes
        // out with the HEADERS in one flush.
        while !self.done {
            match self.poll_read_chunk(cx) {
                Poll::Ready(Ok(Some(chunk))) => {
                    send.send_data(chunk.clone(), false)
                        .map_err(ClientError::NoResponse)?;
                    self.sent.push(chunk);
                    self.queued = self.sent.len();
                }
                Poll::Ready(Ok(None)) => self.done = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(ClientError::EarlyData(e))),
                Poll::Pending => break,
            }
        }
        let r = std::task::ready!(Pin::new(response).poll(cx));
        // This stream is answered; a retry (connection-level failure) starts a new one.
        self.queued = 0;
        if r.is_ok() {
            self.sent = Vec::new();
        }
        Poll::Ready(r.map_err(ClientError::NoResponse))
    }

    /// One read from the source into the thread's read arena (as the copy reads): no
    /// allocation of its own. `None` at EOF or at the limit.
    fn poll_read_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        let room = self.limit.saturating_sub(self.total);
        let Some(source) = self.source.as_deref_mut() else {
            return Poll::Ready(Ok(None));
        };
        if room == 0 {
            return Poll::Ready(Ok(None));
        }
        let Some(chunk) = std::task::ready!(crate::copy::read_first_flight(cx, source, room))?
        else {
            return Poll::Ready(Ok(None));
        };
        self.total += chunk.len();
        Poll::Ready(Ok(Some(chunk)))
    }
}

impl EarlyData<'static, tokio::io::Empty> {
    /// Nothing to send early.
    pub fn none() -> Self {
        Self {
            source: None,
            limit: 0,
            sent: Vec::new(),
            total: 0,
            done: true,
            queued: 0,
        }
    }
}
