//! `ambit vm configure`: the bundle written for a WorkloadGroup reads back with
//! [`Bundle::load`] as the same workload, for a table of groups.

// Unix only: ambit-vm (the VM's host rules) is built on Unix only.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

use ambit_redirect::vm::InboundCapture;
use ambit_vm::Bundle;
use ambit_vm::configure::{Options, parse_group, render};

fn options() -> Options {
    Options {
        ca_address: "istiod.istio-system.svc:15012".into(),
        ingress_ip: Some("10.10.10.11".parse().unwrap()),
        internal_ip: None,
        cluster_id: "Kubernetes".into(),
        trust_domain: String::new(),
        capture_dns: true,
        auto_register: false,
        root_cert_pem: ambit_tls::LocalCa::generate("cluster.local")
            .unwrap()
            .root_pem()
            .to_owned(),
        token: "vm-token-0123456789".into(),
        proxy_metadata: Default::default(),
    }
}

#[test]
fn configured_bundles_read_back() {
    type Check = fn(&Bundle);
    type Edit = fn(&mut Options);
    let cases: &[(&str, &str, Edit, Check)] = &[
        (
            "istioctl's example group",
            "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {name: foo, namespace: bar}\nspec:\n  metadata: {labels: {}}\n  template: {serviceAccount: vm-serviceaccount, ports: {}}\n",
            |_| {},
            |b| {
                assert_eq!(
                    b.identity.spiffe_id(),
                    "spiffe://cluster.local/ns/bar/sa/vm-serviceaccount"
                );
                assert_eq!(b.workload_name, "foo");
                assert_eq!(b.canonical_service.as_deref(), Some("foo"));
                assert_eq!(b.canonical_revision.as_deref(), Some("latest"));
                assert_eq!(b.ca_address, "istiod.istio-system.svc:15012");
                assert_eq!(
                    b.host_address("istiod.istio-system.svc"),
                    Some("10.10.10.11".parse().unwrap())
                );
                let r = b.redirect.as_ref().unwrap();
                assert!(r.dns_capture);
                assert_eq!(
                    r.inbound,
                    InboundCapture::All {
                        except: vec![22, 15090, 15021, 15020]
                    }
                );
                assert!(b.warnings.is_empty(), "{:?}", b.warnings);
            },
        ),
        (
            "ports, labels, network, no DNS capture, auto-registration, an address",
            "kind: WorkloadGroup\nmetadata: {name: db, namespace: data}\nspec:\n  metadata: {labels: {app: postgres, version: v2}}\n  template:\n    serviceAccount: db\n    network: vm-net\n    ports: {tcp: 5432, metrics: 9187}\n",
            |o| {
                o.capture_dns = false;
                o.auto_register = true;
                o.internal_ip = Some("192.168.1.20".parse().unwrap());
                o.trust_domain = "example.org".into();
            },
            |b| {
                assert_eq!(b.identity.spiffe_id(), "spiffe://example.org/ns/data/sa/db");
                assert_eq!(b.labels["app"], "postgres");
                assert_eq!(b.labels["service.istio.io/canonical-name"], "postgres");
                assert_eq!(b.canonical_revision.as_deref(), Some("v2"));
                assert_eq!(b.network, "vm-net");
                assert_eq!(b.auto_register_group.as_deref(), Some("db"));
                assert_eq!(b.instance_ip, Some("192.168.1.20".parse().unwrap()));
                let r = b.redirect.as_ref().unwrap();
                assert!(!r.dns_capture);
                assert_eq!(r.inbound, InboundCapture::Ports(vec![5432, 9187]));
                assert!(b.metadata.contains_key("ISTIO_META_POD_PORTS"));
            },
        ),
        (
            "an address as control plane writes no hosts line; a quote in a label",
            "kind: WorkloadGroup\nmetadata: {name: q}\nspec:\n  metadata: {labels: {note: \"it's\"}}\n",
            |o| o.ca_address = "10.0.0.1:15012".into(),
            |b| {
                assert!(b.hosts.is_empty());
                assert_eq!(b.identity.namespace, "default");
                assert_eq!(b.identity.service_account, "default");
                assert_eq!(b.labels["note"], "it's");
            },
        ),
        (
            "the mesh config's proxyMetadata fills what is not generated; generated keys win",
            "kind: WorkloadGroup\nmetadata: {name: m, namespace: n}\nspec:\n  template: {serviceAccount: sa}\n",
            |o| {
                o.capture_dns = false;
                o.proxy_metadata = [
                    ("ISTIO_META_DNS_CAPTURE", "true"),
                    ("SERVICE_ACCOUNT", "impostor"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            },
            |b| {
                assert!(
                    b.redirect.as_ref().unwrap().dns_capture,
                    "ISTIO_META_DNS_CAPTURE from the mesh config"
                );
                assert_eq!(b.identity.service_account, "sa");
            },
        ),
    ];
    for (name, yaml, edit, check) in cases {
        let g = parse_group("group.yaml", yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut o = options();
        edit(&mut o);
        let dir = tempfile::tempdir().unwrap();
        render(&g, &o).write(dir.path()).unwrap();
        let b = Bundle::load(dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
        check(&b);
    }
}

#[test]
fn not_a_workload_group_is_refused_naming_the_file() {
    for yaml in [
        "kind: Pod\nmetadata: {name: x}\n",
        "kind: WorkloadGroup\nspec: {}\n",
        "[",
        "",
    ] {
        let e = parse_group("wg.yaml", yaml).unwrap_err().to_string();
        assert!(
            e.starts_with("wg.yaml: not a WorkloadGroup"),
            "{yaml:?}: {e}"
        );
    }
}
