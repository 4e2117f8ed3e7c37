//! The HBONE connection pool of one proxy (§3.4): keyed by source identity, expected
//! destination identities, destination socket address and source IP; dials through the
//! proxy's socket factory (so connections of a pod leave from the pod's netns, marked) and
//! runs mTLS with the source identity's current certificate.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ambit_hbone::{
    ConnectResponse, ConnectTarget, EarlyData, H2Stream, Pool, PoolConfig, PoolError,
};
use ambit_model::SpiffeId;
use ambit_netns::{SocketFactory, SocketOptions};
use ambit_tls::tokio_rustls::TlsConnector;
use http::HeaderMap;

use crate::identity::CertManager;

/// What makes two CONNECTs share an HTTP/2 connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub src_identity: SpiffeId,
    pub dst_identities: Vec<SpiffeId>,
    pub dst: SocketAddr,
    pub src_ip: Option<IpAddr>,
}

/// Why dialling a pooled connection failed, with the side that failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("local: no certificate for {identity}: {source}")]
    Certificate {
        identity: SpiffeId,
        #[source]
        source: crate::identity::IdentityError,
    },
    #[error("local: TLS configuration: {0}")]
    TlsConfig(#[from] ambit_tls::ConfigError),
    #[error("upstream: TCP connect to {dst}: {source}")]
    Tcp {
        dst: SocketAddr,
        #[source]
        source: ambit_netns::SocketError,
    },
    #[error(
        "upstream: connection to {dst} timed out, maybe a NetworkPolicy is blocking HBONE port 15008"
    )]
    Timeout { dst: SocketAddr },
    #[error("upstream: TLS handshake with {dst}: {source}")]
    Tls {
        dst: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The pool plus what its connector needs.
#[derive(Clone, Debug)]
pub struct WorkloadPool {
    pool: Pool<PoolKey>,
}

/// Dial timeout for HBONE connections (§1.3).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl WorkloadPool {
    pub fn new(
        config: PoolConfig,
        certs: Arc<CertManager>,
        factory: Arc<dyn SocketFactory>,
        opts: SocketOptions,
    ) -> Self {
        let pool = Pool::new(config, move |key: PoolKey| {
            let certs = certs.clone();
            let factory = factory.clone();
            let opts = opts.clone();
            async move { dial(&certs, factory.as_ref(), &opts, &key).await }
        });
        Self { pool }
    }

    /// Opens a CONNECT stream to `target` over a pooled connection for `key`, sending
    /// `early`'s first bytes with the request.
    pub async fn connect_early<S: tokio::io::AsyncRead + Unpin>(
        &self,
        key: PoolKey,
        target: &ConnectTarget,
        headers: HeaderMap,
        early: &mut EarlyData<'_, S>,
    ) -> Result<(ConnectResponse, H2Stream), PoolError> {
        self.pool.connect_early(key, target, headers, early).await
    }
}

async fn dial(
    certs: &Arc<CertManager>,
    factory: &dyn SocketFactory,
    opts: &SocketOptions,
    key: &PoolKey,
) -> Result<ambit_tls::tokio_rustls::client::TlsStream<ambit_hbone::ReadAhead>, DialError> {
    let cert = certs
        .fetch(&key.src_identity)
        .await
        .map_err(|source| DialError::Certificate {
            identity: key.src_identity.clone(),
            source,
        })?;
    let config = ambit_tls::client_config(&cert, key.dst_identities.clone())?;
    let dst = key.dst;
    let connect = async {
        let tcp = ambit_netns::connect_tcp(factory, dst, None, opts)
            .await
            .map_err(|source| DialError::Tcp { dst, source })?;
        let tcp = ambit_hbone::ReadAhead::new(tcp, super::HBONE_READ_AHEAD);
        let mut tls = TlsConnector::from(Arc::new(config))
            .connect(ambit_tls::hbone_server_name(), tcp)
            .await
            .map_err(|source| DialError::Tls { dst, source })?;
        tls.get_mut()
            .1
            .set_buffer_limit(Some(super::HBONE_TLS_SEND_LIMIT));
        Ok(tls)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| DialError::Timeout { dst })?
}
