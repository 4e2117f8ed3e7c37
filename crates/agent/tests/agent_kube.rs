//! The agent on the Kubernetes pod source (root, network namespaces): pods and namespaces
//! come from `ambit_kubeapi`'s fake API server over real HTTP, the redirection annotation
//! goes back as `pods/status` merge patches, and failed patches are retried or dropped as
//! their error says (`SourceError`).

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use ambit_agent::testing::cni_add;
use ambit_testkit::eventually;
use std::net::IpAddr;
use std::time::Duration;

use ambit_agent::AgentConfig;
use ambit_agent::pods::kube::KubePodSource;
use ambit_agent::testing::{FakeZtunnel, Seen};
use ambit_kubeapi::testing::{FakeApiServer, Route};
use ambit_kubeapi::{Client, serde_json};
use ambit_netns::testing::netns_capable_or_skip;
use ambit_topology::Topology;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);
const MODE: &str = "istio.io/dataplane-mode";
const ANNOTATION: &str = "ambient.istio.io/redirection";
const PODS: &str = "/api/v1/pods";

fn annotation(server: &FakeApiServer, name: &str) -> Option<String> {
    let pod = server.object(PODS, "demo", name)?;
    pod["metadata"]["annotations"][ANNOTATION]
        .as_str()
        .map(str::to_owned)
}

fn status_patches(server: &FakeApiServer, name: &str) -> usize {
    let path = format!("/api/v1/namespaces/demo/pods/{name}/status");
    server
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == path)
        .count()
}

/// Relabels a stored pod, keeping everything else (the annotation included).
fn relabel(server: &FakeApiServer, name: &str, mode: &str) {
    let mut pod: Value = server.object(PODS, "demo", name).unwrap();
    pod["metadata"]["labels"][MODE] = json!(mode);
    server.apply(PODS, pod);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrol_through_the_api_server_and_retry_failed_patches() {
    if !netns_capable_or_skip("enrol_through_the_api_server_and_retry_failed_patches") {
        return;
    }
    let topo = Topology::builder()
        .node("n")
        .pod("n", "p1")
        .pod("n", "p2")
        .build()
        .unwrap();
    let ip = |p: &str| IpAddr::V4(topo.pod(p).ip());
    let server = FakeApiServer::start().await.unwrap();
    server.apply(
        "/api/v1/namespaces",
        json!({"metadata": {"name": "demo", "labels": {MODE: "ambient"}}}),
    );
    for p in ["p1", "p2"] {
        server.apply(
            PODS,
            json!({
                "metadata": {"name": p, "namespace": "demo", "uid": format!("uid-{p}")},
                "spec": {"nodeName": "n", "serviceAccountName": "default"},
                "status": {"phase": "Running", "podIPs": [{"ip": ip(p).to_string()}]},
            }),
        );
    }
    // The node's ztunnel (here the system namespace is `demo`): started through the CNI
    // plugin like any pod, never enrolled.
    server.apply(
        PODS,
        json!({
            "metadata": {"name": "zt", "namespace": "demo", "uid": "uid-zt",
                         "labels": {"app": "ztunnel"}},
            "spec": {"nodeName": "n", "serviceAccountName": "ztunnel"},
            "status": {"phase": "Pending"},
        }),
    );
    // A pod of another node never reaches this agent.
    server.apply(
        PODS,
        json!({"metadata": {"name": "elsewhere", "namespace": "demo"},
               "spec": {"nodeName": "other"}, "status": {"phase": "Running"}}),
    );

    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let zds_sock = dir.path().join("zt").join("ztunnel.sock");
    let vars: Vec<(String, String)> = [
        ("ZTUNNEL_UDS_ADDRESS", zds_sock.display().to_string()),
        ("CNI_AGENT_RUN_DIR", run_dir.display().to_string()),
        (
            "AMBIT_HOST_NETNS",
            topo.node("n").netns().path().display().to_string(),
        ),
        ("AMBIT_HEALTH_ADDR", "127.0.0.1:0".into()),
        ("AMBIT_METRICS_ADDR", "127.0.0.1:0".into()),
        ("AMBIT_VERIFY_INTERVAL", "0".into()),
        ("NODE_NAME", "n".into()),
        ("SYSTEM_NAMESPACE", "demo".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let cfg = AgentConfig::from_vars(&vars).unwrap();
    let client = Client::new(server.config()).unwrap();
    let source = KubePodSource::new(client, "n")
        .with_backoff(Duration::from_millis(10), Duration::from_millis(100));
    // `start` returns after the initial list: both pods are in the agent's cache.
    let agent = ambit_agent::start(cfg, source).await.unwrap();
    let zt = FakeZtunnel::connect(&zds_sock, true).unwrap();
    eventually("the snapshot to reach the fake ztunnel", WAIT, || {
        zt.seen().contains(&Seen::SnapshotSent)
    })
    .await;

    // The ztunnel pod's ADD succeeds and leaves it alone (issue 14: it used to be unknown
    // to the agent, so its sandbox failed on every node with the plugin installed).
    let (code, out) = cni_add(&run_dir, &topo.pod("p1").netns_path(), "zt", ip("p1"));
    assert_eq!(code, 0, "ztunnel pod: {out}");
    assert_eq!(annotation(&server, "zt"), None);
    assert!(
        !zt.seen()
            .iter()
            .any(|s| matches!(s, Seen::Add { uid, .. } if uid == "uid-zt"))
    );

    // CNI ADD: rules, ztunnel, then `enabled` patched onto pods/status.
    for p in ["p1", "p2"] {
        let (code, out) = cni_add(&run_dir, &topo.pod(p).netns_path(), p, ip(p));
        assert_eq!(code, 0, "{p}: {out}");
        assert_eq!(annotation(&server, p).as_deref(), Some("enabled"), "{p}");
    }
    let patches = server.patches();
    assert_eq!(
        patches[0].body,
        r#"{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}"#
    );

    // Un-enrol p1 by label while the API server fails the first patch (500): the worker
    // retries until the annotation is gone.
    let path = "/api/v1/namespaces/demo/pods/p1/status";
    let before = status_patches(&server, "p1");
    server.respond_once(
        Route::Patch(path.into()),
        500,
        json!({"kind": "Status", "reason": "InternalError", "message": "etcd", "code": 500})
            .to_string(),
    );
    relabel(&server, "p1", "none");
    eventually("annotation(&server, \"p1\").is_none()", WAIT, || {
        annotation(&server, "p1").is_none()
    })
    .await;
    assert!(zt.seen().contains(&Seen::Del {
        uid: "uid-p1".into()
    }));
    assert_eq!(
        status_patches(&server, "p1") - before,
        2,
        "500, then success"
    );

    // Un-enrol p2 while the API server says the pod is gone (404): nothing to retry. The
    // un-enrolment still completes (Del to ztunnel) and p2's next change is handled
    // normally, so the worker is not stuck on it.
    let path = "/api/v1/namespaces/demo/pods/p2/status";
    let before = status_patches(&server, "p2");
    server.respond_once(
        Route::Patch(path.into()),
        404,
        json!({"kind": "Status", "reason": "NotFound", "message": "gone", "code": 404}).to_string(),
    );
    relabel(&server, "p2", "none");
    eventually(
        "zt.seen().contains(&Seen::Del { uid: \"uid-p2\".into() })",
        WAIT,
        || {
            zt.seen().contains(&Seen::Del {
                uid: "uid-p2".into(),
            })
        },
    )
    .await;
    eventually("status_patches(&server, \"p2\") > before", WAIT, || {
        status_patches(&server, "p2") > before
    })
    .await;
    // The pod still carries `enabled` (the 404 was injected); a later update that finds
    // it un-enrolled but annotated removes the annotation through a fresh reconcile.
    assert_eq!(annotation(&server, "p2").as_deref(), Some("enabled"));
    let mut p2: Value = server.object(PODS, "demo", "p2").unwrap();
    p2["metadata"]["labels"]["touched"] = json!("yes");
    server.apply(PODS, p2);
    eventually("annotation(&server, \"p2\").is_none()", WAIT, || {
        annotation(&server, "p2").is_none()
    })
    .await;
    assert_eq!(
        status_patches(&server, "p2") - before,
        2,
        "404, then the new event"
    );

    agent.shutdown().await;
}
