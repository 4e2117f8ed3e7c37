//! HBONE client: HTTP/2 handshake over an established (normally mTLS) stream and classic
//! CONNECT requests on it (spec §3.2).

use std::future::Future;
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
            ClientError::InvalidRequest { .. } | ClientError::Status { .. } => false,
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
        self.send_connect_leased(target, headers, None).await
    }

    pub(crate) async fn send_connect_leased(
        &self,
        target: &ConnectTarget,
        headers: HeaderMap,
        lease: Option<crate::pool::Lease>,
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
        let (response, send_stream) = send
            .send_request(req, false)
            .map_err(ClientError::ConnectionUnavailable)?;
        let response = response.await.map_err(ClientError::NoResponse)?;
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
