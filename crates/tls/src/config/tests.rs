//! Handshakes over in-memory duplex pipes between real rustls endpoints.

use std::time::{Duration, SystemTime};

use rustls::crypto::aws_lc_rs;
use rustls::version::TLS12;
use rustls::{CipherSuite, ProtocolVersion};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::*;
use crate::ca::LocalCa;

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

/// What the server saw of a successful handshake.
#[derive(Debug)]
struct ServerView {
    peer: Option<SpiffeId>,
    alpn: Option<Vec<u8>>,
    suite: Option<CipherSuite>,
}

/// What the client saw of a successful handshake.
#[derive(Debug)]
struct ClientView {
    alpn: Option<Vec<u8>>,
    suite: Option<CipherSuite>,
    version: Option<ProtocolVersion>,
    server_identity: Option<SpiffeId>,
}

async fn handshake(
    server: ServerConfig,
    client: ClientConfig,
    name: ServerName<'static>,
) -> (
    Result<ServerView, std::io::Error>,
    Result<ClientView, std::io::Error>,
) {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let accept = async {
        let stream = TlsAcceptor::from(Arc::new(server))
            .accept(server_io)
            .await?;
        let conn = stream.get_ref().1;
        let view = ServerView {
            peer: crate::peer_identity(conn),
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
            suite: conn.negotiated_cipher_suite().map(|s| s.suite()),
        };
        Ok::<_, std::io::Error>((view, stream))
    };
    let connect = async {
        let stream = TlsConnector::from(Arc::new(client))
            .connect(name, client_io)
            .await?;
        let conn = stream.get_ref().1;
        let view = ClientView {
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
            suite: conn.negotiated_cipher_suite().map(|s| s.suite()),
            version: conn.protocol_version(),
            server_identity: crate::peer_identity(conn),
        };
        Ok::<_, std::io::Error>((view, stream))
    };
    // Both streams live until both sides are done: dropping one early would turn the other's
    // trailing writes (session tickets) into a broken pipe.
    let (server, client) = tokio::join!(accept, connect);
    (server.map(|(view, _)| view), client.map(|(view, _)| view))
}

enum Client {
    /// Our HBONE client config with this certificate and expected server identities.
    Hbone(WorkloadCertificate, Vec<SpiffeId>),
    /// Verifies the server like HBONE but presents no certificate.
    NoCertificate(WorkloadCertificate, Vec<SpiffeId>),
    /// A TLS 1.2-only client (default aws-lc provider) presenting this certificate.
    Tls12Only(WorkloadCertificate),
}

impl Client {
    fn config(self) -> ClientConfig {
        let spiffe_verifier = |cert: &WorkloadCertificate, expected| {
            Arc::new(SpiffeServerVerifier::new(
                cert.root_store(),
                expected,
                provider::shared().signature_verification_algorithms,
            ))
        };
        match self {
            Client::Hbone(cert, expected) => client_config(&cert, expected).unwrap(),
            Client::NoCertificate(cert, expected) => {
                let mut config = ClientConfig::builder_with_provider(provider::shared())
                    .with_protocol_versions(&[&TLS13])
                    .unwrap()
                    .dangerous()
                    .with_custom_certificate_verifier(spiffe_verifier(&cert, expected))
                    .with_no_client_auth();
                config.alpn_protocols = vec![ALPN_H2.to_vec()];
                config
            }
            Client::Tls12Only(cert) => {
                let expected = vec![cert.identity().clone()];
                let verifier = spiffe_verifier(&cert, expected);
                let mut chain = vec![cert.leaf().clone()];
                chain.extend(cert.intermediates().iter().cloned());
                let mut config =
                    ClientConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
                        .with_protocol_versions(&[&TLS12])
                        .unwrap()
                        .dangerous()
                        .with_custom_certificate_verifier(verifier)
                        .with_client_auth_cert(chain, cert.private_key().der().clone_key())
                        .unwrap();
                config.alpn_protocols = vec![ALPN_H2.to_vec()];
                config
            }
        }
    }
}

enum Expect {
    Accepted {
        client: SpiffeId,
        server: SpiffeId,
    },
    /// The server refuses; its error mentions this text.
    ServerRejects(&'static str),
    /// The client refuses; its error mentions all of these texts.
    ClientRejects(&'static [&'static str]),
}

#[tokio::test]
async fn hbone_handshakes() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    // A different subject too: with equal subjects webpki reports BadSignature instead.
    let other_root = LocalCa::generate("other-mesh").unwrap();
    let ttl = Duration::from_secs(3600);
    let server_id = id("spiffe://cluster.local/ns/default/sa/server");
    let client_id = id("spiffe://cluster.local/ns/default/sa/client");
    let remote_id = id("spiffe://cluster.local/ns/default/sa/remote");
    let evil_id = id("spiffe://evil.domain/ns/default/sa/client");

    let server = ca.issue(&server_id, ttl).unwrap();
    let client = ca.issue(&client_id, ttl).unwrap();
    let client_as_server = ca.issue(&client_id, ttl).unwrap();
    let evil_client = ca.issue(&evil_id, ttl).unwrap();
    // Issued under another root, but trusting ours too, so it gets as far as the server's check.
    let foreign_client = {
        let (csr, key) = crate::generate_csr(&client_id).unwrap();
        let leaf = other_root
            .sign_csr(&csr, ttl, |_| Ok(()))
            .unwrap()
            .remove(0);
        let roots = format!("{}{}", other_root.root_pem(), ca.root_pem());
        WorkloadCertificate::from_pem_chain(&[leaf, roots], key).unwrap()
    };
    let foreign_server = other_root.issue(&server_id, ttl).unwrap();

    let cases: Vec<(&str, &WorkloadCertificate, Client, Expect)> = vec![
        (
            "correct identities",
            &server,
            Client::Hbone(client.clone(), vec![server_id.clone()]),
            Expect::Accepted {
                client: client_id.clone(),
                server: server_id.clone(),
            },
        ),
        (
            "server identity is one of several expected",
            &server,
            Client::Hbone(client.clone(), vec![remote_id.clone(), server_id.clone()]),
            Expect::Accepted {
                client: client_id.clone(),
                server: server_id.clone(),
            },
        ),
        (
            "client trust domain differs from the server's",
            &server,
            Client::Hbone(evil_client.clone(), vec![server_id.clone()]),
            Expect::ServerRejects("evil.domain"),
        ),
        (
            "server presents the wrong SAN",
            &client_as_server,
            Client::Hbone(client.clone(), vec![remote_id.clone()]),
            Expect::ClientRejects(&[
                "spiffe://cluster.local/ns/default/sa/remote",
                "spiffe://cluster.local/ns/default/sa/client",
            ]),
        ),
        (
            "client certificate from another root",
            &server,
            Client::Hbone(foreign_client.clone(), vec![server_id.clone()]),
            Expect::ServerRejects("UnknownIssuer"),
        ),
        (
            "server certificate from another root",
            &foreign_server,
            Client::Hbone(client.clone(), vec![server_id.clone()]),
            Expect::ClientRejects(&["UnknownIssuer"]),
        ),
        (
            "client without certificate",
            &server,
            Client::NoCertificate(client.clone(), vec![server_id.clone()]),
            Expect::ServerRejects("no certificates"),
        ),
        (
            "TLS 1.2-only client",
            &server,
            Client::Tls12Only(client.clone()),
            Expect::ServerRejects("Tls12NotOfferedOrEnabled"),
        ),
    ];

    for (name, server_cert, client, expect) in cases {
        let (server_side, client_side) = handshake(
            server_config(server_cert).unwrap(),
            client.config(),
            hbone_server_name(),
        )
        .await;
        match expect {
            Expect::Accepted { client, server } => {
                let s = server_side.unwrap_or_else(|e| panic!("{name}: server failed: {e}"));
                let c = client_side.unwrap_or_else(|e| panic!("{name}: client failed: {e}"));
                assert_eq!(
                    s.peer.as_ref(),
                    Some(&client),
                    "{name}: peer_identity on server"
                );
                assert_eq!(
                    c.server_identity.as_ref(),
                    Some(&server),
                    "{name}: peer_identity on client"
                );
                assert_eq!(s.alpn.as_deref(), Some(ALPN_H2), "{name}");
                assert_eq!(c.alpn.as_deref(), Some(ALPN_H2), "{name}");
                assert_eq!(c.version, Some(ProtocolVersion::TLSv1_3), "{name}");
                let aes_gcm = [
                    CipherSuite::TLS13_AES_256_GCM_SHA384,
                    CipherSuite::TLS13_AES_128_GCM_SHA256,
                ];
                assert!(
                    c.suite.is_some_and(|s| aes_gcm.contains(&s)),
                    "{name}: {:?}",
                    c.suite
                );
                assert_eq!(s.suite, c.suite, "{name}");
            }
            Expect::ServerRejects(text) => {
                let err = server_side.expect_err(name).to_string();
                assert!(
                    err.contains(text),
                    "{name}: server error {err:?} lacks {text:?}"
                );
            }
            Expect::ClientRejects(texts) => {
                let err = client_side.expect_err(name).to_string();
                for text in texts {
                    assert!(
                        err.contains(text),
                        "{name}: client error {err:?} lacks {text:?}"
                    );
                }
                assert!(server_side.is_err(), "{name}: server must not complete");
            }
        }
    }
}

#[tokio::test]
async fn control_plane_handshakes() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let other = LocalCa::generate("cluster.local").unwrap();
    let server_cert = ca
        .server_cert_for_hostnames(&["istiod.istio-system.svc", "127.0.0.1"])
        .unwrap();
    let name = |s: &str| ServerName::try_from(s.to_string()).unwrap();

    // (case, root trusted by the client, ALT hostname, dialed name, accepted?)
    let cases = [
        (
            "dns name",
            ca.root_pem(),
            None,
            "istiod.istio-system.svc",
            true,
        ),
        ("ip address", ca.root_pem(), None, "127.0.0.1", true),
        ("wrong name", ca.root_pem(), None, "other.example", false),
        (
            "alt hostname overrides dialed name",
            ca.root_pem(),
            Some("istiod.istio-system.svc"),
            "localhost",
            true,
        ),
        (
            "wrong alt hostname",
            ca.root_pem(),
            Some("other.example"),
            "istiod.istio-system.svc",
            false,
        ),
        (
            "untrusted root",
            other.root_pem(),
            None,
            "istiod.istio-system.svc",
            false,
        ),
    ];
    for (case, root, alt, dialed, accepted) in cases {
        let client = client_config_for_root(root, alt).unwrap();
        let (server_side, client_side) = handshake(
            server_config_plain(&server_cert).unwrap(),
            client,
            name(dialed),
        )
        .await;
        assert_eq!(client_side.is_ok(), accepted, "{case}: {client_side:?}");
        assert_eq!(server_side.is_ok(), accepted, "{case}: {server_side:?}");
        if let Ok(view) = client_side {
            assert_eq!(view.alpn.as_deref(), Some(ALPN_H2), "{case}");
        }
    }
}

#[test]
fn config_errors() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let cert = ca
        .issue(
            &id("spiffe://cluster.local/ns/a/sa/b"),
            Duration::from_secs(60),
        )
        .unwrap();
    assert!(matches!(
        client_config(&cert, vec![]),
        Err(ConfigError::NoExpectedIdentity)
    ));
    assert!(matches!(
        client_config_for_root("garbage", None),
        Err(ConfigError::Roots(_))
    ));
    assert!(matches!(
        client_config_for_root(ca.root_pem(), Some("not a name")),
        Err(ConfigError::InvalidHostname(_))
    ));
}

#[test]
fn hbone_client_sends_no_sni_and_never_resumes() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let cert = ca
        .issue(
            &id("spiffe://cluster.local/ns/a/sa/b"),
            Duration::from_secs(60),
        )
        .unwrap();
    let client = client_config(&cert, vec![cert.identity().clone()]).unwrap();
    assert!(!client.enable_sni);
    assert_eq!(client.alpn_protocols, [ALPN_H2.to_vec()]);
    let server = server_config(&cert).unwrap();
    assert_eq!(server.send_tls13_tickets, 0);
    assert!(!server.session_storage.can_cache());
}

/// A configuration built while its certificate was valid and used after it expired must
/// refuse the handshake on its own side, never present the expired certificate.
#[tokio::test]
async fn expired_certificates_are_never_presented() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let server_id = id("spiffe://cluster.local/ns/default/sa/server");
    let client_id = id("spiffe://cluster.local/ns/default/sa/client");
    let hour = Duration::from_secs(3600);
    let second = Duration::from_secs(1);
    let fresh_server = ca.issue(&server_id, hour).unwrap();
    let fresh_client = ca.issue(&client_id, hour).unwrap();
    let short_server = ca.issue(&server_id, second).unwrap();
    let short_client = ca.issue(&client_id, second).unwrap();
    // (what, server config, client config, the server's error)
    let cases = [
        (
            "expired server certificate",
            server_config(&short_server).unwrap(),
            client_config(&fresh_client, vec![server_id.clone()]).unwrap(),
            "no server certificate",
        ),
        (
            "expired client certificate",
            server_config(&fresh_server).unwrap(),
            client_config(&short_client, vec![server_id.clone()]).unwrap(),
            "no certificates",
        ),
    ];
    // Poll (bounded) until the short certificates are past their not_after.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(short_server.is_expired_at(SystemTime::now())
        && short_client.is_expired_at(SystemTime::now()))
    {
        assert!(std::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (what, server, client, text) in cases {
        let (server_side, client_side) = handshake(server, client, hbone_server_name()).await;
        let err = server_side.expect_err(what).to_string();
        assert!(
            err.contains(text),
            "{what}: server error {err:?} lacks {text:?}"
        );
        // The client's side may complete (TLS 1.3 clients finish first); if it failed, it
        // was not because it saw an expired certificate.
        if let Err(e) = client_side {
            assert!(
                !e.to_string().to_lowercase().contains("expired"),
                "{what}: the peer saw the expired certificate: {e}"
            );
        }
    }
}
