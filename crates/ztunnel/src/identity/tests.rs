//! CA client and certificate manager against a real CA gRPC server over TLS on loopback.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ambit_control::ca::{CaService, Caller, StaticAuthorizer};
use ambit_model::SpiffeId;
use ambit_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use ambit_tls::LocalCa;
use tokio::net::TcpListener;

use super::*;

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

/// A CA that signs whatever identity it is told to, regardless of the CSR (misbehaving).
struct WrongIdentityCa {
    ca: Arc<LocalCa>,
}

#[tonic::async_trait]
impl IstioCertificateService for WrongIdentityCa {
    async fn create_certificate(
        &self,
        _req: tonic::Request<IstioCertificateRequest>,
    ) -> Result<tonic::Response<IstioCertificateResponse>, tonic::Status> {
        let (csr, _key) =
            ambit_tls::generate_csr(&id("spiffe://cluster.local/ns/evil/sa/other")).unwrap();
        let chain = self
            .ca
            .sign_csr(&csr, Duration::from_secs(3600), |_| Ok(()))
            .unwrap();
        Ok(tonic::Response::new(IstioCertificateResponse {
            cert_chain: chain,
        }))
    }
}

struct Harness {
    address: String,
    root_pem: String,
    _server: tokio::task::JoinHandle<()>,
}

async fn start<S: IstioCertificateService>(ca: &LocalCa, svc: S) -> Harness {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server_cert = ca
        .server_cert_for_hostnames(&["localhost", "127.0.0.1"])
        .unwrap();
    let tls = Arc::new(ambit_tls::server_config_plain(&server_cert).unwrap());
    let routes = tonic::service::Routes::new(IstioCertificateServiceServer::new(svc));
    let server = tokio::spawn(async move {
        let _ = ambit_control::grpc::serve_tls(listener, tls, routes, std::future::pending()).await;
    });
    Harness {
        address: format!("https://127.0.0.1:{port}"),
        root_pem: ca.root_pem().to_string(),
        _server: server,
    }
}

fn client(h: &Harness, token: &str, impersonate: bool, ttl: Duration) -> CaClient {
    let channel = crate::grpc::channel(&h.address, &h.root_pem, Some("localhost")).unwrap();
    CaClient::new(
        channel,
        Some(AuthToken::Literal(token.into())),
        "Kubernetes".into(),
        vec![],
        ttl,
        impersonate,
    )
}

fn node_ca(ca: Arc<LocalCa>) -> CaService {
    let tokens = HashMap::from([(
        "node1".to_string(),
        Caller::NodeProxy {
            node: "node1".into(),
        },
    )]);
    CaService::new(
        ca,
        Arc::new(StaticAuthorizer::new(tokens, |_, id| {
            id.namespace() == "default"
        })),
    )
}

#[tokio::test]
async fn fetches_and_caches_per_identity() {
    let ca = Arc::new(LocalCa::generate("cluster.local").unwrap());
    let h = start(&ca, node_ca(ca.clone())).await;
    let mgr = CertManager::new(client(&h, "node1", true, Duration::from_secs(3600)));
    let pod1 = id("spiffe://cluster.local/ns/default/sa/pod1");
    let a = mgr.fetch(&pod1).await.unwrap();
    assert_eq!(a.identity(), &pod1);
    let b = mgr.fetch(&pod1).await.unwrap();
    assert!(Arc::ptr_eq(&a, &b), "second fetch is served from the cache");
    assert!(matches!(mgr.states()[0].1, CertState::Available(_)));
}

#[tokio::test]
async fn refused_identity_is_an_error() {
    let ca = Arc::new(LocalCa::generate("cluster.local").unwrap());
    let h = start(&ca, node_ca(ca.clone())).await;
    let cases = [
        ("node1", true, "spiffe://cluster.local/ns/other/sa/x"), // not on this node
        ("bogus", true, "spiffe://cluster.local/ns/default/sa/x"), // unknown token
        ("node1", false, "spiffe://cluster.local/ns/default/sa/x"), // no impersonation header
    ];
    for (token, impersonate, identity) in cases {
        let mgr = CertManager::new(client(&h, token, impersonate, Duration::from_secs(3600)));
        let err = mgr.fetch(&id(identity)).await.unwrap_err();
        assert!(
            matches!(err, IdentityError::Ca { .. }),
            "{token} {identity}: {err:?}"
        );
    }
}

#[tokio::test]
async fn leaf_for_another_identity_is_rejected() {
    let ca = Arc::new(LocalCa::generate("cluster.local").unwrap());
    let h = start(&ca, WrongIdentityCa { ca: ca.clone() }).await;
    let c = client(&h, "node1", true, Duration::from_secs(3600));
    let err = c
        .fetch(&id("spiffe://cluster.local/ns/default/sa/pod1"))
        .await
        .unwrap_err();
    assert!(matches!(err, IdentityError::BadResponse { .. }), "{err:?}");
}

#[tokio::test]
async fn renews_at_half_life() {
    let ca = Arc::new(LocalCa::generate("cluster.local").unwrap());
    let h = start(
        &ca,
        node_ca(ca.clone()).with_min_ttl(Duration::from_secs(1)),
    )
    .await;
    let mgr = CertManager::new(client(&h, "node1", true, Duration::from_secs(4)));
    let pod1 = id("spiffe://cluster.local/ns/default/sa/pod1");
    let first = mgr.fetch(&pod1).await.unwrap();
    let lifetime = first
        .not_after()
        .duration_since(first.not_before())
        .unwrap();
    assert!(lifetime <= Duration::from_secs(5), "{lifetime:?}");
    // Half-life is ~2 s: poll (bounded) until the manager swapped in a new certificate.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = mgr.fetch(&pod1).await.unwrap();
        if now.serial() != first.serial() {
            assert!(now.not_after() > first.not_after());
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no renewal within the deadline"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a scripted CA does on each call, in order; the last step repeats.
#[derive(Clone, Copy)]
enum Step {
    /// Never answers.
    Hang,
    /// Issues a certificate with this lifetime.
    Issue(Duration),
}

struct ScriptedCa {
    ca: LocalCa,
    steps: Vec<Step>,
    calls: std::sync::atomic::AtomicUsize,
}

impl ScriptedCa {
    fn new(steps: Vec<Step>) -> Self {
        Self {
            ca: LocalCa::generate("cluster.local").unwrap(),
            steps,
            calls: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl CertProvider for ScriptedCa {
    fn fetch<'a>(&'a self, identity: &'a SpiffeId) -> BoxFuture<'a, WorkloadCertificate> {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let step = self.steps[n.min(self.steps.len() - 1)];
        Box::pin(async move {
            match step {
                Step::Hang => std::future::pending().await,
                Step::Issue(ttl) => self.ca.issue(identity, ttl).map_err(|e| IdentityError::Ca {
                    identity: identity.clone(),
                    message: e.to_string(),
                }),
            }
        })
    }
}

/// Hole: a CA call that never returned stopped the identity's refresh loop for good, and
/// every fetch waited on it forever. (Paused time: the deadlines pass without waiting.)
#[tokio::test(start_paused = true)]
async fn a_ca_call_that_never_returns_is_given_up_and_retried() {
    let mgr = CertManager::new(ScriptedCa::new(vec![
        Step::Hang,
        Step::Issue(Duration::from_secs(3600)),
    ]));
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    let first = tokio::time::timeout(Duration::from_secs(3600), mgr.fetch(&pod))
        .await
        .expect("a fetch waits a bounded time on a CA that never answers");
    assert!(first.is_err(), "{first:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
    loop {
        if mgr.fetch(&pod).await.is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hung call was never retried"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Hole: once renewal stalled, the cached certificate was handed out (and presented in
/// handshakes) after it expired.
#[tokio::test]
async fn an_expired_certificate_is_never_handed_out() {
    let mgr = CertManager::new(ScriptedCa::new(vec![
        Step::Issue(Duration::from_secs(1)),
        Step::Hang,
    ]));
    let pod = id("spiffe://cluster.local/ns/default/sa/pod1");
    let cert = mgr.fetch(&pod).await.unwrap();
    // Wall-clock expiry: poll (bounded) until the 1 s certificate is past its not_after.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cert.is_expired_at(SystemTime::now()) {
        assert!(std::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = tokio::time::timeout(Duration::from_secs(5), mgr.fetch(&pod))
        .await
        .expect("an answer without waiting on the hung renewal");
    assert!(after.is_err(), "an expired certificate was handed out");
}
