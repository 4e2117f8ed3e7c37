//! Pod and Service translation rules (`spec/ztunnel.md` §4.2), one table row per rule.

use ambit_control::objects::{ObjectSet, load_documents};
use ambit_control::translate::{Cluster, ClusterConfig, Translation};
use ambit_model::workload::Workload;

fn translate_with(config: ClusterConfig, yaml: &str) -> Translation {
    let objects = load_documents("test.yaml", yaml).expect("test YAML loads");
    let set = ObjectSet::from_objects(objects).expect("no duplicates");
    Cluster::new(config, set).translate()
}

fn translate(yaml: &str) -> Translation {
    translate_with(ClusterConfig::default(), yaml)
}

/// A pod `p` in namespace `ns` with the given metadata extras (labels, annotations, …) and
/// container ports, plus whatever documents follow.
fn pod(meta: &str, rest: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: ns{meta}}}\n\
         spec:\n  serviceAccountName: sa\n  nodeName: node1\n  containers:\n  - name: app\n    \
         ports: [{{name: http, containerPort: 8080}}, {{name: dns, containerPort: 5353, protocol: UDP}}]\n\
         status: {{podIP: 10.0.0.1}}\n{rest}"
    )
}

fn svc(name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec: {spec}\n"
    )
}

type Field = fn(&Workload) -> String;

#[test]
fn pod_rules() {
    let cases: &[(&str, String, Field, &str)] = &[
        ("uid", pod("", ""), |w| w.uid.to_string(), "Kubernetes//v1/Pod/ns/p"),
        ("name", pod("", ""), |w| w.name.clone(), "p"),
        ("namespace", pod("", ""), |w| w.namespace().to_string(), "ns"),
        ("identity from trust domain and service account", pod("", ""),
            |w| w.identity.to_string(), "spiffe://cluster.local/ns/ns/sa/sa"),
        ("addresses = pod IPs", pod("", ""), |w| format!("{:?}", w.addresses), "[10.0.0.1]"),
        ("node", pod("", ""), |w| w.node.clone(), "node1"),
        ("cluster id", pod("", ""), |w| w.cluster_id.clone(), "Kubernetes"),
        ("canonical name: service.istio.io label first",
            pod(", labels: {service.istio.io/canonical-name: a, app.kubernetes.io/name: b, app: c}", ""),
            |w| w.canonical_name.clone(), "a"),
        ("canonical name: app.kubernetes.io/name second",
            pod(", labels: {app.kubernetes.io/name: b, app: c}", ""), |w| w.canonical_name.clone(), "b"),
        ("canonical name: app third", pod(", labels: {app: c}", ""), |w| w.canonical_name.clone(), "c"),
        ("canonical name: else workload name", pod("", ""), |w| w.canonical_name.clone(), "p"),
        ("canonical revision: service.istio.io label first",
            pod(", labels: {service.istio.io/canonical-revision: r1, app.kubernetes.io/version: r2, version: r3}", ""),
            |w| w.canonical_revision.clone(), "r1"),
        ("canonical revision: app.kubernetes.io/version second",
            pod(", labels: {app.kubernetes.io/version: r2, version: r3}", ""),
            |w| w.canonical_revision.clone(), "r2"),
        ("canonical revision: version third", pod(", labels: {version: r3}", ""),
            |w| w.canonical_revision.clone(), "r3"),
        ("canonical revision: else latest", pod("", ""), |w| w.canonical_revision.clone(), "latest"),
        ("workload: plain pod", pod("", ""),
            |w| format!("{} {:?}", w.workload_name, w.workload_type), "p Pod"),
        ("workload: ReplicaSet hash heuristic on the name",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: reviews-v1-7d9f8c6b5d-x2k4q, namespace: ns, labels: {pod-template-hash: 7d9f8c6b5d}}\n".to_string(),
            |w| format!("{} {:?}", w.workload_name, w.workload_type), "reviews-v1 Deployment"),
        ("workload: hash label but name without it",
            pod(", labels: {pod-template-hash: abc}", ""),
            |w| format!("{} {:?}", w.workload_name, w.workload_type), "p Pod"),
        ("workload: ReplicaSet owner",
            pod(", labels: {pod-template-hash: abc}, ownerReferences: [{kind: ReplicaSet, name: web-abc, controller: true}]", ""),
            |w| format!("{} {:?}", w.workload_name, w.workload_type), "web Deployment"),
        ("workload: Job owner",
            pod(", ownerReferences: [{kind: Job, name: backup, controller: true}]", ""),
            |w| format!("{} {:?}", w.workload_name, w.workload_type), "backup Job"),
        ("workload: CronJob through its Job",
            pod(", ownerReferences: [{kind: Job, name: nightly-28456789, controller: true}]", ""),
            |w| format!("{} {:?}", w.workload_name, w.workload_type), "nightly CronJob"),
        ("canonical name falls back to the workload name",
            pod(", ownerReferences: [{kind: Job, name: backup, controller: true}]", ""),
            |w| w.canonical_name.clone(), "backup"),
        ("no redirection annotation: plain TCP", pod("", ""), |w| format!("{:?}", w.protocol), "None"),
        ("redirection enabled: HBONE",
            pod(", annotations: {ambient.istio.io/redirection: enabled}", ""),
            |w| format!("{:?}", w.protocol), "Hbone"),
        ("redirection disabled: plain TCP",
            pod(", annotations: {ambient.istio.io/redirection: disabled}", ""),
            |w| format!("{:?}", w.protocol), "None"),
        ("enrolment label alone is not capture",
            pod(", labels: {istio.io/dataplane-mode: ambient}", ""),
            |w| format!("{:?}", w.protocol), "None"),
        ("host network",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nspec: {hostNetwork: true}\n".to_string(),
            |w| format!("{:?}", w.network_mode), "HostNetwork"),
        ("not ready: unhealthy",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nstatus: {conditions: [{type: Ready, status: 'False'}]}\n".to_string(),
            |w| format!("{:?}", w.status), "Unhealthy"),
        ("no status: healthy", pod("", ""), |w| format!("{:?}", w.status), "Healthy"),
        ("dual stack addresses",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nstatus: {podIP: 10.0.0.1, podIPs: [{ip: 10.0.0.1}, {ip: 'fd00::1'}]}\n".to_string(),
            |w| format!("{:?}", w.addresses), "[10.0.0.1, fd00::1]"),
        ("no IP yet: still a workload, no addresses",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\n".to_string(),
            |w| format!("{:?} {}", w.addresses, w.service_account()), "[] default"),
        ("service selected by labels, numeric target port",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: a}, ports: [{port: 80, targetPort: 8080}]}")),
            |w| format!("{:?}", w.services), "{NamespacedHostname { namespace: \"ns\", hostname: \"s.ns.svc.cluster.local\" }: {80: 8080}}"),
        ("service target port defaults to the port",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: a}, ports: [{port: 80}]}")),
            |w| format!("{:?}", w.services.values().collect::<Vec<_>>()), "[{80: 80}]"),
        ("named target port resolved through container ports",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: a}, ports: [{port: 80, targetPort: http}]}")),
            |w| format!("{:?}", w.services.values().collect::<Vec<_>>()), "[{80: 8080}]"),
        ("named target port not on the pod: port skipped",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: a}, ports: [{port: 80, targetPort: grpc}, {port: 81, targetPort: 8081}]}")),
            |w| format!("{:?}", w.services.values().collect::<Vec<_>>()), "[{81: 8081}]"),
        ("named target port must be TCP",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: a}, ports: [{port: 53, targetPort: dns}]}")),
            |w| format!("{:?}", w.services.values().collect::<Vec<_>>()), "[{}]"),
        ("UDP service ports are not translated",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: a}, ports: [{port: 53, protocol: UDP}, {port: 53, targetPort: 5300}]}")),
            |w| format!("{:?}", w.services.values().collect::<Vec<_>>()), "[{53: 5300}]"),
        ("selector not matching",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: b}, ports: [{port: 80}]}")),
            |w| format!("{:?}", w.services), "{}"),
        ("selector must match every label",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: a, tier: web}, ports: [{port: 80}]}")),
            |w| format!("{:?}", w.services), "{}"),
        ("service without selector selects nothing",
            pod(", labels: {app: a}", &svc("s", "{ports: [{port: 80}]}")),
            |w| format!("{:?}", w.services), "{}"),
        ("service in another namespace",
            pod(", labels: {app: a}", "---\napiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: other}\nspec: {selector: {app: a}, ports: [{port: 80}]}\n"),
            |w| format!("{:?}", w.services), "{}"),
        ("headless services still list endpoints",
            pod(", labels: {app: a}", &svc("s", "{clusterIP: None, selector: {app: a}, ports: [{port: 80}]}")),
            |w| format!("{:?}", w.services.values().collect::<Vec<_>>()), "[{80: 80}]"),
        ("several services, sorted by key",
            pod(", labels: {app: a}", &(svc("z", "{selector: {app: a}, ports: [{port: 1}]}") + &svc("b", "{selector: {app: a}, ports: [{port: 2}]}"))),
            |w| w.services.keys().map(ToString::to_string).collect::<Vec<_>>().join(","),
            "ns/b.ns.svc.cluster.local,ns/z.ns.svc.cluster.local"),
    ];
    for (case, yaml, field, expected) in cases {
        let t = translate(yaml);
        let w = t
            .workloads
            .iter()
            .find(|w| w.namespace() == "ns")
            .unwrap_or_else(|| panic!("{case}: no workload in {t:?}"));
        assert_eq!(field(w), *expected, "{case}");
    }
}

#[test]
fn pod_warnings_and_skips() {
    let cases: &[(&str, String, usize, &[&str])] = &[
        ("finished pod is no workload",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nstatus: {phase: Succeeded}\n".into(), 0, &[]),
        ("failed pod is no workload",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nstatus: {phase: Failed}\n".into(), 0, &[]),
        ("unresolvable named port warns, naming service, port and pod",
            pod(", labels: {app: a}", &svc("s", "{selector: {app: a}, ports: [{port: 80, targetPort: grpc}]}")), 1,
            &["Service ns/s port 80", "\"grpc\"", "Pod ns/p"]),
    ];
    for (case, yaml, workloads, warning_parts) in cases {
        let t = translate(yaml);
        assert_eq!(t.workloads.len(), *workloads, "{case}");
        if warning_parts.is_empty() {
            assert!(t.warnings.is_empty(), "{case}: {:?}", t.warnings);
        } else {
            assert_eq!(t.warnings.len(), 1, "{case}: {:?}", t.warnings);
            for part in *warning_parts {
                assert!(
                    t.warnings[0].contains(part),
                    "{case}: {part:?} not in {:?}",
                    t.warnings[0]
                );
            }
        }
    }
}

#[test]
fn cluster_settings() {
    let config = ClusterConfig {
        cluster_domain: "example.org".into(),
        trust_domain: "td.example".into(),
        root_namespace: "mesh-root".into(),
        cluster_id: "c1".into(),
    };
    let t = translate_with(
        config,
        &pod(
            ", labels: {app: a}",
            &svc("s", "{selector: {app: a}, ports: [{port: 80}]}"),
        ),
    );
    let w = &t.workloads[0];
    assert_eq!(w.uid.as_str(), "c1//v1/Pod/ns/p");
    assert_eq!(w.cluster_id, "c1");
    assert_eq!(w.identity.to_string(), "spiffe://td.example/ns/ns/sa/sa");
    assert_eq!(t.services[0].key.to_string(), "ns/s.ns.svc.example.org");
    assert_eq!(
        w.services.keys().next().map(ToString::to_string).as_deref(),
        Some("ns/s.ns.svc.example.org")
    );
}

type ServiceField = fn(&ambit_model::Service) -> String;

#[test]
fn service_rules() {
    let cases: &[(&str, &str, ServiceField, &str)] = &[
        (
            "name and key",
            "{clusterIP: 10.96.0.1}",
            |s| format!("{} {}", s.name, s.key),
            "s ns/s.ns.svc.cluster.local",
        ),
        (
            "hostname",
            "{clusterIP: 10.96.0.1}",
            |s| s.hostname().to_string(),
            "s.ns.svc.cluster.local",
        ),
        (
            "VIP on the default network",
            "{clusterIP: 10.96.0.1}",
            |s| {
                s.vips
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            },
            "/10.96.0.1",
        ),
        (
            "dual stack VIPs",
            "{clusterIP: 10.96.0.1, clusterIPs: [10.96.0.1, 'fd00::10']}",
            |s| {
                s.vips
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            },
            "/10.96.0.1,/fd00::10",
        ),
        (
            "headless: no VIPs",
            "{clusterIP: None, ports: [{port: 80}]}",
            |s| format!("{:?}", s.vips),
            "[]",
        ),
        (
            "unassigned: no VIPs",
            "{ports: [{port: 80}]}",
            |s| format!("{:?}", s.vips),
            "[]",
        ),
        (
            "ports: numeric, default and named (0)",
            "{ports: [{port: 80, targetPort: 8080}, {port: 81}, {port: 82, targetPort: http}]}",
            |s| format!("{:?}", s.ports),
            "{80: 8080, 81: 81, 82: 0}",
        ),
        (
            "UDP ports left out",
            "{ports: [{port: 53, protocol: UDP}]}",
            |s| format!("{:?}", s.ports),
            "{}",
        ),
        (
            "no subject alt names",
            "{clusterIP: 10.96.0.1}",
            |s| format!("{:?}", s.subject_alt_names),
            "[]",
        ),
        (
            "app protocol",
            "{ports: [{port: 80, appProtocol: http}, {port: 90, appProtocol: kubernetes.io/h2c}]}",
            |s| format!("{:?}", s.app_protocols),
            "{80: Http11, 90: Http2}",
        ),
        (
            "no endpoints on the service itself",
            "{selector: {app: a}}",
            |s| format!("{:?}", s.endpoints),
            "{}",
        ),
    ];
    for (case, spec, field, expected) in cases {
        let t = translate(&svc("s", spec));
        assert_eq!(t.services.len(), 1, "{case}");
        assert_eq!(field(&t.services[0]), *expected, "{case}");
    }
}

#[test]
fn output_is_sorted_and_round_trips_to_protobuf() {
    let yaml = [
        "apiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: ns, labels: {app: a}}\nstatus: {podIP: 10.0.0.2}\n",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: ns, labels: {app: a}}\nstatus: {podIP: 10.0.0.1}\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: z, namespace: ns}\nspec: {clusterIP: 10.96.0.2, selector: {app: a}, ports: [{port: 80}]}\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: y, namespace: ns}\nspec: {clusterIP: 10.96.0.1, selector: {app: a}, ports: [{port: 80}]}\n",
    ]
    .join("---\n");
    let t = translate(&yaml);
    let uids: Vec<_> = t.workloads.iter().map(|w| w.uid.to_string()).collect();
    assert_eq!(uids, ["Kubernetes//v1/Pod/ns/a", "Kubernetes//v1/Pod/ns/b"]);
    let keys: Vec<_> = t.services.iter().map(|s| s.key.to_string()).collect();
    assert_eq!(
        keys,
        ["ns/y.ns.svc.cluster.local", "ns/z.ns.svc.cluster.local"]
    );
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    for w in &t.workloads {
        let wire = ambit_proto::workload::Workload::from(w);
        assert_eq!(&Workload::try_from(wire).expect("round trip"), w);
    }
}
