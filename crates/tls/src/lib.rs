//! ambit-tls: everything TLS for ambit, and the only crate that names rustls.
//!
//! Other crates get the HBONE and control-plane TLS configurations from here and use the
//! re-exported [`rustls`] / [`tokio_rustls`] only to drive connections, so the choice of
//! crypto provider, protocol versions and verification rules lives in one place.
//!
//! Module layout:
//! - [`provider`]: the single aws-lc-rs crypto provider (TLS 1.3, AES-GCM only). Configs are
//!   always built with it explicitly; nothing relies on a process-default provider.
//! - [`cert`]: PEM chains as returned by the Istio CA, [`WorkloadCertificate`] (leaf,
//!   intermediates, roots, key and parsed facts: SPIFFE identity, validity, serial),
//!   [`ServerCertificate`] for plain TLS servers, and [`PrivateKey`].
//! - [`csr`]: CSR generation in the shape the Istio CA expects (P-256, empty subject,
//!   single critical URI SAN).
//! - [`ca`]: [`LocalCa`], a real CA for tests and the embedded mesh: root generation and
//!   persistence, CSR signing, issuing workload and server certificates.
//! - [`verify`]: the rustls verifiers (client trust-domain check, server SPIFFE SAN match,
//!   pinned-hostname verification) and [`peer_identity`].
//! - [`config`]: ready-made `ServerConfig` / `ClientConfig` values for inbound and outbound
//!   HBONE and for the xDS / CA gRPC channels.
//! - `pem` (private): PEM encoding of DER blobs.

#![forbid(unsafe_code)]

pub mod ca;
pub mod cert;
pub mod config;
pub mod csr;
mod pem;
pub mod provider;
pub mod verify;

pub use ca::{CaError, LocalCa};
pub use cert::{CertError, CertSummary, PrivateKey, ServerCertificate, WorkloadCertificate};
pub use config::{
    ALPN_H2, ConfigError, client_config, client_config_for_root, client_config_with_identity,
    hbone_server_name, server_config, server_config_plain,
};
pub use csr::{CsrError, generate_csr};
pub use provider::provider;
pub use verify::{VerifyError, peer_identity};

/// Re-exported so callers can drive connections without depending on rustls themselves.
pub use rustls;
/// Re-exported PKI types (`ServerName`, `CertificateDer`, ...).
pub use rustls_pki_types as pki_types;
/// Re-exported async adapters (`TlsAcceptor`, `TlsConnector`).
pub use tokio_rustls;
