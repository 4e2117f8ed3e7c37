//! Certificate signing requests in the shape the Istio CA expects.
//!
//! ECDSA P-256 / SHA-256 key, an EMPTY subject and a single SubjectAlternativeName extension
//! holding the SPIFFE URI. RFC 5280 requires the SAN to be critical when the subject is empty;
//! rcgen does exactly that when the distinguished name has no entries, which the tests check
//! by parsing the CSR back.

use ambit_model::SpiffeId;
use rcgen::{CertificateParams, DistinguishedName, KeyPair, PKCS_ECDSA_P256_SHA256, SanType};

use crate::cert::PrivateKey;

/// Why a CSR could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("generating the P-256 key failed")]
    KeyGeneration(#[source] rcgen::Error),
    #[error("identity {0} cannot be encoded as a URI SAN")]
    InvalidUri(SpiffeId, #[source] rcgen::Error),
    #[error("serializing the CSR failed")]
    Serialize(#[source] rcgen::Error),
}

/// Generates a fresh P-256 key and a PEM CSR for `identity`. Returns `(csr_pem, key)`.
pub fn generate_csr(identity: &SpiffeId) -> Result<(String, PrivateKey), CsrError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CsrError::KeyGeneration)?;
    let uri = identity
        .to_string()
        .try_into()
        .map_err(|e| CsrError::InvalidUri(identity.clone(), e))?;
    let mut params = CertificateParams::default();
    // Empty subject: the identity lives only in the SAN, as Istio's CA expects.
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(uri)];
    let csr = params
        .serialize_request(&key)
        .map_err(CsrError::Serialize)?;
    let pem = csr.pem().map_err(CsrError::Serialize)?;
    Ok((pem, PrivateKey::from_pkcs8_der(key.serialize_der())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::CertificateSigningRequestDer;
    use rustls_pki_types::pem::PemObject;
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::oid_registry::{
        OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ECDSA_WITH_SHA256,
    };
    use x509_parser::prelude::FromDer;

    #[test]
    fn csr_has_empty_subject_and_single_critical_uri_san() {
        let id = SpiffeId::parse("spiffe://cluster.local/ns/default/sa/pod1").unwrap();
        let (csr_pem, key) = generate_csr(&id).unwrap();
        assert!(csr_pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert!(key.pem().starts_with("-----BEGIN PRIVATE KEY-----"));

        let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes()).unwrap();
        let (_, csr) = X509CertificationRequest::from_der(&der).unwrap();
        csr.verify_signature().unwrap();
        let info = &csr.certification_request_info;
        assert_eq!(info.subject.iter().count(), 0, "subject must be empty");
        assert_eq!(
            info.subject_pki.algorithm.algorithm,
            OID_KEY_TYPE_EC_PUBLIC_KEY
        );
        let curve = info
            .subject_pki
            .algorithm
            .parameters
            .as_ref()
            .unwrap()
            .as_oid()
            .unwrap();
        assert_eq!(curve, OID_EC_P256);
        assert_eq!(csr.signature_algorithm.algorithm, OID_SIG_ECDSA_WITH_SHA256);

        let exts: Vec<_> = csr.requested_extensions().unwrap().collect();
        assert_eq!(exts.len(), 1, "only the SAN extension: {exts:?}");
        let ParsedExtension::SubjectAlternativeName(san) = exts[0] else {
            panic!("not a SAN: {:?}", exts[0]);
        };
        assert_eq!(
            san.general_names,
            [GeneralName::URI(
                "spiffe://cluster.local/ns/default/sa/pod1"
            )]
        );

        // requested_extensions() drops criticality; read it from the raw attribute.
        let critical = raw_extension_criticality(&csr);
        assert_eq!(critical, [true]);
    }

    /// Criticality of every requested extension, read from the extensionRequest attribute.
    fn raw_extension_criticality(csr: &X509CertificationRequest<'_>) -> Vec<bool> {
        use x509_parser::cri_attributes::ParsedCriAttribute;
        csr.certification_request_info
            .iter_attributes()
            .filter_map(|attr| match attr.parsed_attribute() {
                ParsedCriAttribute::ExtensionRequest(req) => Some(
                    req.extensions
                        .iter()
                        .map(|e| e.critical)
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect()
    }
}
