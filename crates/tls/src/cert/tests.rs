use super::*;
use crate::ca::LocalCa;
use crate::csr::generate_csr;

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

/// A signed `[leaf, root]` chain for `identity` from `ca`, plus the leaf's key.
fn signed(ca: &LocalCa, identity: &SpiffeId, ttl: Duration) -> (Vec<String>, PrivateKey) {
    let (csr, key) = generate_csr(identity).unwrap();
    (ca.sign_csr(&csr, ttl, |_| Ok(())).unwrap(), key)
}

#[test]
fn chain_shapes() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let other = LocalCa::generate("cluster.local").unwrap();
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    let (chain, key) = signed(&ca, &pod, Duration::from_secs(3600));
    let (leaf, root, other_root) = (
        chain[0].clone(),
        chain[1].clone(),
        other.root_pem().to_string(),
    );
    let bad_base64 = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".to_string();

    // (name, chain, Ok((intermediates, roots)) or a check on the error)
    type Check = fn(&CertError) -> bool;
    type Expected = Result<(usize, usize), Check>;
    let cases: Vec<(&str, Vec<String>, Expected)> = vec![
        (
            "leaf and root",
            vec![leaf.clone(), root.clone()],
            Ok((0, 1)),
        ),
        (
            "concatenated roots",
            vec![leaf.clone(), format!("{root}{other_root}")],
            Ok((0, 2)),
        ),
        (
            "middle element",
            vec![leaf.clone(), other_root.clone(), root.clone()],
            Ok((1, 1)),
        ),
        (
            "leaf element with intermediate",
            vec![format!("{leaf}{other_root}"), root.clone()],
            Ok((1, 1)),
        ),
        ("empty", vec![], Err(|e| matches!(e, CertError::EmptyChain))),
        (
            "leaf only",
            vec![leaf.clone()],
            Err(|e| matches!(e, CertError::MissingRoot)),
        ),
        (
            "garbage root",
            vec![leaf.clone(), "garbage".into()],
            Err(|e| matches!(e, CertError::EmptyElement { index: 1 })),
        ),
        (
            "empty leaf element",
            vec![String::new(), root.clone()],
            Err(|e| matches!(e, CertError::EmptyElement { index: 0 })),
        ),
        (
            "bad base64",
            vec![bad_base64, root.clone()],
            Err(|e| matches!(e, CertError::ChainPem { index: 0, .. })),
        ),
        (
            "root as leaf: no SPIFFE SAN",
            vec![root.clone(), root.clone()],
            Err(|e| matches!(e, CertError::NoSpiffeIdentity)),
        ),
    ];
    for (name, chain, expected) in cases {
        let result = WorkloadCertificate::from_pem_chain(&chain, key.clone());
        match (result, expected) {
            (Ok(cert), Ok((intermediates, roots))) => {
                assert_eq!(cert.identity(), &pod, "{name}");
                assert_eq!(cert.intermediates().len(), intermediates, "{name}");
                assert_eq!(cert.roots().len(), roots, "{name}");
                assert_eq!(
                    cert.root_store().len(),
                    roots,
                    "{name}: every root is an anchor"
                );
            }
            (Err(err), Err(check)) => assert!(check(&err), "{name}: unexpected error {err:?}"),
            (got, want) => panic!(
                "{name}: got {got:?}, want {:?}",
                want.map_err(|_| "an error")
            ),
        }
    }
}

#[test]
fn key_must_match_leaf() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    let (chain, _) = signed(&ca, &pod, Duration::from_secs(3600));
    let (_, other_key) = generate_csr(&pod).unwrap();
    let err = WorkloadCertificate::from_pem_chain(&chain, other_key).unwrap_err();
    assert!(matches!(err, CertError::Key(_)), "{err:?}");
}

#[test]
fn ca_response_identity_must_match_request() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let (pod1, pod2) = (
        id("spiffe://cluster.local/ns/default/sa/pod1"),
        id("spiffe://cluster.local/ns/default/sa/pod2"),
    );
    let (chain, key) = signed(&ca, &pod1, Duration::from_secs(3600));
    assert!(WorkloadCertificate::from_ca_response(&chain, key.clone(), &pod1).is_ok());
    match WorkloadCertificate::from_ca_response(&chain, key, &pod2) {
        Err(CertError::IdentityMismatch { expected, got }) => {
            assert_eq!((*expected, *got), (pod2, pod1));
        }
        other => panic!("expected IdentityMismatch, got {other:?}"),
    }
}

#[test]
fn facts_and_refresh_at_half_life() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    for ttl_secs in [2u64, 3600, 86400] {
        let before = SystemTime::now() - Duration::from_secs(1);
        let cert = ca.issue(&pod, Duration::from_secs(ttl_secs)).unwrap();
        let lifetime = cert.not_after().duration_since(cert.not_before()).unwrap();
        assert_eq!(lifetime, Duration::from_secs(ttl_secs));
        assert!(cert.not_before() >= before && cert.not_before() <= SystemTime::now());
        assert_eq!(
            cert.refresh_at(),
            cert.not_before() + Duration::from_secs(ttl_secs) / 2
        );
        assert!(!cert.is_expired_at(cert.refresh_at()));
        assert!(cert.is_expired_at(cert.not_after()));
        assert_eq!(cert.serial().len(), 20);
    }
}

#[test]
fn summaries_round_trip_pem() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let cert = ca
        .issue(
            &id("spiffe://cluster.local/ns/default/sa/pod1"),
            Duration::from_secs(60),
        )
        .unwrap();
    let chain = cert.chain_summaries();
    assert_eq!(chain.len(), 1);
    assert_eq!(chain[0].serial_hex, hex(cert.serial()));
    assert_eq!(chain[0].not_after, cert.not_after());
    assert_eq!(
        parse_certs_pem(&chain[0].pem).unwrap(),
        [cert.leaf().clone()]
    );
    let roots = cert.root_summaries();
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0].pem, ca.root_pem());
}

#[test]
fn hex_trims_leading_zero_bytes() {
    for (bytes, want) in [
        (&[0u8, 0, 1, 0xab][..], "01ab"),
        (&[0], "00"),
        (&[], ""),
        (&[0x7f, 0], "7f00"),
    ] {
        assert_eq!(hex(bytes), want, "{bytes:?}");
    }
}

#[test]
fn private_key_debug_is_redacted() {
    let (_, key) = generate_csr(&id("spiffe://td/ns/a/sa/b")).unwrap();
    assert_eq!(format!("{key:?}"), "PrivateKey(<redacted>)");
    let reparsed = PrivateKey::from_pem(key.pem()).unwrap();
    assert_eq!(reparsed.der().secret_der(), key.der().secret_der());
    assert!(matches!(
        PrivateKey::from_pem("nope"),
        Err(CertError::KeyPem(_))
    ));
}
