//! The client's cluster-facing features against the fake API server: paged lists, connection
//! reuse, `exec` credential plugins (run once, again after a 401 or expiry), creates
//! (TokenReview) and an outage answered with 503.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

#[path = "support/error_chain.rs"]
mod error_chain;
use error_chain::error_chain;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use ambit_kubeapi::testing::{FakeApiServer, Route, TOKEN_REVIEWS, TokenIdentity};
use ambit_kubeapi::{Auth, Client, Error, ExecConfig, Limits};
use serde_json::{Value, json};

const PODS: &str = "/api/v1/pods";

fn pod(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "a"}, "spec": {"nodeName": "n1"}})
}

#[tokio::test]
async fn lists_are_paged_and_connections_reused() {
    let server = FakeApiServer::start().await.expect("fake server");
    for i in 0..7 {
        server.apply(PODS, pod(&format!("p{i}")));
    }
    let limits = Limits {
        page_size: 3,
        ..Limits::default()
    };
    let client = Client::new(server.config())
        .expect("client")
        .with_limits(limits);
    let list = client.list(PODS, None).await.expect("list");
    let names: Vec<&str> = list
        .items
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]);
    let pages: Vec<String> = server.requests().iter().map(|r| r.query.clone()).collect();
    assert_eq!(
        pages,
        [
            "limit=3",
            "limit=3&continue=page-3",
            "limit=3&continue=page-6"
        ],
        "three pages, each continuing the last"
    );
    for _ in 0..5 {
        client
            .get("/api/v1/namespaces/a/pods/p1")
            .await
            .expect("get");
    }
    assert_eq!(
        server.connections(),
        1,
        "eight requests over one connection"
    );
}

/// A credential plugin that counts its runs in `dir/runs` and prints `token-N`, expiring
/// as given.
fn plugin(dir: &std::path::Path, expires: &str) -> ExecConfig {
    let script = dir.join("plugin.sh");
    let body = format!(
        "#!/bin/sh\n\
         case \"$KUBERNETES_EXEC_INFO\" in *'\"interactive\":false'*) ;; *) exit 3 ;; esac\n\
         n=$(( $(cat \"$RUNS\" 2>/dev/null || echo 0) + 1 )); echo $n > \"$RUNS\"\n\
         printf '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\
         \"status\":{{\"token\":\"token-%s\"{expires}}}}}' $n\n"
    );
    std::fs::write(&script, body).expect("write plugin");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    ExecConfig {
        command: script,
        args: vec![],
        env: vec![("RUNS".into(), dir.join("runs").display().to_string())],
        api_version: "client.authentication.k8s.io/v1".into(),
        user: "u1".into(),
        kubeconfig: "kc".into(),
    }
}

fn runs(dir: &std::path::Path) -> u32 {
    std::fs::read_to_string(dir.join("runs"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn bearer_tokens(server: &FakeApiServer) -> Vec<String> {
    server
        .requests()
        .iter()
        .filter_map(|r| r.authorization.clone())
        .collect()
}

#[tokio::test]
async fn exec_plugin_tokens_are_cached_and_shared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = FakeApiServer::start().await.expect("fake server");
    let mut config = server.config();
    config.auth = Auth::Exec(plugin(dir.path(), ""));
    let client = Client::new(config).expect("client");
    assert_eq!(runs(dir.path()), 0, "building the client runs nothing");
    client.list(PODS, None).await.expect("list");
    client.list(PODS, None).await.expect("list");
    // Other limits and clones are the same client: the same token, the same connection.
    let small = client.clone().with_limits(Limits {
        page_size: 1,
        ..Limits::default()
    });
    small.list(PODS, None).await.expect("list");
    client.clone().list(PODS, None).await.expect("list");
    assert_eq!(runs(dir.path()), 1, "one run for every request");
    assert_eq!(bearer_tokens(&server), ["Bearer token-1"; 4]);
    assert_eq!(server.connections(), 1, "one connection pool");

    // A refused token (401) is fetched again on the next request, as client-go does.
    server.respond_once(
        Route::List(PODS.into()),
        401,
        r#"{"reason":"Unauthorized"}"#,
    );
    let err = client.list(PODS, None).await.expect_err("refused");
    assert_eq!(err.status(), Some(401), "{err:?}");
    client.list(PODS, None).await.expect("list");
    assert_eq!(runs(dir.path()), 2, "run again after the 401");
    assert_eq!(
        bearer_tokens(&server).last().map(String::as_str),
        Some("Bearer token-2")
    );
}

#[tokio::test]
async fn expired_or_refused_exec_tokens_are_fetched_again_and_plugin_failures_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = FakeApiServer::start().await.expect("fake server");
    let mut config = server.config();
    // Already expired: every request needs a new run.
    config.auth = Auth::Exec(plugin(
        dir.path(),
        r#","expirationTimestamp":"2001-01-01T00:00:00Z""#,
    ));
    let client = Client::new(config.clone()).expect("client");
    client.list(PODS, None).await.expect("list");
    client.list(PODS, None).await.expect("list");
    assert_eq!(runs(dir.path()), 2);
    assert_eq!(bearer_tokens(&server), ["Bearer token-1", "Bearer token-2"]);

    let mut broken = config;
    broken.auth = Auth::Exec(ExecConfig {
        command: "/nonexistent/plugin".into(),
        args: vec![],
        env: vec![],
        api_version: "client.authentication.k8s.io/v1".into(),
        user: "u1".into(),
        kubeconfig: "/etc/kc".into(),
    });
    // The plugin runs on the first request, so that is where it fails.
    let client = Client::new(broken).expect("client");
    let err = client.list(PODS, None).await.expect_err("no plugin");
    assert!(matches!(err, Error::Credentials(_)), "{err:?}");
    let line = error_chain(&err);
    for part in [
        "/nonexistent/plugin",
        "\"u1\"",
        "/etc/kc",
        "could not be started",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
}

#[tokio::test]
async fn token_reviews_and_outages() {
    let server = FakeApiServer::start().await.expect("fake server");
    server.add_token(
        "sa-token",
        TokenIdentity::pod_bound(
            "istio-system",
            "ztunnel",
            ("zt-1", "u1"),
            "n1",
            &["istio-ca"],
        ),
    );
    let client = Client::new(server.config()).expect("client");
    let review = |token: &str, audience: &str| {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "spec": {"token": token, "audiences": [audience]}})
    };
    let ok = client
        .create(TOKEN_REVIEWS, &review("sa-token", "istio-ca"))
        .await
        .expect("review");
    assert_eq!(ok["status"]["authenticated"], true);
    assert_eq!(
        ok["status"]["user"]["username"],
        "system:serviceaccount:istio-system:ztunnel"
    );
    for (token, audience) in [("sa-token", "other"), ("forged", "istio-ca")] {
        let no = client
            .create(TOKEN_REVIEWS, &review(token, audience))
            .await
            .expect("review");
        assert_eq!(no["status"]["authenticated"], false, "{token} {audience}");
    }
    server.set_unavailable(true);
    let err = client.list(PODS, None).await.expect_err("outage");
    assert_eq!(err.status(), Some(503), "{err:?}");
    server.set_unavailable(false);
    tokio::time::timeout(Duration::from_secs(5), client.list(PODS, None))
        .await
        .expect("in time")
        .expect("served again");
}

#[tokio::test]
async fn client_certificates_from_the_kubeconfig_or_a_plugin_are_presented() {
    use ambit_tls::rustls;
    let ca = ambit_tls::LocalCa::generate("cluster.local").expect("ca");
    let server_cert = ca
        .server_cert_for_hostnames(&["127.0.0.1"])
        .expect("server cert");
    // A client certificate of the same CA, as kind/k3d/minikube kubeconfigs carry.
    let id = admin_identity();
    let client = ca
        .issue(&id, Duration::from_secs(3600))
        .expect("client cert");
    let mut store = rustls::RootCertStore::empty();
    for root in ambit_tls::cert::parse_certs_pem(ca.root_pem()).expect("roots") {
        store.add(root).expect("root");
    }
    let provider = std::sync::Arc::new(ambit_tls::provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(store),
        provider.clone(),
    )
    .build()
    .expect("verifier");
    let key = server_cert.private_key().der().clone_key();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(server_cert.chain().to_vec(), key)
        .expect("server config");
    let server = FakeApiServer::start_tls_with(config)
        .await
        .expect("fake server");
    let mut config = server.config();
    config.ca_pem = Some(ca.root_pem().to_string());
    let without = Client::new(config.clone()).expect("client");
    assert!(
        without.list(PODS, None).await.is_err(),
        "the server requires a client certificate"
    );
    let (cert_pem, key_pem) = (
        client.chain_summaries()[0].pem.clone(),
        client.private_key().pem().to_string(),
    );
    // The same certificate from an exec plugin's answer (clientCertificateData).
    let dir = tempfile::tempdir().expect("tempdir");
    let answer = dir.path().join("answer.json");
    let credential = json!({"apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"clientCertificateData": cert_pem, "clientKeyData": key_pem}});
    std::fs::write(&answer, credential.to_string()).expect("answer");
    let script = dir.path().join("cert-plugin.sh");
    std::fs::write(&script, "#!/bin/sh\ncat \"$ANSWER\"\n").expect("plugin");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut from_plugin = config.clone();
    from_plugin.auth = Auth::Exec(ExecConfig {
        command: script,
        args: vec![],
        env: vec![("ANSWER".into(), answer.display().to_string())],
        api_version: "client.authentication.k8s.io/v1".into(),
        user: "u1".into(),
        kubeconfig: "kc".into(),
    });
    config.client_identity = Some(ambit_kubeapi::ClientIdentity { cert_pem, key_pem });
    for (how, config) in [("the kubeconfig", config), ("an exec plugin", from_plugin)] {
        let with = Client::new(config).expect("client");
        with.list(PODS, None)
            .await
            .unwrap_or_else(|e| panic!("listed with a client certificate from {how}: {e:?}"));
    }
}

fn admin_identity() -> ambit_model::SpiffeId {
    ambit_model::SpiffeId::parse("spiffe://cluster.local/ns/kube-system/sa/admin").expect("id")
}
