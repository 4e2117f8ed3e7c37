//! Serving gRPC over our own TLS: tonic is built without TLS features, so connections are
//! accepted and handshaken here with an `ambit_tls` server config and handed to tonic.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ambit_tls::rustls::ServerConfig;
use ambit_tls::tokio_rustls::TlsAcceptor;
use ambit_tls::tokio_rustls::server::TlsStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// A TLS connection as tonic wants it.
#[derive(Debug)]
pub struct TlsConn(TlsStream<TcpStream>);

/// What a handler can learn about the peer.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub remote: Option<std::net::SocketAddr>,
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = PeerInfo;
    fn connect_info(&self) -> PeerInfo {
        PeerInfo {
            remote: self.0.get_ref().0.peer_addr().ok(),
        }
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepts TCP connections, runs TLS handshakes concurrently (a slow client cannot stall the
/// accept loop) and yields established connections. Handshake failures are logged and dropped.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> (
    ReceiverStream<Result<TlsConn, std::io::Error>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    let task = tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let handshake =
                    tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp));
                match handshake.await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(TlsConn(tls))).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    (ReceiverStream::new(rx), task)
}

/// Serves `router` on `listener` over TLS until `shutdown` completes.
pub async fn serve_tls(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    router: tonic::service::Routes,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (incoming, accept_task) = tls_incoming(listener, config);
    let result = tonic::transport::Server::builder()
        .add_routes(router)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    accept_task.abort();
    result
}
