//! The crypto provider: aws-lc-rs restricted to what ztunnel negotiates.
//!
//! TLS 1.3 with `TLS13_AES_256_GCM_SHA384` and `TLS13_AES_128_GCM_SHA256` only (no ChaCha20:
//! AES-GCM is hardware accelerated on every node we target), default key-exchange groups.
//! Every config in this crate is built with [`provider`] explicitly, so installing (or not) a
//! process-wide default provider elsewhere can never change what we negotiate.

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;
use rustls::crypto::aws_lc_rs::{self, cipher_suite};

/// The provider ambit uses everywhere: aws-lc-rs, TLS 1.3 AES-GCM suites, default kx groups.
pub fn provider() -> CryptoProvider {
    let mut provider = aws_lc_rs::default_provider();
    provider.cipher_suites = vec![
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_AES_128_GCM_SHA256,
    ];
    provider
}

/// One shared instance, so building a config per outbound connection does not rebuild it.
pub(crate) fn shared() -> Arc<CryptoProvider> {
    static SHARED: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    SHARED.get_or_init(|| Arc::new(provider())).clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::CipherSuite;

    #[test]
    fn only_tls13_aes_gcm_suites() {
        let suites: Vec<CipherSuite> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(
            suites,
            [
                CipherSuite::TLS13_AES_256_GCM_SHA384,
                CipherSuite::TLS13_AES_128_GCM_SHA256
            ]
        );
        assert!(provider().cipher_suites.iter().all(|s| s.tls13().is_some()));
        assert!(!provider().kx_groups.is_empty());
    }
}
