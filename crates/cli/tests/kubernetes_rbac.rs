//! Least privilege, checked: the RBAC in `deploy/kubernetes/20-rbac.yaml` against the requests
//! ambit's own Kubernetes code makes. Each role's code runs against its own fake API server
//! (the agent's pod source and annotation patch, its DaemonSet/node lookup; the control plane's
//! object source and TokenReview); every recorded request must be allowed by the role's rules,
//! and every rule (API group, resource, verb) must be used by some request. No root needed.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ambit_agent::pods::PodSource;
use ambit_agent::pods::kube::KubePodSource;
use ambit_agent::pods::kube_daemonset::KubeDaemonSetLookup;
use ambit_control::kube_auth::{PodIndex, TokenReviewAuthorizer};
use ambit_control::kube_source::KubeSource;
use ambit_control::translate::ClusterConfig;
use ambit_kubeapi::Client;
use ambit_kubeapi::testing::{FakeApiServer, RecordedRequest, TokenIdentity};
use ambit_testkit::eventually;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(10);

/// One RBAC rule.
#[derive(Debug, Clone)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    names: Vec<String>,
    verbs: Vec<String>,
    /// `None` for a ClusterRole.
    namespace: Option<String>,
}

/// What a request needs: (group, resource[/subresource], verb, namespace, name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    group: String,
    resource: String,
    verb: String,
    namespace: Option<String>,
    name: Option<String>,
}

fn manifests() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/20-rbac.yaml");
    let text = std::fs::read_to_string(&path).expect("read RBAC manifest");
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("YAML document");
        if !v.is_null() {
            docs.push(v);
        }
    }
    docs
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The rules bound to service account `istio-system/SA` (ClusterRoleBindings and
/// RoleBindings).
fn rules_of(sa: &str) -> Vec<Rule> {
    let docs = manifests();
    let mut out = Vec::new();
    for binding in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
    {
        let bound = binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == "istio-system"
            });
        if !bound {
            continue;
        }
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = &binding["roleRef"]["name"];
        let namespace = (role_kind == "Role").then(|| {
            binding["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
        let role = docs
            .iter()
            .find(|d| {
                d["kind"] == role_kind
                    && d["metadata"]["name"] == *role_name
                    && (role_kind == "ClusterRole"
                        || d["metadata"]["namespace"].as_str() == namespace.as_deref())
            })
            .unwrap_or_else(|| panic!("{role_kind} {role_name} bound to {sa} is missing"));
        for r in role["rules"].as_array().into_iter().flatten() {
            out.push(Rule {
                groups: strings(&r["apiGroups"]),
                resources: strings(&r["resources"]),
                names: strings(&r["resourceNames"]),
                verbs: strings(&r["verbs"]),
                namespace: namespace.clone(),
            });
        }
    }
    assert!(!out.is_empty(), "no rules bound to {sa}");
    out
}

/// The access a recorded request needs.
fn access(r: &RecordedRequest) -> Access {
    let (group, rest) = if let Some(rest) = r.path.strip_prefix("/api/v1/") {
        (String::new(), rest.to_string())
    } else {
        let rest = r.path.strip_prefix("/apis/").expect("API path");
        let mut parts = rest.splitn(3, '/');
        let group = parts.next().unwrap_or_default().to_string();
        let _version = parts.next();
        (group, parts.next().unwrap_or_default().to_string())
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let (namespace, parts) = match parts.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail.to_vec()),
        other => (None, other.to_vec()),
    };
    let resource = match parts.as_slice() {
        [res, _, sub] => format!("{res}/{sub}"),
        [res, ..] => res.to_string(),
        [] => panic!("no resource in {}", r.path),
    };
    let name = parts.get(1).map(|n| n.to_string());
    let watch = r.query.split('&').any(|kv| kv == "watch=true");
    let verb = match (r.method.as_str(), &name, watch) {
        ("GET", _, true) => "watch",
        ("GET", None, false) => "list",
        ("GET", Some(_), false) => "get",
        ("PATCH", _, _) => "patch",
        ("POST", _, _) => "create",
        (m, _, _) => panic!("unexpected method {m}"),
    };
    // A create names no object; the namespace list is cluster-scoped.
    let name = if verb == "create" { None } else { name };
    Access {
        group,
        resource,
        verb: verb.to_string(),
        namespace,
        name,
    }
}

fn allows(rule: &Rule, a: &Access) -> bool {
    rule.groups.contains(&a.group)
        && rule.resources.contains(&a.resource)
        && rule.verbs.contains(&a.verb)
        && (rule.names.is_empty() || a.name.as_ref().is_some_and(|n| rule.names.contains(n)))
        && (rule.namespace.is_none() || rule.namespace == a.namespace)
}

/// Every request allowed; every (group, resource, verb) of every rule used.
fn check(sa: &str, requests: &[RecordedRequest]) {
    let rules = rules_of(sa);
    let accesses: BTreeSet<Access> = requests.iter().map(access).collect();
    for a in &accesses {
        assert!(
            rules.iter().any(|r| allows(r, a)),
            "{sa}: no RBAC rule allows {a:?}"
        );
    }
    for r in &rules {
        for group in &r.groups {
            for resource in &r.resources {
                for verb in &r.verbs {
                    let used = accesses.iter().any(|a| {
                        a.group == *group
                            && a.resource == *resource
                            && a.verb == *verb
                            && allows(r, a)
                    });
                    assert!(
                        used,
                        "{sa}: the rule {group:?}/{resource} {verb} is never used (least privilege)"
                    );
                }
            }
        }
    }
}

fn watched(server: &FakeApiServer, path: &str) -> bool {
    server
        .requests()
        .iter()
        .any(|r| r.path == path && r.query.contains("watch=true"))
}

#[tokio::test]
async fn cni_agent_rbac_is_exactly_what_it_calls() {
    let server = FakeApiServer::start().await.expect("fake server");
    server.apply(
        "/api/v1/namespaces",
        json!({"metadata": {"name": "demo", "labels": {"istio.io/dataplane-mode": "ambient"}}}),
    );
    server.apply(
        "/api/v1/pods",
        json!({"metadata": {"name": "p1", "namespace": "demo"}, "spec": {"nodeName": "n1"}}),
    );
    server.apply(
        "/api/v1/nodes",
        json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/os": "linux"}}}),
    );
    // As deploy/kubernetes: the node selector makes the agent read its node at shutdown.
    server.apply(
        "/apis/apps/v1/daemonsets",
        json!({"metadata": {"name": "istio-cni-node", "namespace": "istio-system"},
               "spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}}}}}),
    );
    let client = Client::new(server.config()).expect("client");
    let source = KubePodSource::new(client.clone(), "n1");
    let mut events = source.watch();
    tokio::time::timeout(DEADLINE, async {
        while let Some(ev) = events.recv().await {
            if matches!(ev, ambit_agent::pods::PodEvent::Synced) {
                break;
            }
        }
    })
    .await
    .expect("synced");
    eventually("both watches open", DEADLINE, || {
        watched(&server, "/api/v1/pods") && watched(&server, "/api/v1/namespaces")
    })
    .await;
    source
        .annotate("demo", "p1", Some("enabled"))
        .await
        .expect("annotated");
    KubeDaemonSetLookup::new(client, "istio-system", "n1")
        .lookup_once()
        .await
        .expect("DaemonSet looked up");
    check("istio-cni", &server.requests());
}

#[tokio::test]
async fn control_plane_rbac_is_exactly_what_it_calls() {
    let server = FakeApiServer::start().await.expect("fake server");
    server.apply(
        "/api/v1/pods",
        json!({"metadata": {"name": "zt-1", "namespace": "istio-system", "uid": "u1"},
               "spec": {"nodeName": "n1", "serviceAccountName": "ztunnel"},
               "status": {"podIP": "10.0.0.9"}}),
    );
    server.add_token(
        "t",
        TokenIdentity::pod_bound(
            "istio-system",
            "ztunnel",
            ("zt-1", "u1"),
            "n1",
            &["istio-ca"],
        ),
    );
    server.add_collection("/api/v1/configmaps", "ConfigMap", "v1", true);
    let client = Client::new(server.config()).expect("client");
    let mesh = ambit_control::mesh_config::watch::MeshWatch::start(
        ambit_control::mesh_config::watch::MeshSource::ConfigMap {
            namespace: "istio-system".into(),
            name: "istio".into(),
        },
        ClusterConfig::default(),
        Some(client.clone()),
        Default::default(),
    )
    .await
    .expect("mesh config listed");
    let configmaps = "/api/v1/namespaces/istio-system/configmaps";
    eventually(configmaps, DEADLINE, || watched(&server, configmaps)).await;
    drop(mesh);
    let watch = KubeSource::new(client.clone(), ClusterConfig::default())
        .watch()
        .await
        .expect("listed");
    for path in ambit_control::kube_source::RESOURCES.map(|(_, p, _)| p) {
        eventually(path, DEADLINE, || watched(&server, path)).await;
    }
    let mut pods = PodIndex::new();
    pods.insert(
        ("istio-system".into(), "zt-1".into()),
        ambit_control::kube_auth::PodPlacement {
            uid: "u1".into(),
            node: "n1".into(),
            service_account: "ztunnel".into(),
        },
    );
    let auth = TokenReviewAuthorizer::new(
        client,
        "cluster.local",
        vec![("istio-system".into(), "ztunnel".into())],
        Arc::new(RwLock::new(pods)),
        |_, _| false,
    );
    auth.caller("t").await.expect("reviewed");
    drop(watch);
    check("ambit-control", &server.requests());
}
