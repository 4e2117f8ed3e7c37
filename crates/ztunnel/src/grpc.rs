//! gRPC channels to the control plane (xDS, CA) over our own TLS configuration.
//!
//! tonic is built without its TLS features (one TLS stack, one crypto provider): the channel
//! gets a connector that dials TCP and runs the handshake with an `ambit_tls` client config.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ambit_tls::rustls::ClientConfig;
use ambit_tls::rustls::pki_types::ServerName;
use ambit_tls::tokio_rustls::TlsConnector;
use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

/// Why a control-plane channel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("invalid control-plane address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error("reading root certificate {path}: {source}")]
    RootFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("root certificate: {0}")]
    Tls(#[from] ambit_tls::ConfigError),
    #[error(
        "the SYSTEM trust store is not supported; give CA_ROOT_CA/XDS_ROOT_CA as a file or PEM"
    )]
    SystemRoots,
}

/// Dials TCP, then TLS with the given config, verifying the URI host (or the config's pinned
/// alternate hostname).
#[derive(Clone)]
struct TlsConnect {
    tls: TlsConnector,
    /// `SO_MARK` for the control-plane connection, so the in-pod rules of a dedicated-mode
    /// workload do not capture ztunnel's own xDS/CA traffic.
    mark: Option<u32>,
}

impl tower_service::Service<Uri> for TlsConnect {
    type Response = TokioIo<ambit_tls::tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let mark = self.mark;
        Box::pin(async move {
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let addr = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .next()
                .ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host}: no address"))
                })?;
            let factory = crate::app::MarkedSocketFactory { mark };
            let opts = ambit_netns::SocketOptions {
                nodelay: true,
                ..Default::default()
            };
            let tcp = ambit_netns::connect_tcp(&factory, addr, None, &opts)
                .await
                .map_err(std::io::Error::other)?;
            let name = ServerName::try_from(host.clone()).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("bad host {host}"))
            })?;
            let stream = tls.connect(name, tcp).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// Loads root PEM text from the configured source.
pub fn load_root(root: &crate::config::RootCert) -> Result<String, GrpcError> {
    match root {
        crate::config::RootCert::Pem(p) => Ok(p.clone()),
        crate::config::RootCert::File(path) => {
            std::fs::read_to_string(path).map_err(|source| GrpcError::RootFile {
                path: path.display().to_string(),
                source,
            })
        }
        crate::config::RootCert::System => Err(GrpcError::SystemRoots),
    }
}

/// A lazily connecting channel to `address` (`https://host:port`).
pub fn channel(
    address: &str,
    root_pem: &str,
    alt_hostname: Option<&str>,
) -> Result<Channel, GrpcError> {
    channel_with_mark(address, root_pem, alt_hostname, None)
}

/// Like [`channel`], with `SO_MARK = mark` on the TCP connection.
pub fn channel_with_mark(
    address: &str,
    root_pem: &str,
    alt_hostname: Option<&str>,
    mark: Option<u32>,
) -> Result<Channel, GrpcError> {
    let config: ClientConfig = ambit_tls::client_config_for_root(root_pem, alt_hostname)?;
    let connector = TlsConnect {
        tls: TlsConnector::from(Arc::new(config)),
        mark,
    };
    // tonic refuses https URIs without its TLS feature; our connector does TLS, so give tonic
    // an http URI with the same authority.
    let uri: Uri = address
        .parse()
        .map_err(|e: http::uri::InvalidUri| GrpcError::Address {
            address: address.into(),
            reason: e.to_string(),
        })?;
    let authority = uri.authority().ok_or_else(|| GrpcError::Address {
        address: address.into(),
        reason: "missing host".into(),
    })?;
    let endpoint = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|e| GrpcError::Address {
            address: address.into(),
            reason: e.to_string(),
        })?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .tcp_keepalive(Some(Duration::from_secs(300)));
    Ok(endpoint.connect_with_connector_lazy(connector))
}
