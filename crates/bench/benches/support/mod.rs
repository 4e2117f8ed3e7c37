//! A client and a server HBONE endpoint in one process: certificates from a local CA, mTLS
//! (the same rustls configurations ztunnel uses) and HTTP/2 CONNECT over a loopback TCP
//! connection or an in-memory pipe. Shared by the HBONE micro-benchmarks.

#![allow(dead_code)] // each bench uses a part

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ambit_hbone::{ConnectRequest, ConnectTarget, H2Settings, HboneClient, Responder};
use ambit_model::SpiffeId;
use ambit_tls::LocalCa;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// What the server does with an accepted tunnel.
#[derive(Clone, Copy, Debug)]
pub enum Serve {
    /// Read until the client ends the stream, then end ours.
    Drain,
    /// Copy the tunnel both ways to an in-memory "application" that echoes.
    CopyToEcho,
    /// Copy the tunnel both ways to an in-memory "application" that discards.
    CopyToSink,
}

/// Certificates and TLS configurations for one client and one server identity.
pub struct Tls {
    pub client: Arc<tokio_rustls::rustls::ClientConfig>,
    pub server: Arc<tokio_rustls::rustls::ServerConfig>,
}

pub fn tls() -> Tls {
    let ca = LocalCa::generate("cluster.local").expect("CA");
    let id = |sa: &str| SpiffeId::new("cluster.local", "default", sa).expect("id");
    let day = Duration::from_secs(86_400);
    let client_cert = ca.issue(&id("client"), day).expect("client cert");
    let server_cert = ca.issue(&id("server"), day).expect("server cert");
    Tls {
        client: Arc::new(
            ambit_tls::client_config(&client_cert, vec![id("server")]).expect("client config"),
        ),
        server: Arc::new(ambit_tls::server_config(&server_cert).expect("server config")),
    }
}

/// The CONNECT target every request names.
pub fn target() -> ConnectTarget {
    ConnectTarget::Addr(SocketAddr::from(([10, 0, 0, 2], 8080)))
}

async fn handle(serve: Serve, _req: ConnectRequest, responder: Responder) {
    let Ok(mut tunnel) = responder.accept(http::HeaderMap::new()) else {
        return;
    };
    match serve {
        Serve::Drain => {
            let _ = tokio::io::copy(&mut tunnel, &mut tokio::io::sink()).await;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut tunnel).await;
        }
        Serve::CopyToEcho | Serve::CopyToSink => {
            let (mut proxy_end, app_end) = tokio::io::duplex(256 * 1024);
            tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(app_end);
                match serve {
                    Serve::CopyToEcho => {
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                    }
                    _ => {
                        let _ = tokio::io::copy(&mut r, &mut tokio::io::sink()).await;
                    }
                }
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut w).await;
            });
            let _ = ambit_hbone::copy_bidirectional(&mut proxy_end, &mut tunnel).await;
        }
    }
}

/// Serves HBONE on `io` (already through TLS, or plain) until the client goes away.
pub fn spawn_server<IO>(io: IO, serve: Serve)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let settings = H2Settings::default();
        let handler = move |req, responder| handle(serve, req, responder);
        let _ = ambit_hbone::serve_connection(io, &settings, handler, std::future::pending()).await;
    });
}

/// A loopback mTLS HBONE server: accepts connections forever (until the runtime stops).
pub async fn tls_server(tls: &Tls, serve: Serve) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = TlsAcceptor::from(tls.server.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(stream) = acceptor.accept(tcp).await {
                    spawn_server(stream, serve);
                }
            });
        }
    });
    addr
}

/// A new TCP + TLS + HTTP/2 connection to `addr`, driven by a spawned task.
pub async fn tls_client(tls: &Tls, addr: SocketAddr) -> HboneClient {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let stream = TlsConnector::from(tls.client.clone())
        .connect(ambit_tls::hbone_server_name(), tcp)
        .await
        .expect("TLS handshake");
    client_over(stream).await
}

/// An HBONE client over `io`, its connection driven by a spawned task.
pub async fn client_over<IO>(io: IO) -> HboneClient
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, driver) = HboneClient::handshake(io, &H2Settings::default())
        .await
        .expect("h2 handshake");
    tokio::spawn(driver);
    client
}

/// A current-thread runtime: client and server share one core, so a figure is the whole
/// CPU cost of both ends.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}
