//! Certificates: PEM chains from the Istio CA, workload certificates and their facts.
//!
//! A CA response (`IstioCertificateResponse.cert_chain`) is a list of PEM strings: the leaf
//! first, the root(s) last. The last element may hold several concatenated roots, all of which
//! become trust anchors; everything before it (after the leaf) is an intermediate. Any element
//! may itself hold several certificates, so elements are flattened in order.
//!
//! [`WorkloadCertificate`] keeps the DER forms rustls needs, prebuilt rustls objects (signing
//! key, root store) so a config can be made per connection cheaply, and the facts the rest of
//! ambit needs (identity, validity window, serial) parsed once.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ambit_model::SpiffeId;
use rustls::RootCertStore;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{self as pki_pem, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::error::X509Error;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

use crate::{pem, provider};

/// Why a certificate, chain or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate chain is empty")]
    EmptyChain,
    #[error("certificate chain has a leaf but no root (need at least 2 elements, got 1)")]
    MissingRoot,
    #[error("certificate chain element {index} holds no PEM certificate")]
    EmptyElement { index: usize },
    #[error("certificate chain element {index} is not valid PEM")]
    ChainPem {
        index: usize,
        #[source]
        source: pki_pem::Error,
    },
    #[error("PEM holds no certificate")]
    NoCertificate,
    #[error("certificate PEM is invalid")]
    CertPem(#[source] pki_pem::Error),
    #[error("private key PEM is invalid or holds no key")]
    KeyPem(#[source] pki_pem::Error),
    #[error("certificate is not valid X.509")]
    X509(#[source] X509Error),
    #[error("certificate has no parsable spiffe://TD/ns/NS/sa/SA URI SAN")]
    NoSpiffeIdentity,
    #[error("certificate identity {got} does not match the requested identity {expected}")]
    // Boxed: keeps every Result carrying this error small.
    IdentityMismatch {
        expected: Box<SpiffeId>,
        got: Box<SpiffeId>,
    },
    #[error("private key is unusable or does not match the leaf certificate")]
    Key(#[source] rustls::Error),
    #[error("root certificate cannot be used as a trust anchor")]
    Root(#[source] rustls::Error),
}

/// A private key (PKCS#8, SEC1 or PKCS#1) with its PEM text; `Debug` never prints it.
pub struct PrivateKey {
    der: PrivateKeyDer<'static>,
    pem: String,
}

impl PrivateKey {
    /// Parses the first private key in `pem`.
    pub fn from_pem(pem: &str) -> Result<Self, CertError> {
        let der = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(CertError::KeyPem)?;
        Ok(Self {
            der,
            pem: pem.to_string(),
        })
    }

    /// Wraps a PKCS#8 DER key (as produced by our key generation).
    pub(crate) fn from_pkcs8_der(der: Vec<u8>) -> Self {
        let pem = pem::encode("PRIVATE KEY", &der);
        Self {
            der: PrivateKeyDer::Pkcs8(der.into()),
            pem,
        }
    }

    /// The key as PEM, for persisting (file mode is the caller's business).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The key as DER.
    pub fn der(&self) -> &PrivateKeyDer<'static> {
        &self.der
    }
}

impl Clone for PrivateKey {
    fn clone(&self) -> Self {
        Self {
            der: self.der.clone_key(),
            pem: self.pem.clone(),
        }
    }
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

/// Facts about one certificate, in the shape the admin `config_dump` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    pub pem: String,
    /// Serial number as lower-case hex, no leading zero bytes.
    pub serial_hex: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// A workload's certificate as issued by the CA, with its key and trust anchors.
#[derive(Clone)]
pub struct WorkloadCertificate {
    identity: SpiffeId,
    leaf: CertificateDer<'static>,
    intermediates: Vec<CertificateDer<'static>>,
    roots: Vec<CertificateDer<'static>>,
    key: PrivateKey,
    not_before: SystemTime,
    not_after: SystemTime,
    serial: Vec<u8>,
    certified: Arc<CertifiedKey>,
    root_store: Arc<RootCertStore>,
}

impl WorkloadCertificate {
    /// Accepts a CA response for `expected`: parses the chain and refuses it unless the leaf's
    /// first SPIFFE SAN is exactly `expected` (a CA must not hand us someone else's identity).
    pub fn from_ca_response<S: AsRef<str>>(
        cert_chain: &[S],
        key: PrivateKey,
        expected: &SpiffeId,
    ) -> Result<Self, CertError> {
        let cert = Self::from_pem_chain(cert_chain, key)?;
        if cert.identity != *expected {
            return Err(CertError::IdentityMismatch {
                expected: Box::new(expected.clone()),
                got: Box::new(cert.identity),
            });
        }
        Ok(cert)
    }

    /// Parses a CA-style chain (leaf first, roots last) and checks the key matches the leaf.
    /// The identity is the leaf's first parsable SPIFFE URI SAN.
    pub fn from_pem_chain<S: AsRef<str>>(
        cert_chain: &[S],
        key: PrivateKey,
    ) -> Result<Self, CertError> {
        let (root_element, rest) = match cert_chain {
            [] => return Err(CertError::EmptyChain),
            [_] => return Err(CertError::MissingRoot),
            [rest @ .., last] => (last, rest),
        };
        let mut leaf_and_intermediates = Vec::new();
        for (index, element) in rest.iter().enumerate() {
            leaf_and_intermediates.extend(parse_element(index, element.as_ref())?);
        }
        let roots = parse_element(cert_chain.len() - 1, root_element.as_ref())?;
        let mut certs = leaf_and_intermediates.into_iter();
        let leaf = certs.next().ok_or(CertError::EmptyChain)?;
        let intermediates: Vec<_> = certs.collect();

        let parsed = parse_x509(&leaf)?;
        let identity = spiffe_ids(&parsed)?
            .into_iter()
            .next()
            .ok_or(CertError::NoSpiffeIdentity)?;
        let validity = parsed.validity();
        let not_before = asn1_to_system_time(validity.not_before.timestamp());
        let not_after = asn1_to_system_time(validity.not_after.timestamp());
        let serial = parsed.raw_serial().to_vec();

        let mut chain = Vec::with_capacity(1 + intermediates.len());
        chain.push(leaf.clone());
        chain.extend(intermediates.iter().cloned());
        let certified = CertifiedKey::from_der(chain, key.der().clone_key(), &provider::shared())
            .map_err(CertError::Key)?;
        let root_store = root_store(&roots)?;

        Ok(Self {
            identity,
            leaf,
            intermediates,
            roots,
            key,
            not_before,
            not_after,
            serial,
            certified: Arc::new(certified),
            root_store: Arc::new(root_store),
        })
    }

    /// The identity this certificate proves: the leaf's first parsable SPIFFE URI SAN.
    pub fn identity(&self) -> &SpiffeId {
        &self.identity
    }

    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Raw serial number bytes of the leaf.
    pub fn serial(&self) -> &[u8] {
        &self.serial
    }

    /// When to fetch a replacement: half-way through the validity window, so a failed
    /// renewal still leaves half the lifetime for retries.
    pub fn refresh_at(&self) -> SystemTime {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or(Duration::ZERO);
        self.not_before + lifetime / 2
    }

    /// Whether the leaf is outside its validity window at `now`.
    pub fn is_expired_at(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }

    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.leaf
    }

    pub fn intermediates(&self) -> &[CertificateDer<'static>] {
        &self.intermediates
    }

    /// Trust anchors: every certificate of the chain's last element.
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    pub fn private_key(&self) -> &PrivateKey {
        &self.key
    }

    /// Leaf then intermediates, one summary each (for admin views).
    pub fn chain_summaries(&self) -> Vec<CertSummary> {
        std::iter::once(&self.leaf)
            .chain(&self.intermediates)
            .filter_map(summarize)
            .collect()
    }

    /// One summary per trust anchor (for admin views).
    pub fn root_summaries(&self) -> Vec<CertSummary> {
        self.roots.iter().filter_map(summarize).collect()
    }

    pub(crate) fn certified_key(&self) -> Arc<CertifiedKey> {
        self.certified.clone()
    }

    pub(crate) fn root_store(&self) -> Arc<RootCertStore> {
        self.root_store.clone()
    }
}

impl std::fmt::Debug for WorkloadCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadCertificate")
            .field("identity", &self.identity.to_string())
            .field("serial", &hex(&self.serial))
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("intermediates", &self.intermediates.len())
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

/// A plain TLS server certificate (DNS/IP SANs) for the control-plane gRPC servers.
#[derive(Clone)]
pub struct ServerCertificate {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKey,
    certified: Arc<CertifiedKey>,
}

impl ServerCertificate {
    /// Parses a chain PEM (leaf first, any number of certificates) and its key.
    pub fn from_pem(chain_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let chain = parse_certs_pem(chain_pem)?;
        Self::new(chain, PrivateKey::from_pem(key_pem)?)
    }

    pub(crate) fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKey,
    ) -> Result<Self, CertError> {
        if chain.is_empty() {
            return Err(CertError::NoCertificate);
        }
        let certified =
            CertifiedKey::from_der(chain.clone(), key.der().clone_key(), &provider::shared())
                .map_err(CertError::Key)?;
        Ok(Self {
            chain,
            key,
            certified: Arc::new(certified),
        })
    }

    /// The chain as one PEM string (leaf first).
    pub fn chain_pem(&self) -> String {
        self.chain
            .iter()
            .map(|c| pem::encode("CERTIFICATE", c))
            .collect()
    }

    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    pub fn private_key(&self) -> &PrivateKey {
        &self.key
    }

    pub(crate) fn certified_key(&self) -> Arc<CertifiedKey> {
        self.certified.clone()
    }
}

impl std::fmt::Debug for ServerCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCertificate")
            .field("chain_len", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// Parses every certificate of a PEM string; at least one is required.
pub fn parse_certs_pem(pem_text: &str) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs = CertificateDer::pem_slice_iter(pem_text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(CertError::CertPem)?;
    if certs.is_empty() {
        return Err(CertError::NoCertificate);
    }
    Ok(certs)
}

/// Every URI SAN of `cert` that is a valid SPIFFE id, in certificate order.
pub fn spiffe_ids_of(cert: &CertificateDer<'_>) -> Result<Vec<SpiffeId>, CertError> {
    spiffe_ids(&parse_x509(cert)?)
}

/// Every URI SAN of `cert`, raw (for error messages about what a peer presented).
pub(crate) fn uri_sans_of(cert: &CertificateDer<'_>) -> Result<Vec<String>, CertError> {
    Ok(uri_sans(&parse_x509(cert)?)?
        .into_iter()
        .map(str::to_string)
        .collect())
}

pub(crate) fn root_store(roots: &[CertificateDer<'static>]) -> Result<RootCertStore, CertError> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).map_err(CertError::Root)?;
    }
    Ok(store)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let trimmed = match bytes.iter().position(|b| *b != 0) {
        Some(first) => &bytes[first..],
        None => &bytes[bytes.len().saturating_sub(1)..],
    };
    trimmed.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_element(index: usize, element: &str) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs = CertificateDer::pem_slice_iter(element.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CertError::ChainPem { index, source })?;
    if certs.is_empty() {
        return Err(CertError::EmptyElement { index });
    }
    Ok(certs)
}

fn parse_x509<'a>(der: &'a CertificateDer<'_>) -> Result<X509Certificate<'a>, CertError> {
    X509Certificate::from_der(der)
        .map(|(_, cert)| cert)
        .map_err(|e| CertError::X509(nom_to_x509(e)))
}

pub(crate) fn nom_to_x509(err: x509_parser::nom::Err<X509Error>) -> X509Error {
    match err {
        x509_parser::nom::Err::Error(e) | x509_parser::nom::Err::Failure(e) => e,
        x509_parser::nom::Err::Incomplete(_) => X509Error::InvalidCertificate,
    }
}

fn uri_sans<'a>(cert: &X509Certificate<'a>) -> Result<Vec<&'a str>, CertError> {
    // A duplicated SAN extension is an error here rather than "first one wins": two SAN
    // extensions is how a forged certificate would try to confuse different parsers.
    let Some(san) = cert.subject_alternative_name().map_err(CertError::X509)? else {
        return Ok(Vec::new());
    };
    Ok(san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect())
}

fn spiffe_ids(cert: &X509Certificate<'_>) -> Result<Vec<SpiffeId>, CertError> {
    Ok(uri_sans(cert)?
        .into_iter()
        .filter_map(|uri| match SpiffeId::parse(uri) {
            Ok(id) => Some(id),
            Err(error) => {
                // Debug, not warn: peers control this, and a log line per connection would
                // let them flood our logs.
                tracing::debug!(%error, "ignoring non-SPIFFE URI SAN");
                None
            }
        })
        .collect())
}

fn summarize(der: &CertificateDer<'static>) -> Option<CertSummary> {
    let parsed = parse_x509(der).ok()?;
    Some(CertSummary {
        pem: pem::encode("CERTIFICATE", der),
        serial_hex: hex(parsed.raw_serial()),
        not_before: asn1_to_system_time(parsed.validity().not_before.timestamp()),
        not_after: asn1_to_system_time(parsed.validity().not_after.timestamp()),
    })
}

fn asn1_to_system_time(unix_seconds: i64) -> SystemTime {
    let magnitude = Duration::from_secs(unix_seconds.unsigned_abs());
    if unix_seconds >= 0 {
        UNIX_EPOCH.checked_add(magnitude).unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH.checked_sub(magnitude).unwrap_or(UNIX_EPOCH)
    }
}

#[cfg(test)]
mod tests;
