//! Ready-made rustls configurations.
//!
//! HBONE (ztunnel ↔ ztunnel, spec §3.1): TLS 1.3 only, AES-GCM suites, ALPN `h2`, mutual
//! authentication with SPIFFE identities, no session resumption (each connection proves its
//! identity with a full handshake; resumed sessions would skip the client-certificate checks
//! of a possibly rotated policy). The client sends no SNI and dials
//! [`hbone_server_name`], so nothing about the destination leaks in clear text.
//!
//! Control plane (xDS, CA gRPC): ordinary server-authenticated TLS with hostname checks.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::SystemTime;

use ambit_model::SpiffeId;
use rustls::client::{ResolvesClientCert, Resumption, WebPkiServerVerifier};
use rustls::server::{
    ClientHello, NoServerSessionStorage, ResolvesServerCert, WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls::version::TLS13;
use rustls::{ClientConfig, ServerConfig, SignatureScheme};
use rustls_pki_types::ServerName;

use crate::cert::{self, CertError, ServerCertificate, WorkloadCertificate};
use crate::provider;
use crate::verify::{PinnedNameVerifier, SpiffeServerVerifier, TrustDomainClientVerifier};

/// The only application protocol HBONE and gRPC speak.
pub const ALPN_H2: &[u8] = b"h2";

/// Why a configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("TLS protocol configuration rejected")]
    Tls(#[source] rustls::Error),
    #[error("building the certificate verifier failed")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    #[error("an HBONE client needs at least one expected server identity")]
    NoExpectedIdentity,
    #[error("root certificates are unusable")]
    Roots(#[source] CertError),
    #[error("{0:?} is not a valid DNS name or IP address")]
    InvalidHostname(String),
}

/// The name HBONE clients dial with: SNI is disabled, so this only satisfies the API.
pub fn hbone_server_name() -> ServerName<'static> {
    ServerName::from(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Inbound HBONE (port 15008): requires a client certificate that chains to the roots of
/// `cert`'s own chain and carries a SPIFFE id in `cert`'s trust domain.
pub fn server_config(cert: &WorkloadCertificate) -> Result<ServerConfig, ConfigError> {
    let provider = provider::shared();
    let webpki = WebPkiClientVerifier::builder_with_provider(cert.root_store(), provider.clone())
        .build()
        .map_err(ConfigError::Verifier)?;
    let verifier =
        TrustDomainClientVerifier::new(webpki, cert.identity().trust_domain().to_string());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&TLS13])
        .map_err(ConfigError::Tls)?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(Arc::new(UnexpiredCert::of(cert)));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// Outbound HBONE: presents `cert` (leaf + intermediates) and accepts a server whose chain
/// validates against `cert`'s roots and whose leaf has a SPIFFE SAN equal to one of
/// `expected`. Dial with [`hbone_server_name`].
pub fn client_config(
    cert: &WorkloadCertificate,
    expected: Vec<SpiffeId>,
) -> Result<ClientConfig, ConfigError> {
    if expected.is_empty() {
        return Err(ConfigError::NoExpectedIdentity);
    }
    let provider = provider::shared();
    let verifier = SpiffeServerVerifier::new(
        cert.root_store(),
        expected,
        provider.signature_verification_algorithms,
    );
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&TLS13])
        .map_err(ConfigError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(UnexpiredCert::of(cert)));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.enable_sni = false;
    config.resumption = Resumption::disabled();
    Ok(config)
}

/// A control-plane gRPC server (xDS, CA): server certificate only, ALPN `h2`.
pub fn server_config_plain(cert: &ServerCertificate) -> Result<ServerConfig, ConfigError> {
    let mut config = ServerConfig::builder_with_provider(provider::shared())
        .with_protocol_versions(&[&TLS13])
        .map_err(ConfigError::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SingleCert(cert.certified_key())));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// A control-plane gRPC client trusting the roots in `root_pem` (one or more certificates).
/// The server's certificate is checked against `alt_hostname` when given (`ALT_CA_HOSTNAME`),
/// else against the name the caller dials.
pub fn client_config_for_root(
    root_pem: &str,
    alt_hostname: Option<&str>,
) -> Result<ClientConfig, ConfigError> {
    let verifier = root_verifier(root_pem, alt_hostname)?;
    let mut config = ClientConfig::builder_with_provider(provider::shared())
        .with_protocol_versions(&[&TLS13])
        .map_err(ConfigError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// Like [`client_config_for_root`], presenting `identity` when the server asks for a client
/// certificate (a kubeconfig's `client-certificate[-data]` and `client-key[-data]`).
pub fn client_config_with_identity(
    root_pem: &str,
    alt_hostname: Option<&str>,
    identity: &ServerCertificate,
) -> Result<ClientConfig, ConfigError> {
    let verifier = root_verifier(root_pem, alt_hostname)?;
    let mut config = ClientConfig::builder_with_provider(provider::shared())
        .with_protocol_versions(&[&TLS13])
        .map_err(ConfigError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(SingleCert(identity.certified_key())));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// WebPKI verification against the roots in `root_pem`, pinned to `alt_hostname` when given.
fn root_verifier(
    root_pem: &str,
    alt_hostname: Option<&str>,
) -> Result<Arc<dyn rustls::client::danger::ServerCertVerifier>, ConfigError> {
    let provider = provider::shared();
    let roots = cert::parse_certs_pem(root_pem).map_err(ConfigError::Roots)?;
    let store = cert::root_store(&roots).map_err(ConfigError::Roots)?;
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
        .build()
        .map_err(ConfigError::Verifier)?;
    Ok(match alt_hostname {
        Some(name) => {
            let pinned = ServerName::try_from(name.to_string())
                .map_err(|_| ConfigError::InvalidHostname(name.to_string()))?;
            Arc::new(PinnedNameVerifier::new(webpki, pinned))
        }
        None => webpki,
    })
}

/// Always presents the same certificate; rotation builds a new config instead.
#[derive(Debug)]
struct SingleCert(Arc<CertifiedKey>);

impl ResolvesServerCert for SingleCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl ResolvesClientCert for SingleCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A workload certificate presented only while it is valid: past its `not_after` the
/// handshake fails on our side instead of presenting an expired certificate (a config built
/// before expiry may still be used after it).
#[derive(Debug)]
struct UnexpiredCert {
    key: Arc<CertifiedKey>,
    not_after: SystemTime,
}

impl UnexpiredCert {
    fn of(cert: &WorkloadCertificate) -> Self {
        Self {
            key: cert.certified_key(),
            not_after: cert.not_after(),
        }
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        if SystemTime::now() >= self.not_after {
            tracing::warn!(not_after = ?self.not_after, "refusing to present an expired certificate");
            return None;
        }
        Some(self.key.clone())
    }
}

impl ResolvesServerCert for UnexpiredCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl ResolvesClientCert for UnexpiredCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
