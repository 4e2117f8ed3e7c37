//! A TLS gRPC channel to a control plane under test (tonic is built without TLS), shared by
//! the integration tests that talk real xDS to `ambit_control::server::run`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ambit_tls::tokio_rustls::TlsConnector;
use ambit_tls::tokio_rustls::client::TlsStream;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

#[derive(Clone)]
struct Connect(TlsConnector, SocketAddr);

impl tower_service::Service<Uri> for Connect {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let Connect(tls, addr) = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(addr).await?;
            let name = "localhost".try_into().map_err(std::io::Error::other)?;
            Ok(TokioIo::new(tls.connect(name, tcp).await?))
        })
    }
}

/// A lazy channel to `addr`, trusting the PEM `root`, for the server name `localhost`.
pub fn channel(root: &str, addr: SocketAddr) -> Channel {
    let config = ambit_tls::client_config_for_root(root, None).expect("client TLS config");
    let connect = Connect(TlsConnector::from(Arc::new(config)), addr);
    Endpoint::from_shared(format!("http://localhost:{}", addr.port()))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(connect)
}
