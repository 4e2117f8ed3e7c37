//! A local certificate authority for tests and the embedded mesh.
//!
//! [`LocalCa`] holds a CA certificate and key (a self-signed ECDSA P-256 root it generated, or
//! one loaded from PEM), persists them to a directory, and signs workload CSRs the way the Istio
//! CA does: the leaf copies only the CSR's single SPIFFE URI SAN (nothing else the requester
//! asked for), gets digitalSignature+keyEncipherment, serverAuth+clientAuth, a random serial
//! and the requested lifetime capped at [`LocalCa::max_ttl`]. It also issues plain TLS server
//! certificates for the control plane's own gRPC endpoints.
//!
//! Directory layout (compatible with Istio's plugged-in `cacerts` naming):
//! `ca-cert.pem` (CA certificate), `ca-key.pem` (its key, mode 0600) and `root-cert.pem`
//! (what clients trust: `CA_ROOT_CA` for ztunnel).

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_model::{SpiffeId, SpiffeIdError};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, PublicKeyData, SanType, SerialNumber,
};
use rustls_pki_types::CertificateDer;
use time::OffsetDateTime;
use x509_parser::prelude::FromDer;

use crate::cert::{self, CertError, PrivateKey, ServerCertificate, WorkloadCertificate};
use crate::csr::{self, CsrError};
use crate::{pem, provider};

/// File holding the CA certificate.
pub const CA_CERT_FILE: &str = "ca-cert.pem";
/// File holding the CA private key.
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// File holding the root clients should trust.
pub const ROOT_CERT_FILE: &str = "root-cert.pem";

/// Default cap on workload certificate lifetime (Istio's `MAX_WORKLOAD_CERT_TTL`).
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
const ROOT_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
const SERVER_CERT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why the CA could not be loaded or refused to sign.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CA certificate")]
    Certificate(#[from] CertError),
    #[error("CA certificate is not a CA (basicConstraints CA:true missing)")]
    NotACa,
    #[error("CA private key is unusable")]
    Key(#[source] rcgen::Error),
    #[error("CA private key does not match the CA certificate")]
    KeyMismatch,
    #[error("generating or signing a certificate failed")]
    Sign(#[source] rcgen::Error),
    #[error("the system random source failed")]
    Random,
    #[error("CSR is not a valid PEM PKCS#10 request")]
    InvalidCsr(#[source] rcgen::Error),
    #[error("CSR signature does not verify")]
    CsrSignature,
    #[error("CSR has no SPIFFE URI SAN")]
    NoSpiffeSan,
    #[error("CSR must have exactly one SAN (a SPIFFE URI), it has {count}")]
    MultipleSans { count: usize },
    #[error("CSR SAN {uri:?} is not a SPIFFE id")]
    InvalidSpiffeSan {
        uri: String,
        #[source]
        source: SpiffeIdError,
    },
    #[error("not authorized to issue a certificate for {identity}: {reason}")]
    Unauthorized { identity: SpiffeId, reason: String },
    #[error("certificate lifetime must be between 1s and the representable maximum")]
    InvalidTtl,
    #[error("a server certificate needs at least one hostname")]
    NoHostnames,
    #[error("hostname {name:?} cannot be a DNS SAN")]
    InvalidHostname {
        name: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("generating the CSR failed")]
    Csr(#[from] CsrError),
}

/// A CA that signs workload and server certificates.
pub struct LocalCa {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    key: PrivateKey,
    max_ttl: Duration,
}

impl std::fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCa")
            .field("max_ttl", &self.max_ttl)
            .finish_non_exhaustive()
    }
}

impl LocalCa {
    /// Generates a self-signed ECDSA P-256 root with subject `O=<trust_domain>`.
    pub fn generate(trust_domain: &str) -> Result<Self, CaError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CaError::Sign)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, trust_domain);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial()?);
        (params.not_before, params.not_after) = validity(ROOT_TTL)?;
        let cert = params.self_signed(&key).map_err(CaError::Sign)?;
        let private = PrivateKey::from_pkcs8_der(key.serialize_der());
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key: private,
            max_ttl: DEFAULT_MAX_TTL,
        })
    }

    /// Loads a CA from its certificate (first certificate of `cert_pem`) and key PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let cert_der = cert::parse_certs_pem(cert_pem)?.swap_remove(0);
        let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(&cert_der)
            .map_err(|e| CertError::X509(cert::nom_to_x509(e)))?;
        let is_ca = parsed
            .basic_constraints()
            .map_err(CertError::X509)?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(CaError::NotACa);
        }
        let key = PrivateKey::from_pem(key_pem)?;
        let key_pair = KeyPair::try_from(key.der()).map_err(CaError::Key)?;
        if key_pair.subject_public_key_info() != parsed.public_key().raw {
            return Err(CaError::KeyMismatch);
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key_pair).map_err(CaError::Key)?;
        Ok(Self {
            issuer,
            cert_pem: pem::encode("CERTIFICATE", &cert_der),
            cert_der,
            key,
            max_ttl: DEFAULT_MAX_TTL,
        })
    }

    /// Loads `ca-cert.pem` + `ca-key.pem` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, CaError> {
        let cert = read(&dir.join(CA_CERT_FILE))?;
        let key = read(&dir.join(CA_KEY_FILE))?;
        Self::from_pem(&cert, &key)
    }

    /// Loads the CA from `dir` if it holds one, else generates one and saves it there.
    pub fn load_or_generate(dir: &Path, trust_domain: &str) -> Result<Self, CaError> {
        if dir.join(CA_CERT_FILE).exists() {
            return Self::load(dir);
        }
        let ca = Self::generate(trust_domain)?;
        ca.save(dir)?;
        Ok(ca)
    }

    /// Writes `ca-cert.pem`, `root-cert.pem` and `ca-key.pem` (0600) into `dir`. Each file is
    /// written to a temporary name and renamed, so a crash never leaves a half-written key.
    pub fn save(&self, dir: &Path) -> Result<(), CaError> {
        fs::create_dir_all(dir).map_err(|source| CaError::Io {
            path: dir.into(),
            source,
        })?;
        write_atomic(&dir.join(CA_KEY_FILE), self.key.pem(), 0o600)?;
        write_atomic(&dir.join(CA_CERT_FILE), &self.cert_pem, 0o644)?;
        write_atomic(&dir.join(ROOT_CERT_FILE), &self.cert_pem, 0o644)?;
        Ok(())
    }

    /// Caps the lifetime of issued workload certificates.
    pub fn with_max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// The root certificate as PEM (what clients trust).
    pub fn root_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn root_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Signs a workload CSR. The CSR must be validly self-signed and carry exactly one SAN, a
    /// SPIFFE URI; `authorize` then decides whether the requester may have that identity
    /// (`Err(reason)` refuses). Returns the chain as the CA protocol does: `[leaf, root]`.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        ttl: Duration,
        authorize: impl FnOnce(&SpiffeId) -> Result<(), String>,
    ) -> Result<Vec<String>, CaError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| match e {
            rcgen::Error::InvalidCertificationRequestSignature => CaError::CsrSignature,
            other => CaError::InvalidCsr(other),
        })?;
        let identity = single_spiffe_san(&csr.params.subject_alt_names)?;
        authorize(&identity).map_err(|reason| CaError::Unauthorized {
            identity: identity.clone(),
            reason,
        })?;
        let ttl = ttl.min(self.max_ttl);

        // Build the leaf from scratch: nothing the requester asked for besides the identity
        // (key usages, EKUs, subject) is copied.
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        let uri = identity.to_string().try_into().map_err(CaError::Sign)?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        (params.not_before, params.not_after) = validity(ttl)?;
        let leaf = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(CaError::Sign)?;
        Ok(vec![leaf.pem(), self.cert_pem.clone()])
    }

    /// Generates a key and CSR for `identity`, signs it and returns the parsed certificate
    /// (for tests and the embedded mesh, where no CA round trip is wanted).
    pub fn issue(
        &self,
        identity: &SpiffeId,
        ttl: Duration,
    ) -> Result<WorkloadCertificate, CaError> {
        let (csr_pem, key) = csr::generate_csr(identity)?;
        let chain = self.sign_csr(&csr_pem, ttl, |_| Ok(()))?;
        Ok(WorkloadCertificate::from_ca_response(
            &chain, key, identity,
        )?)
    }

    /// Issues a plain TLS server certificate for `hostnames` (IP literals become IP SANs, the
    /// rest DNS SANs), chain `[leaf, root]`, for the xDS / CA gRPC servers.
    pub fn server_cert_for_hostnames(
        &self,
        hostnames: &[&str],
    ) -> Result<ServerCertificate, CaError> {
        let first = hostnames.first().ok_or(CaError::NoHostnames)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CaError::Sign)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, *first);
        params.distinguished_name = dn;
        params.subject_alt_names = hostnames
            .iter()
            .map(|name| match name.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => name
                    .to_string()
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(|source| CaError::InvalidHostname {
                        name: name.to_string(),
                        source,
                    }),
            })
            .collect::<Result<_, _>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        (params.not_before, params.not_after) = validity(SERVER_CERT_TTL)?;
        let leaf = params
            .signed_by(&key, &self.issuer)
            .map_err(CaError::Sign)?;
        let chain = vec![leaf.der().clone(), self.cert_der.clone()];
        Ok(ServerCertificate::new(
            chain,
            PrivateKey::from_pkcs8_der(key.serialize_der()),
        )?)
    }
}

/// The one SPIFFE identity of a CSR, or why it has none usable.
fn single_spiffe_san(sans: &[SanType]) -> Result<SpiffeId, CaError> {
    match sans {
        [] => Err(CaError::NoSpiffeSan),
        [SanType::URI(uri)] => {
            SpiffeId::parse(uri.as_str()).map_err(|source| CaError::InvalidSpiffeSan {
                uri: uri.as_str().to_string(),
                source,
            })
        }
        [_] => Err(CaError::NoSpiffeSan),
        many => Err(CaError::MultipleSans { count: many.len() }),
    }
}

/// A positive 159-bit random serial (RFC 5280 allows at most 20 octets, positive).
fn random_serial() -> Result<SerialNumber, CaError> {
    let mut bytes = [0u8; 20];
    provider::shared()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| CaError::Random)?;
    // Clear the sign bit so the DER INTEGER stays 20 octets, and avoid an all-zero serial.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

/// `[now, now + ttl]`, whole seconds. Not backdated: a short-lived cert backdated for clock
/// skew would have its half-life refresh point already in the past and renew in a loop.
fn validity(ttl: Duration) -> Result<(OffsetDateTime, OffsetDateTime), CaError> {
    if ttl < Duration::from_secs(1) {
        return Err(CaError::InvalidTtl);
    }
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .map_err(|_| CaError::InvalidTtl)?;
    let ttl = time::Duration::try_from(ttl).map_err(|_| CaError::InvalidTtl)?;
    let not_after = now.checked_add(ttl).ok_or(CaError::InvalidTtl)?;
    Ok((now, not_after))
}

fn read(path: &Path) -> Result<String, CaError> {
    fs::read_to_string(path).map_err(|source| CaError::Io {
        path: path.into(),
        source,
    })
}

fn write_atomic(path: &Path, contents: &str, mode: u32) -> Result<(), CaError> {
    let tmp = path.with_extension("pem.tmp");
    let io_err = |source| CaError::Io {
        path: path.into(),
        source,
    };
    // A leftover temp file would keep its old (maybe wider) mode: `mode` applies on create only.
    let _ = fs::remove_file(&tmp);
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp).map_err(io_err)?;
    file.write_all(contents.as_bytes()).map_err(io_err)?;
    file.sync_all().map_err(io_err)?;
    fs::rename(&tmp, path).map_err(io_err)
}

#[cfg(test)]
mod tests;
