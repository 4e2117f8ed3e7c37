//! `vm up`'s ztunnel environment: what the bundle becomes, and that ztunnel's own
//! configuration reader accepts it as a dedicated-mode workload.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

#[path = "support/bundle_dir.rs"]
mod bundle_dir;

use std::collections::BTreeMap;

use ambit_vm::Bundle;
use ambit_vm::up::{ControlPlane, ztunnel_env};

#[test]
fn bundle_becomes_a_dedicated_ztunnel() {
    let dir = tempfile::tempdir().unwrap();
    bundle_dir::write_bundle(dir.path(), "istiod.istio-system.svc:15012", "");
    let b = Bundle::load(dir.path()).unwrap();
    let cp = ControlPlane {
        addr: "127.0.0.1:15012".parse().unwrap(),
        hostname: Some("istiod.istio-system.svc".into()),
        local: Some("10.9.0.7".parse().unwrap()),
    };
    let env = ztunnel_env(&b, &cp);
    let map: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(map.len(), env.len(), "a variable set twice: {env:?}");
    let root = dir.path().join("root-cert.pem").display().to_string();
    let token = dir.path().join("istio-token").display().to_string();
    let want: &[(&str, &str)] = &[
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", "bar/foo/vm-sa"),
        ("CA_ADDRESS", "https://127.0.0.1:15012"),
        ("XDS_ADDRESS", "https://127.0.0.1:15012"),
        ("ALT_CA_HOSTNAME", "istiod.istio-system.svc"),
        ("ALT_XDS_HOSTNAME", "istiod.istio-system.svc"),
        ("CA_ROOT_CA", &root),
        ("XDS_ROOT_CA", &root),
        ("AUTH_TOKEN", &token),
        ("PACKET_MARK", "1337"),
        ("ENABLE_ORIG_SRC", "false"),
        ("TRUST_DOMAIN", "cluster.local"),
        ("CLUSTER_ID", "Kubernetes"),
        ("ISTIO_META_DNS_CAPTURE", "true"),
        // No ISTIO_SVC_IP: the address the VM reaches the control plane from.
        ("INSTANCE_IP", "10.9.0.7"),
        ("ISTIO_METAJSON_LABELS", r#"{"app":"foo"}"#),
    ];
    for (k, v) in want {
        assert_eq!(map.get(k), Some(v), "{k}");
    }

    let vars: Vec<(String, String)> = env.clone();
    let cfg = ambit_ztunnel::config::Config::from_vars(&vars, 2, &|p| p.exists())
        .unwrap_or_else(|e| panic!("ztunnel refuses vm up's environment: {e}"));
    assert_eq!(cfg.packet_mark, Some(1337));
    assert!(cfg.proxy_workload_info.is_some());
    // The labels reach ztunnel's xDS node metadata as a structured LABELS (auto-registration).
    assert_eq!(
        cfg.proxy_metadata_json.get("LABELS"),
        Some(&serde_json::json!({"app": "foo"}))
    );
}

#[test]
fn an_auto_registering_vm_is_its_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        (
            "declared address",
            "ISTIO_SVC_IP='10.1.0.5'\n",
            "bar/vm-10.1.0.5/vm-sa",
        ),
        ("the connection's address", "", "bar/vm-10.9.0.7/vm-sa"),
        (
            "network appended",
            // ISTIO_META_NETWORK is already in the bundle (empty): set it in place below.
            "ISTIO_SVC_IP='fd00::5'\n",
            "bar/vm-fd00--5-n1/vm-sa",
        ),
    ];
    for (what, extra, want) in cases {
        let extra = format!("ISTIO_META_AUTO_REGISTER_GROUP='vm'\n{extra}");
        bundle_dir::write_bundle(dir.path(), "istiod.istio-system.svc:15012", &extra);
        let network = if what.contains("network") { "n1" } else { "" };
        let env_file = dir.path().join("cluster.env");
        let text = std::fs::read_to_string(&env_file).unwrap().replace(
            "ISTIO_META_NETWORK=''",
            &format!("ISTIO_META_NETWORK='{network}'"),
        );
        std::fs::write(&env_file, text).unwrap();
        let b = Bundle::load(dir.path()).unwrap();
        let cp = ControlPlane {
            addr: "127.0.0.1:15012".parse().unwrap(),
            hostname: None,
            local: Some("10.9.0.7".parse().unwrap()),
        };
        let env = ztunnel_env(&b, &cp);
        let info = env
            .iter()
            .find(|(k, _)| k == "PROXY_WORKLOAD_INFO")
            .unwrap();
        assert_eq!(info.1, *want, "{what}");
    }
}
