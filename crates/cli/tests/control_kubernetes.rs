//! `ambit control` on a cluster, against the fake API server: objects from the Kubernetes
//! source, callers authenticated with service-account tokens by TokenReview (audience
//! istio-ca), node-scoped impersonation from the token's pod claims as istiod does, and a
//! brief API server outage; one Kubernetes client (one credential plugin run) for the
//! source and TokenReview. The CA is called over gRPC/TLS as ztunnel calls it. No root.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

use std::net::SocketAddr;
use std::time::Duration;

use ambit_control::server::{CallerAuth, ControlConfig, ObjectSource};
use ambit_control::translate::ClusterConfig;
use ambit_kubeapi::testing::{FakeApiServer, TokenIdentity};
use ambit_model::SpiffeId;
use ambit_proto::ca::IstioCertificateRequest;
use ambit_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(10);
const PODS: &str = "/api/v1/pods";

fn pod(ns: &str, name: &str, uid: &str, sa: &str, node: &str, ip: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"nodeName": node, "serviceAccountName": sa,
                 "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

fn id(ns: &str, sa: &str) -> String {
    format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
}

struct Control {
    addr: SocketAddr,
    root: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

async fn start(server: &FakeApiServer) -> Control {
    start_with(server.config()).await
}

async fn start_with(kube: ambit_kubeapi::KubeConfig) -> Control {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ControlConfig {
        source: ObjectSource::Kubernetes(Box::new(kube)),
        listen: "127.0.0.1:0".parse().expect("addr"),
        state_dir: dir.path().join("state"),
        auth: CallerAuth::TokenReview {
            node_accounts: vec![("istio-system".into(), "ztunnel".into())],
        },
        monitoring: None,
        hostnames: vec!["localhost".into()],
        cluster: ClusterConfig::default(),
        mesh_config: ambit_control::mesh_config::watch::MeshSource::None,
        autoregistration: Default::default(),
    };
    let (bound_tx, bound) = tokio::sync::oneshot::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = ambit_control::server::run(cfg, shutdown, Some(bound_tx)).await {
            panic!("control plane failed: {e}");
        }
    });
    let addr = tokio::time::timeout(DEADLINE, bound)
        .await
        .expect("bound in time")
        .expect("bound");
    let root = std::fs::read_to_string(dir.path().join("state/root-cert.pem")).expect("root");
    Control {
        addr,
        root,
        _stop: stop,
        _dir: dir,
    }
}

/// Asks the CA for `identity`'s certificate with `token`, as ztunnel does (impersonating when
/// `impersonate`); the gRPC status code on failure.
async fn certificate(
    c: &Control,
    token: &str,
    identity: &str,
    impersonate: bool,
) -> Result<(), tonic::Code> {
    let channel = ambit_ztunnel::grpc::channel(
        &format!("https://localhost:{}", c.addr.port()),
        &c.root,
        None,
    )
    .expect("channel");
    let mut client = IstioCertificateServiceClient::new(channel);
    let spiffe = SpiffeId::parse(identity).expect("identity");
    let (csr, _key) = ambit_tls::generate_csr(&spiffe).expect("csr");
    let metadata = impersonate.then(|| prost_types::Struct {
        fields: [(
            "ImpersonatedIdentity".to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(identity.into())),
            },
        )]
        .into(),
    });
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr,
        validity_duration: 3600,
        metadata,
    });
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    match tokio::time::timeout(DEADLINE, client.create_certificate(request)).await {
        Err(_) => panic!("CA did not answer"),
        Ok(Ok(r)) => {
            assert_eq!(r.into_inner().cert_chain.len(), 2);
            Ok(())
        }
        Ok(Err(status)) => Err(status.code()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_reviewed_node_proxies_get_only_their_nodes_identities() {
    let server = FakeApiServer::start().await.expect("fake server");
    for ns in ["istio-system", "demo"] {
        server.apply("/api/v1/namespaces", json!({"metadata": {"name": ns}}));
    }
    let pods = [
        (
            "istio-system",
            "ztunnel-a",
            "u-zt-a",
            "ztunnel",
            "n1",
            "10.0.1.2",
        ),
        (
            "istio-system",
            "ztunnel-b",
            "u-zt-b",
            "ztunnel",
            "n2",
            "10.0.2.2",
        ),
        ("demo", "web-1", "u-web", "web", "n1", "10.0.1.10"),
        ("demo", "db-1", "u-db", "db", "n2", "10.0.2.10"),
    ];
    for (ns, name, uid, sa, node, ip) in pods {
        server.apply(PODS, pod(ns, name, uid, sa, node, ip));
    }
    let bound = |ns: &str, sa: &str, pod: (&str, &str), node: &str, aud: &str| {
        TokenIdentity::pod_bound(ns, sa, pod, node, &[aud])
    };
    let tokens = [
        (
            "zt-a",
            bound(
                "istio-system",
                "ztunnel",
                ("ztunnel-a", "u-zt-a"),
                "n1",
                "istio-ca",
            ),
        ),
        (
            "zt-b",
            bound(
                "istio-system",
                "ztunnel",
                ("ztunnel-b", "u-zt-b"),
                "n2",
                "istio-ca",
            ),
        ),
        (
            "web",
            bound("demo", "web", ("web-1", "u-web"), "n1", "istio-ca"),
        ),
        (
            "zt-api-aud",
            bound(
                "istio-system",
                "ztunnel",
                ("ztunnel-a", "u-zt-a"),
                "n1",
                "api",
            ),
        ),
        // A token of a deleted and recreated pod of the same name.
        (
            "zt-stale",
            bound(
                "istio-system",
                "ztunnel",
                ("ztunnel-a", "u-old"),
                "n1",
                "istio-ca",
            ),
        ),
        // The pod-name claim says n1's ztunnel, the node claim another node.
        (
            "zt-lying",
            bound(
                "istio-system",
                "ztunnel",
                ("ztunnel-a", "u-zt-a"),
                "n2",
                "istio-ca",
            ),
        ),
    ];
    for (t, identity) in &tokens {
        server.add_token(t, identity.clone());
    }
    let control = start(&server).await;
    use tonic::Code::{PermissionDenied, Unauthenticated};
    let web = id("demo", "web");
    let db = id("demo", "db");
    // (case, token, identity, impersonate, outcome)
    type Case<'a> = (&'a str, &'a str, &'a str, bool, Result<(), tonic::Code>);
    let cases: [Case; 10] = [
        ("node proxy, pod on its node", "zt-a", &web, true, Ok(())),
        (
            "node proxy, another node's pod",
            "zt-a",
            &db,
            true,
            Err(PermissionDenied),
        ),
        ("the other node's proxy", "zt-b", &db, true, Ok(())),
        (
            "the other node's proxy, n1's pod",
            "zt-b",
            &web,
            true,
            Err(PermissionDenied),
        ),
        ("a workload, its own identity", "web", &web, false, Ok(())),
        (
            "a workload may not impersonate",
            "web",
            &db,
            true,
            Err(PermissionDenied),
        ),
        (
            "wrong audience",
            "zt-api-aud",
            &web,
            true,
            Err(Unauthenticated),
        ),
        (
            "stale pod uid",
            "zt-stale",
            &web,
            true,
            Err(Unauthenticated),
        ),
        (
            "node claim disagrees",
            "zt-lying",
            &web,
            true,
            Err(Unauthenticated),
        ),
        ("unknown token", "forged", &web, true, Err(Unauthenticated)),
    ];
    for (case, token, identity, impersonate, want) in cases {
        let got = certificate(&control, token, identity, impersonate).await;
        assert_eq!(got, want, "{case}");
    }
    let reviews = server
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/tokenreviews"))
        .count();
    assert!(reviews >= 6, "each new token was reviewed ({reviews})");

    // A brief outage: a token reviewed before is still served, a new one is refused (fail
    // closed), and changes made meanwhile arrive once the API server is back.
    server.set_unavailable(true);
    assert_eq!(certificate(&control, "zt-a", &web, true).await, Ok(()));
    server.add_token(
        "zt-new",
        bound(
            "istio-system",
            "ztunnel",
            ("ztunnel-a", "u-zt-a"),
            "n1",
            "istio-ca",
        ),
    );
    assert_eq!(
        certificate(&control, "zt-new", &web, true).await,
        Err(Unauthenticated)
    );
    server.set_unavailable(false);
    server.apply(
        PODS,
        pod("demo", "api-1", "u-api", "api", "n1", "10.0.1.11"),
    );
    let api = id("demo", "api");
    ambit_testkit::eventually_async("api-1 known after the outage", DEADLINE, || async {
        certificate(&control, "zt-a", &api, true).await.is_ok()
    })
    .await;
}

/// The object source and the TokenReview authorizer share one client: an `exec` credential
/// plugin runs once for both, and every request carries its one token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_and_token_review_share_one_client() {
    use std::os::unix::fs::PermissionsExt;
    let server = FakeApiServer::start().await.expect("fake server");
    server.apply("/api/v1/namespaces", json!({"metadata": {"name": "demo"}}));
    server.apply(
        PODS,
        pod("demo", "web-1", "u-web", "web", "n1", "10.0.1.10"),
    );
    server.add_token(
        "web",
        TokenIdentity::pod_bound("demo", "web", ("web-1", "u-web"), "n1", &["istio-ca"]),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let runs = dir.path().join("runs");
    let script = dir.path().join("plugin.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         n=$(( $(cat \"$RUNS\" 2>/dev/null || echo 0) + 1 )); echo $n > \"$RUNS\"\n\
         printf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\
         \"status\":{\"token\":\"plugin-token-%s\"}}' $n\n",
    )
    .expect("plugin");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut kube = server.config();
    kube.auth = ambit_kubeapi::Auth::Exec(ambit_kubeapi::ExecConfig {
        command: script,
        args: vec![],
        env: vec![("RUNS".into(), runs.display().to_string())],
        api_version: "client.authentication.k8s.io/v1".into(),
        user: "control".into(),
        kubeconfig: "kc".into(),
    });
    let control = start_with(kube).await;
    assert_eq!(
        certificate(&control, "web", &id("demo", "web"), false).await,
        Ok(())
    );
    let requests = server.requests();
    assert!(
        requests.iter().any(|r| r.path.ends_with("/tokenreviews"))
            && requests.iter().any(|r| r.path == PODS),
        "both the source and the authorizer called the API server: {requests:?}"
    );
    let tokens: std::collections::BTreeSet<_> =
        requests.iter().map(|r| r.authorization.clone()).collect();
    assert_eq!(
        tokens,
        [Some("Bearer plugin-token-1".to_string())].into(),
        "every request with the one run's token"
    );
    let ran = std::fs::read_to_string(&runs).expect("runs");
    assert_eq!(ran.trim(), "1", "the plugin ran once");
}
