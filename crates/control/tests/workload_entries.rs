//! WorkloadEntry and WorkloadGroup: loading (versions, defaults, refused fields) and
//! WorkloadEntry → Workload translation, one table row per rule.

use ambit_control::objects::{ObjectSet, Resource, load_documents};
use ambit_control::translate::{Cluster, ClusterConfig, Translation};
use ambit_model::workload::Workload;

fn translate(yaml: &str) -> Translation {
    let objects = load_documents("test.yaml", yaml).expect("test YAML loads");
    let set = ObjectSet::from_objects(objects).expect("no duplicates");
    Cluster::new(ClusterConfig::default(), set).translate()
}

/// An entry `vm` in namespace `ns`; `spec` is extra flow-mapping entries, `meta` extra metadata.
/// `spec` may override the default address and labels.
fn entry(meta: &str, spec: &str, rest: &str) -> String {
    let mut defaults = String::from("serviceAccount: vm-sa");
    if !spec.contains("address:") {
        defaults.push_str(", address: 10.1.0.5");
    }
    if !spec.contains("labels:") {
        defaults.push_str(", labels: {app: foo}");
    }
    format!(
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n\
         metadata: {{name: vm, namespace: ns{meta}}}\n\
         spec: {{{defaults}{spec}}}\n{rest}"
    )
}

fn svc(spec: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: foo, namespace: ns}}\nspec: {spec}\n"
    )
}

type Field = fn(&Workload) -> String;

#[test]
fn entry_rules() {
    let sel = "{selector: {app: foo}, clusterIP: 10.96.0.9, ports: [{name: http, port: 80, targetPort: 8080}, {name: grpc, port: 90, targetPort: 9090}]}";
    let cases: &[(&str, String, Field, &str)] = &[
        ("uid", entry("", "", ""), |w| w.uid.to_string(),
            "Kubernetes/networking.istio.io/WorkloadEntry/ns/vm"),
        ("identity from namespace and service account", entry("", "", ""),
            |w| w.identity.to_string(), "spiffe://cluster.local/ns/ns/sa/vm-sa"),
        ("service account defaults to default",
            "apiVersion: networking.istio.io/v1beta1\nkind: WorkloadEntry\nmetadata: {name: vm, namespace: ns}\nspec: {address: 10.1.0.5}\n".to_string(),
            |w| w.identity.to_string(), "spiffe://cluster.local/ns/ns/sa/default"),
        ("address", entry("", "", ""), |w| format!("{:?}", w.addresses), "[10.1.0.5]"),
        ("DNS address: none", entry("", ", address: vm.example.com", ""),
            |w| format!("{:?}", w.addresses), "[]"),
        ("network", entry("", ", network: net2", ""), |w| w.network.clone(), "net2"),
        ("locality", entry("", ", locality: r1/z1/s1", ""),
            |w| format!("{}|{}|{}", w.locality.region, w.locality.zone, w.locality.subzone), "r1|z1|s1"),
        ("weight is capacity", entry("", ", weight: 7", ""), |w| w.capacity.to_string(), "7"),
        ("workload name: the entry's", entry("", "", ""), |w| w.workload_name.clone(), "vm"),
        ("workload name: the auto-registration group",
            entry(", annotations: {istio.io/autoRegistrationGroup: grp}", "", ""),
            |w| w.workload_name.clone(), "grp"),
        ("workload name: the workload-name label first",
            entry(", annotations: {istio.io/autoRegistrationGroup: grp}", ", labels: {service.istio.io/workload-name: wn}", ""),
            |w| w.workload_name.clone(), "wn"),
        ("canonical name from app label", entry("", "", ""), |w| w.canonical_name.clone(), "foo"),
        ("spec labels select, metadata labels too",
            entry(", labels: {tier: db}", ", labels: {}", &svc("{selector: {tier: db}, ports: [{port: 80}]}")),
            |w| format!("{:?}", w.services.values().next().map(|p| p.iter().collect::<Vec<_>>())),
            "Some([(80, 80)])"),
        ("service ports: by the entry's port name, else targetPort",
            entry("", ", ports: {http: 18080}", &svc(sel)),
            |w| format!("{:?}", w.services.values().next().map(|p| p.iter().collect::<Vec<_>>())),
            "Some([(80, 18080), (90, 9090)])"),
        ("service in another namespace does not select",
            entry("", "", &svc(sel).replace("namespace: ns", "namespace: other")
                .replace("---\n", "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: other}\n---\n")),
            |w| w.services.len().to_string(), "0"),
        ("HBONE when redirection is enabled",
            entry(", annotations: {ambient.istio.io/redirection: enabled}", "", ""),
            |w| format!("{:?}", w.protocol), "Hbone"),
        ("HBONE with the tunnel label (auto-registered VMs)",
            entry("", ", labels: {app: foo, networking.istio.io/tunnel: http}", ""),
            |w| format!("{:?}", w.protocol), "Hbone"),
        ("plain TCP without either", entry("", "", ""), |w| format!("{:?}", w.protocol), "None"),
    ];
    for (case, yaml, field, want) in cases {
        let t = translate(yaml);
        let w = t
            .workloads
            .iter()
            .find(|w| w.name == "vm")
            .unwrap_or_else(|| panic!("{case}: no workload in {t:?}"));
        assert_eq!(field(w), *want, "{case}");
    }
}

#[test]
fn entries_are_selected_by_policies() {
    let yaml = entry(
        "",
        "",
        "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata: {name: deny-vm, namespace: ns}\n\
         spec: {selector: {matchLabels: {app: foo}}, action: DENY, rules: [{}]}\n",
    );
    let t = translate(&yaml);
    let w = t
        .workloads
        .iter()
        .find(|w| w.name == "vm")
        .expect("workload");
    let keys: Vec<String> = w
        .authorization_policies
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert!(keys.iter().any(|k| k.contains("deny-vm")), "{keys:?}");
}

#[test]
fn every_api_version_loads_and_groups_read() {
    for version in ["v1", "v1beta1", "v1alpha3"] {
        let text = format!(
            "apiVersion: networking.istio.io/{version}\nkind: WorkloadGroup\n\
             metadata: {{name: grp, namespace: ns}}\n\
             spec:\n  metadata: {{labels: {{app: foo}}, annotations: {{a: b}}}}\n  \
             template: {{serviceAccount: vm-sa, network: n1, ports: {{http: 8080}}}}\n  \
             probe: {{periodSeconds: 5, httpGet: {{path: /ready, port: 8080}}}}\n"
        );
        let objects = load_documents("g.yaml", &text).unwrap_or_else(|e| panic!("{version}: {e}"));
        let Resource::WorkloadGroup(g) = &objects[0].resource else {
            panic!("{version}: not a group");
        };
        assert_eq!(g.spec.template.service_account, "vm-sa");
        assert_eq!(g.spec.metadata.labels["app"], "foo");
        assert_eq!(
            g.spec.probe.as_ref().and_then(|p| p.period_seconds),
            Some(5)
        );
    }
    let bad = "apiVersion: networking.istio.io/v2\nkind: WorkloadEntry\nmetadata: {name: a}\n";
    let err = load_documents("g.yaml", bad).unwrap_err().to_string();
    assert!(
        err.contains("unsupported kind") && err.contains("v1alpha3"),
        "{err}"
    );
}

#[test]
fn unknown_and_bad_fields_are_refused_with_their_path() {
    let we = |spec: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: ns}}\n---\n\
             apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n\
             metadata: {{name: vm, namespace: ns}}\nspec:\n{spec}"
        )
    };
    let wg = |spec: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: ns}}\n---\n\
             apiVersion: networking.istio.io/v1alpha3\nkind: WorkloadGroup\n\
             metadata: {{name: grp, namespace: ns}}\nspec:\n{spec}"
        )
    };
    // (case, text, object, what the message must contain)
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "service account misspelt",
            we("  serviceaccount: vm-sa\n"),
            "WorkloadEntry ns/vm",
            "spec: unknown field `serviceaccount`",
        ),
        (
            "label typo",
            we("  label: {app: foo}\n"),
            "WorkloadEntry ns/vm",
            "spec: unknown field `label`",
        ),
        (
            "port not a number",
            we("  ports: {http: web}\n"),
            "WorkloadEntry ns/vm",
            "spec.ports",
        ),
        (
            "port 0",
            we("  ports: {http: 0}\n"),
            "WorkloadEntry",
            "spec.ports.http",
        ),
        (
            "bad service account",
            we("  serviceAccount: Vm_SA\n"),
            "WorkloadEntry",
            "spec.serviceAccount",
        ),
        (
            "template typo",
            wg("  template: {serviceAcount: a}\n"),
            "WorkloadGroup ns/grp",
            "spec.template: unknown field `serviceAcount`",
        ),
        (
            "group metadata typo",
            wg("  metadata: {label: {a: b}}\n"),
            "WorkloadGroup ns/grp",
            "spec.metadata: unknown field `label`",
        ),
        (
            "probe typo",
            wg("  probe: {periodSecond: 5}\n"),
            "WorkloadGroup ns/grp",
            "spec.probe: unknown field `periodSecond`",
        ),
        (
            "group spec typo",
            wg("  templates: {}\n"),
            "WorkloadGroup ns/grp",
            "spec: unknown field `templates`",
        ),
    ];
    for (case, text, object, want) in cases {
        let err = load_documents("vm.yaml", &text).expect_err(case);
        assert_eq!(err.origin().document, 2, "{case}: {err}");
        let text = err.to_string();
        assert!(text.starts_with("vm.yaml: document 2"), "{case}: {text}");
        assert!(text.contains(object), "{case}: {text}");
        assert!(text.contains(want), "{case}: no {want:?} in {text}");
    }
}
