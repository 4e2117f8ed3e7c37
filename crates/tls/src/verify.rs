//! Certificate verifiers for HBONE and the control plane, and peer identity extraction.
//!
//! Chain validation is always delegated to webpki (through rustls' WebPki helpers); these
//! types only add the identity rules ztunnel applies on top:
//! - [`TrustDomainClientVerifier`] (inbound): webpki client-auth validation against our own
//!   roots, then the client leaf must carry a SPIFFE URI SAN in our trust domain.
//! - [`SpiffeServerVerifier`] (outbound): webpki server-auth validation (chain, EKU, expiry)
//!   against our roots, then at least one SPIFFE URI SAN of the server leaf must equal one of
//!   the expected identities. DNS names and IPs are never checked: we dial pods by IP with a
//!   dummy server name.
//! - [`PinnedNameVerifier`] (control plane): ordinary webpki hostname verification, but
//!   against a configured hostname (`ALT_CA_HOSTNAME`) instead of the dialed one.

use std::sync::Arc;

use ambit_model::SpiffeId;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::server::ParsedCertificate;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, CommonState, DigitallySignedStruct, DistinguishedName, Error, OtherError,
    RootCertStore, SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::cert::{self, CertError};

/// Why a peer's certificate was refused after its chain validated.
#[derive(thiserror::Error)]
pub enum VerifyError {
    #[error(
        "client certificate has no SPIFFE identity in trust domain {expected:?} (URI SANs: {got:?})"
    )]
    TrustDomainMismatch { expected: String, got: Vec<String> },
    #[error(
        "server certificate SAN mismatch: expected one of {}, got {got:?}",
        display_ids(expected)
    )]
    SanMismatch {
        expected: Vec<SpiffeId>,
        got: Vec<String>,
    },
    #[error("peer certificate could not be parsed")]
    BadCertificate(#[source] CertError),
}

// rustls renders `CertificateError::Other` with `Debug`; make that the readable message so
// handshake errors say which SAN was expected and which was presented.
impl std::fmt::Debug for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

fn display_ids(ids: &[SpiffeId]) -> String {
    let names: Vec<String> = ids.iter().map(ToString::to_string).collect();
    format!("[{}]", names.join(", "))
}

impl From<VerifyError> for Error {
    fn from(err: VerifyError) -> Self {
        Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(err))))
    }
}

/// The identity of the connection's peer: the first parsable SPIFFE URI SAN of its leaf.
/// `None` before the handshake, without a peer certificate, or without a SPIFFE SAN.
pub fn peer_identity(conn: &CommonState) -> Option<SpiffeId> {
    let leaf = conn.peer_certificates()?.first()?;
    cert::spiffe_ids_of(leaf).ok()?.into_iter().next()
}

/// Inbound HBONE: webpki client validation, then the trust-domain rule.
#[derive(Debug)]
pub(crate) struct TrustDomainClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
}

impl TrustDomainClientVerifier {
    pub(crate) fn new(inner: Arc<dyn ClientCertVerifier>, trust_domain: String) -> Self {
        Self {
            inner,
            trust_domain,
        }
    }
}

impl ClientCertVerifier for TrustDomainClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        // Chain first: SANs of an unauthenticated certificate mean nothing.
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let ids = cert::spiffe_ids_of(end_entity).map_err(VerifyError::BadCertificate)?;
        if ids.iter().any(|id| id.trust_domain() == self.trust_domain) {
            return Ok(verified);
        }
        let got = cert::uri_sans_of(end_entity).unwrap_or_default();
        Err(VerifyError::TrustDomainMismatch {
            expected: self.trust_domain.clone(),
            got,
        }
        .into())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Outbound HBONE: webpki server-auth chain validation, then SPIFFE SAN match.
#[derive(Debug)]
pub(crate) struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    expected: Vec<SpiffeId>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl SpiffeServerVerifier {
    pub(crate) fn new(
        roots: Arc<RootCertStore>,
        expected: Vec<SpiffeId>,
        algorithms: WebPkiSupportedAlgorithms,
    ) -> Self {
        Self {
            roots,
            expected,
            algorithms,
        }
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        // Deliberately unused: HBONE dials pod IPs with a dummy name; identity is the SAN.
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        // Checks chain to our roots, serverAuth EKU and validity at `now`.
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        let ids = cert::spiffe_ids_of(end_entity).map_err(VerifyError::BadCertificate)?;
        // Literal equality only: no wildcard or prefix matching of identities.
        if ids.iter().any(|id| self.expected.contains(id)) {
            return Ok(ServerCertVerified::assertion());
        }
        let got = cert::uri_sans_of(end_entity).unwrap_or_default();
        Err(VerifyError::SanMismatch {
            expected: self.expected.clone(),
            got,
        }
        .into())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Control plane: ordinary webpki verification against a fixed hostname.
#[derive(Debug)]
pub(crate) struct PinnedNameVerifier {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl PinnedNameVerifier {
    pub(crate) fn new(inner: Arc<WebPkiServerVerifier>, name: ServerName<'static>) -> Self {
        Self { inner, name }
    }
}

impl ServerCertVerifier for PinnedNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
