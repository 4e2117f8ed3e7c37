//! `ambit ztunnel-config` against a cluster: the ztunnel is found by `POD[.NAMESPACE]` or
//! `--node` (label `app=ztunnel`, field `spec.nodeName`), its `/config_dump` read through the
//! API server's pod proxy to port 15000 (the fake API server answers for the pod), filtered
//! by `--workload-namespace` / `--address` / `--direction`; `--file` reads a saved dump. The
//! kubeconfig is found by the KUBECONFIG rule. No root needed.

// Unix only: the entry points it runs are Linux roles (not in the Windows binary).
#![cfg(unix)]

use std::process::{Command, Output};

use ambit_kubeapi::testing::FakeApiServer;
use serde_json::{Value, json};

#[path = "support/istioctl_types.rs"]
mod istioctl_types;

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");

fn dump() -> Value {
    json!({
        "workloads": [
            {"uid": "Kubernetes//Pod/demo/web-1", "name": "web-1", "namespace": "demo",
             "workloadIps": ["10.0.1.10"], "protocol": "HBONE", "node": "n1",
             "serviceAccount": "web", "status": "Healthy", "waypoint": null},
            {"uid": "Kubernetes//Pod/other/db-1", "name": "db-1", "namespace": "other",
             "workloadIps": ["10.0.1.11"], "protocol": "HBONE", "node": "n1",
             "serviceAccount": "db", "status": "Healthy"},
        ],
        "services": [
            {"name": "web", "namespace": "demo", "hostname": "web.demo.svc.cluster.local",
             "vips": ["/10.96.0.10"], "ports": {"80": 8080},
             "endpoints": {"Kubernetes//Pod/demo/web-1":
                 {"workloadUid": "Kubernetes//Pod/demo/web-1", "port": {"80": 8080}}}},
        ],
        "policies": [],
        "certificates": [
            {"identity": "spiffe://cluster.local/ns/demo/sa/web", "state": "Available",
             "certChain": [{"pem": "x", "serialNumber": "01",
                            "validFrom": "2026-01-01T00:00:00Z",
                            "expirationTime": "2026-01-02T00:00:00Z"}],
             "rootCerts": []},
        ],
        "workloadState": {
            "u1": {"state": "Up", "info": {"name": "web-1", "namespace": "demo",
                   "serviceAccount": "web", "trustDomain": "cluster.local"},
                   "connections": {"inbound": [{"src": "10.0.1.11:4000",
                       "originalDst": "10.0.1.10:8080", "actualDst": "10.0.1.10:8080",
                       "protocol": "HBONE"}], "outbound": []}},
        },
    })
}

fn run(kubeconfig: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
    Command::new(AMBIT)
        .arg("ztunnel-config")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run ambit ztunnel-config")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_ztunnels_through_the_pod_proxy() {
    let server = FakeApiServer::start().await.expect("fake server");
    for (name, node) in [("ztunnel-a", "n1"), ("ztunnel-b", "n2")] {
        server.apply(
            "/api/v1/pods",
            json!({"metadata": {"name": name, "namespace": "istio-system",
                                "labels": {"app": "ztunnel"}},
                   "spec": {"nodeName": node}}),
        );
        server.pod_proxy(
            "istio-system",
            name,
            15000,
            "config_dump",
            &dump().to_string(),
        );
        server.pod_proxy(
            "istio-system",
            name,
            15000,
            "logging",
            "current log level is info\n",
        );
    }
    server.apply(
        "/api/v1/pods",
        json!({"metadata": {"name": "web-1", "namespace": "demo", "labels": {"app": "web"}},
               "spec": {"nodeName": "n1"}}),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    // A KUBECONFIG list, merged: the context in one file, the cluster in the next, a
    // missing file skipped.
    let context = dir.path().join("context");
    std::fs::write(
        &context,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k}\n",
    )
    .expect("kubeconfig");
    let cluster = dir.path().join("cluster");
    std::fs::write(
        &cluster,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster: {{server: \"{}\"}}\nusers: []\n",
            server.url()
        ),
    )
    .expect("kubeconfig");
    let kubeconfig = std::env::join_paths([dir.path().join("missing"), context, cluster])
        .expect("KUBECONFIG list");

    // --node: the node's ztunnel; the whole dump as YAML is what istioctl's types read.
    let out = stdout(&run(
        &kubeconfig,
        &["all", "--kubernetes", "--node", "n1", "-o", "yaml"],
    ));
    let parsed = istioctl_types::parse_dump_yaml(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.workloads.len(), 2);
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path
                == "/api/v1/namespaces/istio-system/pods/ztunnel-a:15000/proxy/config_dump"),
        "read through the pod proxy"
    );
    let listed = server
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/namespaces/istio-system/pods")
        .expect("ztunnel pods listed");
    assert!(
        listed.query.contains("labelSelector=app%3Dztunnel")
            && listed.query.contains("fieldSelector=spec.nodeName%3Dn1"),
        "{}",
        listed.query
    );

    // POD.NAMESPACE, filtered to one namespace.
    let out = stdout(&run(
        &kubeconfig,
        &[
            "workloads",
            "ztunnel-b.istio-system",
            "--workload-namespace",
            "demo",
            "-o",
            "json",
        ],
    ));
    let v: Value = serde_json::from_str(&out).expect("json");
    let names: Vec<&str> = v
        .as_array()
        .expect("the section itself")
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    assert_eq!(names, ["web-1"]);

    // Every ztunnel, as a table with a ZTUNNEL column; --address picks one service.
    let table = stdout(&run(
        &kubeconfig,
        &["services", "--kubernetes", "--address", "10.96.0.10"],
    ));
    assert!(
        table.contains("ztunnel-a.istio-system") && table.contains("ztunnel-b.istio-system"),
        "{table}"
    );
    assert!(table.contains("10.96.0.10"), "{table}");

    // A node without a ztunnel is an error that says so.
    let missing = run(&kubeconfig, &["workloads", "--kubernetes", "--node", "n9"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no ztunnel pod"),
        "{missing:?}"
    );

    // --file: a saved dump, connections of one direction.
    let saved = dir.path().join("dump.json");
    std::fs::write(&saved, dump().to_string()).expect("write dump");
    let out = stdout(&run(
        &kubeconfig,
        &[
            "connections",
            "--file",
            saved.to_str().expect("utf-8"),
            "--direction",
            "outbound",
            "-o",
            "json",
        ],
    ));
    let v: Value = serde_json::from_str(&out).expect("json");
    assert!(v["u1"]["connections"].get("inbound").is_none(), "{v}");
    assert!(v["u1"]["connections"]["outbound"].is_array(), "{v}");
}

/// `ztunnel-config log`: POST `/logging` through the pod proxy, with istioctl's level names
/// translated to ztunnel's, answers under each ztunnel's name; bad levels are refused before
/// any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_levels_through_the_pod_proxy() {
    let server = FakeApiServer::start().await.expect("fake server");
    for (name, node) in [("ztunnel-a", "n1"), ("ztunnel-b", "n2")] {
        server.apply(
            "/api/v1/pods",
            json!({"metadata": {"name": name, "namespace": "istio-system",
                                "labels": {"app": "ztunnel"}},
                   "spec": {"nodeName": node}}),
        );
        server.pod_proxy(
            "istio-system",
            name,
            15000,
            "logging",
            "current log level is warn\n",
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster: {{server: \"{}\"}}\ncontexts:\n- name: c\n  context: {{cluster: k}}\nusers: []\n",
            server.url()
        ),
    )
    .expect("kubeconfig");
    let logging = |pod: &str| {
        server
            .requests()
            .into_iter()
            .filter(|r| {
                r.path == format!("/api/v1/namespaces/istio-system/pods/{pod}:15000/proxy/logging")
            })
            .map(|r| (r.method, r.query))
            .collect::<Vec<_>>()
    };

    // (arguments, query sent to ztunnel-a)
    let cases: [(&[&str], &str); 3] = [
        (&["log", "ztunnel-a"], ""),
        (
            &["log", "ztunnel-a", "--level", "access:warning,info"],
            "level=access%3Awarn%2Cinfo",
        ),
        (&["log", "ztunnel-a.istio-system", "-r"], "reset="),
    ];
    for (args, query) in cases {
        let out = stdout(&run(&kubeconfig, args));
        assert_eq!(
            out, "ztunnel-a.istio-system:\ncurrent log level is warn\n",
            "{args:?}"
        );
        let sent = logging("ztunnel-a");
        let last = sent.last().expect("a request");
        assert_eq!(last.0, "POST", "{args:?}");
        assert_eq!(last.1, query, "{args:?}");
    }

    // Every ztunnel of the cluster, each under its name.
    let out = stdout(&run(
        &kubeconfig,
        &["log", "--kubernetes", "--level", "debug"],
    ));
    assert_eq!(
        out,
        "ztunnel-a.istio-system:\ncurrent log level is warn\n\
         ztunnel-b.istio-system:\ncurrent log level is warn\n"
    );

    // Refused before any request: a level istioctl does not know, --level with --reset, and
    // --level outside the log view.
    let before = server.requests().len();
    let refused: [(&[&str], &str); 3] = [
        (
            &["log", "ztunnel-a", "--level", "loud"],
            "unrecognized logging level \"loud\"",
        ),
        (
            &["log", "ztunnel-a", "--level", "info", "-r"],
            "cannot be used with",
        ),
        (
            &["workloads", "ztunnel-a", "--level", "info"],
            "belong to the log view",
        ),
    ];
    for (args, says) in refused {
        let out = run(&kubeconfig, args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(server.requests().len(), before, "nothing was sent");
}
