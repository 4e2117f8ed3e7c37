//! `deploy/kubernetes/` and `deploy/helm/`: valid against the Kubernetes schemas (offline,
//! with `kubernetes-validate --strict` from PyPI; `scripts/test` installs the pinned version
//! into a venv and exports `AMBIT_KUBERNETES_VALIDATE`), and the properties the issue and
//! upstream's charts require, checked on the parsed objects: DaemonSets on Linux nodes,
//! system-node-critical, upstream's capabilities, ztunnel's istio-ca projected token, the
//! monitoring objects pointing at ports that exist, the unprotected-pods alert, overlays that
//! only swap images.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy().join("kubernetes"))
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "manifests missing: {files:?}");
    files
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read manifest");
    serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn all_objects() -> Vec<Value> {
    manifest_files().iter().flat_map(|f| documents(f)).collect()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} missing"))
}

/// The CRD kinds kubernetes-validate has no schema for; checked by hand below.
const MONITORING_KINDS: [&str; 3] = ["PodMonitor", "ServiceMonitor", "PrometheusRule"];

#[test]
fn manifests_pass_the_kubernetes_schemas() {
    let tool = std::env::var_os("AMBIT_KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .filter(|p| p.exists());
    let Some(tool) = tool else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: kubernetes-validate is missing (scripts/test installs it; set \
             AMBIT_KUBERNETES_VALIDATE)"
        );
        eprintln!("skipped: AMBIT_KUBERNETES_VALIDATE not set (run scripts/test)");
        return;
    };
    let out = Command::new(&tool)
        .arg("--strict")
        .args(manifest_files())
        .output()
        .expect("run kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate failed:\n{text}");
    for line in text.lines() {
        if line.starts_with("WARN") {
            assert!(
                MONITORING_KINDS.iter().any(|k| line.contains(&format!(
                    "kind {k} with api version monitoring.coreos.com/v1"
                ))),
                "unexpected warning: {line}"
            );
        }
        assert!(!line.starts_with("ERROR"), "{line}");
    }
    let passed = text.lines().filter(|l| l.contains(" passed for ")).count();
    let objects = all_objects();
    let schema_checked = objects
        .iter()
        .filter(|o| !MONITORING_KINDS.iter().any(|k| o["kind"] == *k))
        .count();
    assert_eq!(
        passed, schema_checked,
        "every built-in object validated:\n{text}"
    );
}

fn pod_spec(o: &Value) -> &Value {
    &o["spec"]["template"]["spec"]
}

fn capabilities(o: &Value) -> Vec<String> {
    let c = &pod_spec(o)["containers"][0]["securityContext"]["capabilities"];
    assert_eq!(c["drop"], serde_json::json!(["ALL"]));
    let mut add: Vec<String> = c["add"]
        .as_array()
        .expect("capabilities.add")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    add.sort();
    add
}

#[test]
fn daemonsets_match_upstream_charts() {
    let objects = all_objects();
    let cni = object(&objects, "DaemonSet", "istio-cni-node");
    let ztunnel = object(&objects, "DaemonSet", "ztunnel");
    for ds in [cni, ztunnel] {
        let spec = pod_spec(ds);
        assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux");
        assert_eq!(spec["priorityClassName"], "system-node-critical");
    }
    // Upstream's charts (manifests/charts/istio-cni, manifests/charts/ztunnel).
    assert_eq!(
        capabilities(cni),
        [
            "DAC_OVERRIDE",
            "NET_ADMIN",
            "NET_RAW",
            "SYS_ADMIN",
            "SYS_PTRACE"
        ]
    );
    assert_eq!(capabilities(ztunnel), ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"]);
    assert_eq!(pod_spec(cni)["containers"][0]["command"][0], "install-cni");
    assert_eq!(
        pod_spec(ztunnel)["containers"][0]["args"],
        serde_json::json!(["proxy", "ztunnel"])
    );
    let token = pod_spec(ztunnel)["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "istio-token")
        .expect("istio-token volume");
    let sa = &token["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(sa["audience"], "istio-ca");
    assert_eq!(sa["path"], "istio-token");
    // The agent's readiness and the chart's mounts.
    let agent = &pod_spec(cni)["containers"][0];
    assert_eq!(agent["readinessProbe"]["httpGet"]["path"], "/readyz");
    let mounts: Vec<&str> = agent["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    for want in [
        "/host/opt/cni/bin",
        "/host/etc/cni/net.d",
        "/host/proc",
        "/host/var/run/netns",
        "/var/run/istio-cni",
        "/var/run/ztunnel",
    ] {
        assert!(mounts.contains(&want), "{want} not mounted: {mounts:?}");
    }
}

/// Named container ports of the pods a selector's labels pick.
fn ports_of_pods_with(objects: &[Value], key: &str, values: &[&str]) -> Vec<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet" || o["kind"] == "Deployment")
        .filter(|o| {
            let labels = &o["spec"]["template"]["metadata"]["labels"];
            values.iter().any(|v| labels[key] == *v)
        })
        .flat_map(|o| {
            pod_spec(o)["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn monitoring_objects_point_at_real_ports_and_alert_on_unprotected_pods() {
    let objects = all_objects();
    let pm = object(&objects, "PodMonitor", "ambit-node");
    let expr = &pm["spec"]["selector"]["matchExpressions"][0];
    let values: Vec<&str> = expr["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let ports = ports_of_pods_with(&objects, expr["key"].as_str().expect("key"), &values);
    for ep in pm["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("endpoints")
    {
        let port = ep["port"].as_str().expect("port");
        assert!(ports.iter().any(|p| p == port), "{port} not in {ports:?}");
    }
    let sm = object(&objects, "ServiceMonitor", "ambit-control");
    let svc = object(&objects, "Service", "ambit-control");
    for (k, v) in sm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(
            &svc["metadata"]["labels"][k], v,
            "ServiceMonitor selects the Service"
        );
    }
    let port = sm["spec"]["endpoints"][0]["port"].as_str().expect("port");
    assert!(
        svc["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .any(|p| p["name"] == port)
    );
    let rule = object(&objects, "PrometheusRule", "ambit");
    let alerts: Vec<Value> = rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    let unprotected = alerts
        .iter()
        .find(|a| a["alert"] == "AmbitEnrolledPodUnprotected")
        .expect("the unprotected-pods alert");
    let expr = unprotected["expr"].as_str().expect("expr");
    assert!(
        expr.contains("ambit_enrolled_unprotected_pods") && expr.trim_end().ends_with("> 0"),
        "{expr}"
    );
}

#[test]
fn helm_overlays_swap_only_images() {
    for file in ["ztunnel-values.yaml", "cni-values.yaml"] {
        let docs = documents(&deploy().join("helm").join(file));
        assert_eq!(docs.len(), 1, "{file}");
        let keys: Vec<&String> = docs[0].as_object().expect("a map").keys().collect();
        assert_eq!(keys, ["image"], "{file} sets only the image");
        let image = docs[0]["image"].as_str().expect("image");
        // The charts use an image value containing '/' as the whole reference.
        assert!(image.contains('/'), "{file}: {image}");
    }
}
