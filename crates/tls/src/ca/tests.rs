use super::*;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

/// A CSR with arbitrary SANs, for shapes our own `generate_csr` never produces.
fn csr_with_sans(sans: Vec<SanType>) -> String {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans;
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn uri(s: &str) -> SanType {
    SanType::URI(s.to_string().try_into().unwrap())
}

#[test]
fn issued_leaf_shape() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    let (csr, _) = csr::generate_csr(&pod).unwrap();
    let chain = ca
        .sign_csr(&csr, Duration::from_secs(3600), |_| Ok(()))
        .unwrap();
    assert_eq!(chain.len(), 2);
    assert_eq!(chain[1], ca.root_pem());

    let der = cert::parse_certs_pem(&chain[0]).unwrap().remove(0);
    let (_, leaf) = X509Certificate::from_der(&der).unwrap();
    assert_eq!(leaf.subject().iter().count(), 0, "subject is empty");
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    assert!(san.critical, "SAN must be critical with an empty subject");
    assert_eq!(
        san.value.general_names,
        [GeneralName::URI(
            "spiffe://cluster.local/ns/default/sa/pod1"
        )]
    );
    let ku = leaf.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
    let eku = leaf.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    assert!(!leaf.basic_constraints().unwrap().unwrap().value.ca);
    assert_eq!(leaf.raw_serial().len(), 20);
    assert_eq!(
        leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp(),
        3600
    );
    assert!(
        leaf.extensions().iter().any(|e| matches!(
            e.parsed_extension(),
            ParsedExtension::AuthorityKeyIdentifier(_)
        )),
        "AKI links the leaf to the root"
    );
    // Distinct serials per issuance.
    let again = ca
        .sign_csr(&csr, Duration::from_secs(3600), |_| Ok(()))
        .unwrap();
    assert_ne!(again[0], chain[0]);
}

#[test]
fn ttl_is_capped() {
    let ca = LocalCa::generate("cluster.local")
        .unwrap()
        .with_max_ttl(Duration::from_secs(600));
    let cert = ca
        .issue(
            &id("spiffe://cluster.local/ns/a/sa/b"),
            Duration::from_secs(86400),
        )
        .unwrap();
    let lifetime = cert.not_after().duration_since(cert.not_before()).unwrap();
    assert_eq!(lifetime, Duration::from_secs(600));
}

#[test]
fn refuses_bad_requests() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    let (good_csr, _) = csr::generate_csr(&pod).unwrap();
    let tampered = tamper(&good_csr, b"pod1", b"pod2");

    type Check = fn(&CaError) -> bool;
    let cases: Vec<(&str, String, Duration, Check)> = vec![
        ("garbage", "garbage".into(), Duration::from_secs(60), |e| {
            matches!(e, CaError::InvalidCsr(_))
        }),
        ("empty", String::new(), Duration::from_secs(60), |e| {
            matches!(e, CaError::InvalidCsr(_))
        }),
        (
            "certificate instead of CSR",
            ca.root_pem().to_string(),
            Duration::from_secs(60),
            |e| matches!(e, CaError::InvalidCsr(_)),
        ),
        (
            "no SAN",
            csr_with_sans(vec![]),
            Duration::from_secs(60),
            |e| matches!(e, CaError::NoSpiffeSan),
        ),
        (
            "DNS SAN only",
            csr_with_sans(vec![SanType::DnsName("a.example".try_into().unwrap())]),
            Duration::from_secs(60),
            |e| matches!(e, CaError::NoSpiffeSan),
        ),
        (
            "two URIs",
            csr_with_sans(vec![
                uri("spiffe://td/ns/a/sa/b"),
                uri("spiffe://td/ns/a/sa/c"),
            ]),
            Duration::from_secs(60),
            |e| matches!(e, CaError::MultipleSans { count: 2 }),
        ),
        (
            "non-SPIFFE URI",
            csr_with_sans(vec![uri("https://example.com/x")]),
            Duration::from_secs(60),
            |e| matches!(e, CaError::InvalidSpiffeSan { .. }),
        ),
        (
            "wrong SPIFFE shape",
            csr_with_sans(vec![uri("spiffe://td/ns/a")]),
            Duration::from_secs(60),
            |e| matches!(e, CaError::InvalidSpiffeSan { .. }),
        ),
        (
            "tampered signature",
            tampered,
            Duration::from_secs(60),
            |e| matches!(e, CaError::CsrSignature),
        ),
        ("zero ttl", good_csr.clone(), Duration::ZERO, |e| {
            matches!(e, CaError::InvalidTtl)
        }),
    ];
    for (name, csr, ttl, check) in cases {
        let err = ca.sign_csr(&csr, ttl, |_| Ok(())).expect_err(name);
        assert!(check(&err), "{name}: unexpected {err:?}");
    }
}

#[test]
fn authorize_hook_sees_identity_and_can_refuse() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    let (csr, _) = csr::generate_csr(&pod).unwrap();
    let mut seen = None;
    let err = ca
        .sign_csr(&csr, Duration::from_secs(60), |requested| {
            seen = Some(requested.clone());
            Err("node does not run this identity".into())
        })
        .unwrap_err();
    assert_eq!(seen.as_ref(), Some(&pod));
    match err {
        CaError::Unauthorized { identity, reason } => {
            assert_eq!(identity, pod);
            assert_eq!(reason, "node does not run this identity");
        }
        other => panic!("expected Unauthorized, got {other:?}"),
    }
}

#[test]
fn persists_and_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let first = LocalCa::load_or_generate(&ca_dir, "cluster.local").unwrap();
    let second = LocalCa::load_or_generate(&ca_dir, "cluster.local").unwrap();
    assert_eq!(
        first.root_der(),
        second.root_der(),
        "second call loads, not regenerates"
    );
    assert_eq!(
        fs::read_to_string(ca_dir.join(ROOT_CERT_FILE)).unwrap(),
        first.root_pem()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(ca_dir.join(CA_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // A certificate from the reloaded CA chains to the original root.
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    let cert = second.issue(&pod, Duration::from_secs(60)).unwrap();
    assert_eq!(cert.roots(), [first.root_der().clone()]);
    let (_, leaf) = X509Certificate::from_der(cert.leaf()).unwrap();
    let (_, root) = X509Certificate::from_der(first.root_der()).unwrap();
    leaf.verify_signature(Some(root.public_key())).unwrap();

    let missing = LocalCa::load(&dir.path().join("absent")).unwrap_err();
    assert!(matches!(missing, CaError::Io { .. }), "{missing:?}");
}

#[test]
fn from_pem_checks_ca_and_key() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let other = LocalCa::generate("cluster.local").unwrap();
    let leaf = ca
        .issue(
            &id("spiffe://cluster.local/ns/a/sa/b"),
            Duration::from_secs(60),
        )
        .unwrap();
    let leaf_pem = crate::pem::encode("CERTIFICATE", leaf.leaf());

    type Check = fn(&CaError) -> bool;
    let cases: [(&str, &str, &str, Check); 4] = [
        ("valid", ca.root_pem(), ca.key.pem(), |_| false),
        ("not a CA", &leaf_pem, leaf.private_key().pem(), |e| {
            matches!(e, CaError::NotACa)
        }),
        ("other key", ca.root_pem(), other.key.pem(), |e| {
            matches!(e, CaError::KeyMismatch)
        }),
        ("garbage cert", "garbage", ca.key.pem(), |e| {
            matches!(e, CaError::Certificate(_))
        }),
    ];
    for (name, cert_pem, key_pem, check) in cases {
        match LocalCa::from_pem(cert_pem, key_pem) {
            Ok(loaded) => assert_eq!(name, "valid", "{name} loaded: {loaded:?}"),
            Err(err) => assert!(check(&err), "{name}: unexpected {err:?}"),
        }
    }
}

#[test]
fn server_certificates() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let cert = ca
        .server_cert_for_hostnames(&["istiod.istio-system.svc", "127.0.0.1", "::1"])
        .unwrap();
    assert_eq!(cert.chain().len(), 2);
    let (_, leaf) = X509Certificate::from_der(&cert.chain()[0]).unwrap();
    let names = &leaf
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names;
    assert_eq!(names.len(), 3);
    assert_eq!(names[0], GeneralName::DNSName("istiod.istio-system.svc"));
    assert_eq!(names[1], GeneralName::IPAddress(&[127, 0, 0, 1]));
    let reparsed =
        ServerCertificate::from_pem(&cert.chain_pem(), cert.private_key().pem()).unwrap();
    assert_eq!(reparsed.chain(), cert.chain());

    assert!(matches!(
        ca.server_cert_for_hostnames(&[]),
        Err(CaError::NoHostnames)
    ));
    assert!(matches!(
        ca.server_cert_for_hostnames(&["bad\u{e9}name"]),
        Err(CaError::InvalidHostname { .. })
    ));
}

/// Re-encodes `pem` with the first occurrence of `from` in its DER replaced by `to`.
fn tamper(pem_text: &str, from: &[u8], to: &[u8]) -> String {
    use rustls_pki_types::CertificateSigningRequestDer;
    use rustls_pki_types::pem::PemObject;
    let der = CertificateSigningRequestDer::from_pem_slice(pem_text.as_bytes()).unwrap();
    let mut bytes = der.as_ref().to_vec();
    let at = bytes.windows(from.len()).position(|w| w == from).unwrap();
    bytes[at..at + from.len()].copy_from_slice(to);
    pem::encode("CERTIFICATE REQUEST", &bytes)
}
