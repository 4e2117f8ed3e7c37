//! The multi-document loader: what it reads from real-looking manifests, and its errors (each
//! naming the file and document, and the line when the YAML parser knows it).

use ambit_control::objects::pod::{PodPhase, Protocol};
use ambit_control::objects::security::{AuthzAction, MtlsMode};
use ambit_control::objects::service::{ClusterIp, TargetPort};
use ambit_control::objects::{
    Kind, Object, ObjectError, ObjectSet, Origin, Resource, load_documents,
};

const MANIFEST: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: demo
  labels: {istio.io/dataplane-mode: ambient}
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: demo
  uid: 0b1c2d3e-0000-0000-0000-000000000001
  creationTimestamp: "2024-01-01T00:00:00Z"
  labels:
    app: client
  annotations:
    ambient.istio.io/redirection: enabled
  managedFields: [{manager: kubectl}]   # unknown fields are ignored
spec:
  nodeName: node1
  serviceAccountName: client-sa
  containers:
  - name: main
    image: busybox
    command: [sh, -c]
    args: ["sleep 1d"]
    env:
    - {name: A, value: "1"}
    - name: B
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    ports:
    - {name: http, containerPort: 8080}
    - {containerPort: 53, protocol: UDP}
    resources: {limits: {cpu: 100m}}
status:
  phase: Running
  podIP: 10.0.0.5
  podIPs: [{ip: 10.0.0.5}]
---
apiVersion: v1
kind: Pod
metadata:
  name: bare
  labels:         # null
spec:
  serviceAccount: legacy
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
  - {port: 443, targetPort: 8443, appProtocol: tls}
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: demo}
spec: {clusterIP: None}
---
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: strict, namespace: demo}
spec:
  selector: {matchLabels: {app: web}}
  mtls: {mode: STRICT}
  portLevelMtls:
    8080: {mode: PERMISSIVE}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-client, namespace: demo}
spec:
  rules:
  - from: [{source: {principals: [cluster.local/ns/demo/sa/client-sa]}}]
    to: [{operation: {ports: ["80"], methods: [GET]}}]
    when: [{key: source.ip, values: [10.0.0.0/8]}]
"#;

#[test]
fn reads_every_kind() {
    let objects = load_documents("demo.yaml", MANIFEST).unwrap();
    let kinds: Vec<Kind> = objects.iter().map(Object::kind).collect();
    use Kind::*;
    assert_eq!(
        kinds,
        [
            Namespace,
            Pod,
            Pod,
            Service,
            Service,
            PeerAuthentication,
            AuthorizationPolicy
        ]
    );
    let docs: Vec<usize> = objects.iter().map(|o| o.origin.document).collect();
    assert_eq!(docs, [1, 2, 3, 4, 5, 6, 7]);
    let set = ObjectSet::from_objects(objects).unwrap();

    let ns = &set.namespaces[0];
    assert_eq!(
        (ns.metadata.name.as_str(), ns.metadata.namespace.as_str()),
        ("demo", "")
    );
    assert_eq!(ns.metadata.labels["istio.io/dataplane-mode"], "ambient");

    let client = &set.pods[0];
    assert_eq!(client.metadata.uid, "0b1c2d3e-0000-0000-0000-000000000001");
    assert_eq!(
        client.metadata.creation_timestamp.unwrap().seconds,
        1_704_067_200
    );
    assert_eq!(
        client.metadata.annotations["ambient.istio.io/redirection"],
        "enabled"
    );
    assert_eq!(client.spec.node_name, "node1");
    assert_eq!(client.spec.service_account_name, "client-sa");
    let c = &client.spec.containers[0];
    assert_eq!((c.name.as_str(), c.image.as_str()), ("main", "busybox"));
    assert_eq!(c.command, ["sh", "-c"]);
    assert_eq!(c.args, ["sleep 1d"]);
    assert_eq!(c.env.len(), 2);
    assert_eq!(c.env[0].value.as_deref(), Some("1"));
    assert_eq!(c.env[1].value, None);
    assert_eq!(c.ports[0].name.as_deref(), Some("http"));
    assert_eq!(
        (c.ports[0].container_port, c.ports[0].protocol),
        (8080, Protocol::Tcp)
    );
    assert_eq!(
        (c.ports[1].container_port, c.ports[1].protocol),
        (53, Protocol::Udp)
    );
    assert_eq!(client.status.phase, Some(PodPhase::Running));
    assert_eq!(
        client.ips(),
        ["10.0.0.5".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(client.named_port("http"), Some(8080));

    let bare = &set.pods[1];
    assert_eq!(
        bare.metadata.namespace, "default",
        "namespace defaults to default"
    );
    assert_eq!(
        bare.spec.service_account_name, "legacy",
        "deprecated serviceAccount honoured"
    );
    assert_eq!(bare.metadata.uid.len(), 36, "uid generated");
    assert!(bare.metadata.labels.is_empty());
    assert!(bare.ips().is_empty());

    let web = &set.services[0];
    assert_eq!(
        web.spec.cluster_ip,
        Some(ClusterIp::Ip("10.96.0.10".parse().unwrap()))
    );
    assert_eq!(web.spec.ports[0].target(), TargetPort::Name("http".into()));
    assert_eq!(web.spec.ports[1].target(), TargetPort::Number(8443));
    assert_eq!(web.spec.ports[1].app_protocol.as_deref(), Some("tls"));
    assert!(!web.is_headless());
    assert!(set.services[1].is_headless());

    let pa = &set.peer_authentications[0];
    assert_eq!(pa.mode(), MtlsMode::Strict);
    assert_eq!(pa.spec.port_level_mtls[&8080].mode, MtlsMode::Permissive);

    let ap = &set.authorization_policies[0];
    assert_eq!(ap.spec.action, AuthzAction::Allow);
    let rule = &ap.spec.rules[0];
    assert_eq!(
        rule.from[0].source.as_ref().unwrap().principals,
        ["cluster.local/ns/demo/sa/client-sa"]
    );
    assert_eq!(rule.to[0].operation.as_ref().unwrap().ports, ["80"]);
    assert_eq!(rule.to[0].operation.as_ref().unwrap().methods, ["GET"]);
    assert_eq!(rule.when[0].key, "source.ip");
}

type PodField = fn(&ambit_control::objects::Pod) -> String;

#[test]
fn pod_defaults() {
    let cases: &[(&str, &str, PodField, &str)] = &[
        (
            "namespace",
            "metadata: {name: p}",
            |p| p.metadata.namespace.clone(),
            "default",
        ),
        (
            "service account",
            "metadata: {name: p}",
            |p| p.spec.service_account_name.clone(),
            "default",
        ),
        (
            "deprecated serviceAccount",
            "metadata: {name: p}\nspec: {serviceAccount: old}",
            |p| p.spec.service_account_name.clone(),
            "old",
        ),
        (
            "serviceAccountName wins",
            "metadata: {name: p}\nspec: {serviceAccount: old, serviceAccountName: new}",
            |p| p.spec.service_account_name.clone(),
            "new",
        ),
        (
            "generated uid",
            "metadata: {name: p, namespace: ns}",
            |p| p.metadata.uid.clone(),
            "2380c91d-806d-d155-e983-ef7dfdab5fbe",
        ),
        (
            "given uid kept",
            "metadata: {name: p, uid: abc}",
            |p| p.metadata.uid.clone(),
            "abc",
        ),
        (
            "empty podIP is no IP",
            "metadata: {name: p}\nstatus: {podIP: ''}",
            |p| format!("{:?}", p.ips()),
            "[]",
        ),
        (
            "null lists",
            "metadata: {name: p, labels: null}\nspec: {containers: null}",
            |p| format!("{:?}", p.spec.containers),
            "[]",
        ),
    ];
    for (case, body, field, want) in cases {
        let text = format!("apiVersion: v1\nkind: Pod\n{body}\n");
        let pod = match load_documents("f.yaml", &text).unwrap().remove(0).resource {
            Resource::Pod(p) => p,
            other => panic!("{case}: not a pod: {other:?}"),
        };
        assert_eq!(field(&pod), *want, "{case}");
    }
}

type Check = fn(&ObjectError) -> bool;
/// (case, text, document, line, variant check, fragments of the message).
type ErrorCase = (
    &'static str,
    String,
    usize,
    Option<usize>,
    Check,
    &'static [&'static str],
);

#[test]
fn errors_name_file_document_and_line() {
    let ns = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n";
    let cases: Vec<ErrorCase> = vec![
        ("unknown kind", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n".into(), 1, None,
            |e| matches!(e, ObjectError::UnknownKind { kind, .. } if kind == "ConfigMap"),
            &["\"ConfigMap\""]),
        ("known kind, unknown apiVersion", format!("{ns}---\napiVersion: networking.istio.io/v1\nkind: AuthorizationPolicy\n"), 2, None,
            |e| matches!(e, ObjectError::UnknownKind { .. }),
            &["\"AuthorizationPolicy\"", "networking.istio.io/v1"]),
        ("malformed YAML", format!("{ns}---\napiVersion: v1\nkind: [Pod\n"), 2, Some(7),
            |e| matches!(e, ObjectError::Yaml { .. }), &[]),
        ("bad indentation", format!("{ns}---\napiVersion: v1\nkind: Pod\n metadata: x\n"), 2, Some(7),
            |e| matches!(e, ObjectError::Yaml { .. }), &[]),
        ("missing kind", "apiVersion: v1\nmetadata: {name: a}\n".into(), 1, None,
            |e| matches!(e, ObjectError::Missing { field: "kind", .. }), &["kind"]),
        ("missing apiVersion", "kind: Pod\nmetadata: {name: a}\n".into(), 1, None,
            |e| matches!(e, ObjectError::Missing { field: "apiVersion", .. }), &["apiVersion"]),
        ("missing name", format!("{ns}---\napiVersion: v1\nkind: Pod\nmetadata: {{namespace: x}}\n"), 2, None,
            |e| matches!(e, ObjectError::Missing { field: "metadata.name", .. }), &["metadata.name"]),
        ("no metadata at all", "apiVersion: v1\nkind: Service\n".into(), 1, None,
            |e| matches!(e, ObjectError::Missing { field: "metadata.name", .. }), &[]),
        ("not a mapping", "- a\n- b\n".into(), 1, None,
            |e| matches!(e, ObjectError::NotAMapping { .. }), &["sequence"]),
        ("duplicate in one file", format!("{ns}---\n{ns}"), 2, None,
            |e| matches!(e, ObjectError::Duplicate { first, .. } if first.document == 1),
            &["duplicate Namespace a", "first defined at test.yaml: document 1"]),
        ("same name, different kind is fine… but same kind and namespace is not",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: default}\n".into(),
            3, None, |e| matches!(e, ObjectError::Duplicate { .. }), &["Pod default/a"]),
        ("bad name", "apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name}\n".into(), 1, None,
            |e| matches!(e, ObjectError::Invalid { field, .. } if field == "metadata.name"), &["Bad_Name"]),
        ("bad namespace", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: a.b}\n".into(), 1, None,
            |e| matches!(e, ObjectError::Invalid { field, .. } if field == "metadata.namespace"), &[]),
        ("wrong field type, with its path and line",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: c\n    ports:\n    - containerPort: http\n".into(),
            1, Some(8), |e| matches!(e, ObjectError::Yaml { .. }),
            &["spec.containers[0].ports[0].containerPort"]),
        ("port out of range", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{port: 70000}]\n".into(),
            1, Some(5), |e| matches!(e, ObjectError::Yaml { .. }), &["spec.ports[0].port"]),
        ("targetPort 0", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{port: 80, targetPort: 0}]\n".into(),
            1, Some(5), |e| matches!(e, ObjectError::Yaml { .. }), &["out of range"]),
        ("bad pod IP", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nstatus: {podIP: 10.0.0.300}\n".into(),
            1, Some(4), |e| matches!(e, ObjectError::Yaml { .. }), &["10.0.0.300"]),
        ("bad clusterIP", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: nope}\n".into(),
            1, Some(4), |e| matches!(e, ObjectError::Yaml { .. }), &["\"nope\""]),
        ("clusterIP and clusterIPs disagree",
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.0.0.1, clusterIPs: [10.0.0.2]}\n".into(),
            1, None, |e| matches!(e, ObjectError::Invalid { field, .. } if field == "spec.clusterIPs"), &[]),
        ("bad mTLS mode", "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: a}\nspec:\n  mtls: {mode: strict}\n".into(),
            1, Some(5), |e| matches!(e, ObjectError::Yaml { .. }), &["spec.mtls.mode"]),
        ("bad action", "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: a}\nspec:\n  action: REJECT\n".into(),
            1, Some(5), |e| matches!(e, ObjectError::Yaml { .. }), &["REJECT"]),
        ("bad creation timestamp", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, creationTimestamp: yesterday}\n".into(),
            1, Some(3), |e| matches!(e, ObjectError::Yaml { .. }), &["RFC 3339"]),
        ("labels must be strings", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  labels: {a: [1]}\n".into(),
            1, Some(5), |e| matches!(e, ObjectError::Yaml { .. }), &["metadata.labels"]),
    ];
    for (case, text, document, line, check, parts) in cases {
        let err = load_documents("test.yaml", &text).expect_err(case);
        assert!(check(&err), "{case}: {err:?}");
        assert_eq!(
            err.origin(),
            &Origin {
                file: "test.yaml".into(),
                document
            },
            "{case}: {err}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("test.yaml: document {document}")),
            "{case}: {text}"
        );
        if let ObjectError::Yaml { line: got, .. } = &err {
            assert_eq!(*got, line, "{case}: {text}");
        }
        for part in parts {
            assert!(text.contains(part), "{case}: {part:?} not in {text}");
        }
    }
}

#[test]
fn duplicates_across_files_name_both() {
    let ns = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n";
    let mut set = ObjectSet::new();
    for object in load_documents("one.yaml", ns).unwrap() {
        set.insert(object).unwrap();
    }
    let second = load_documents("two.yaml", &format!("---\n{ns}"))
        .unwrap()
        .remove(0);
    let err = set.insert(second).unwrap_err().to_string();
    assert_eq!(
        err,
        "two.yaml: document 1: duplicate Namespace a (first defined at one.yaml: document 1)"
    );
}

/// A misspelt key in a security object must never parse as an absent one (an ALLOW with
/// `from: [{source: {principal: [...]}}]` would otherwise allow everyone): the loader refuses
/// it at any depth, naming the file, the document (index and object) and the key path.
#[test]
fn security_kinds_refuse_unknown_fields() {
    let ap = |spec: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: demo}}\n---\n\
             apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
             metadata: {{name: allow, namespace: demo}}\nspec:\n{spec}"
        )
    };
    let pa = |spec: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: demo}}\n---\n\
             apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\n\
             metadata: {{name: strict, namespace: demo}}\nspec:\n{spec}"
        )
    };
    // (case, text, object named in the error, key path, unknown key)
    let cases: Vec<(&str, String, &str, &str, &str)> = vec![
        (
            "source.principal (typo of principals)",
            ap(
                "  rules:\n  - from:\n    - source:\n        principal: [cluster.local/ns/demo/sa/a]\n",
            ),
            "AuthorizationPolicy demo/allow",
            "spec.rules[0].from[0].source",
            "principal",
        ),
        (
            "from entry",
            ap("  rules:\n  - from:\n    - sources: {principals: [a]}\n"),
            "AuthorizationPolicy demo/allow",
            "spec.rules[0].from[0]",
            "sources",
        ),
        (
            "rule",
            ap("  rules:\n  - form: [{source: {principals: [a]}}]\n"),
            "AuthorizationPolicy demo/allow",
            "spec.rules[0]",
            "form",
        ),
        (
            "spec",
            ap("  rule: [{}]\n"),
            "AuthorizationPolicy demo/allow",
            "spec",
            "rule",
        ),
        (
            "operation",
            ap("  rules:\n  - to: [{operation: {port: ['80']}}]\n"),
            "AuthorizationPolicy demo/allow",
            "spec.rules[0].to[0].operation",
            "port",
        ),
        (
            "to entry",
            ap("  rules:\n  - to: [{operations: {ports: ['80']}}]\n"),
            "AuthorizationPolicy demo/allow",
            "spec.rules[0].to[0]",
            "operations",
        ),
        (
            "condition",
            ap("  rules:\n  - when: [{key: source.ip, value: [10.0.0.0/8]}]\n"),
            "AuthorizationPolicy demo/allow",
            "spec.rules[0].when[0]",
            "value",
        ),
        (
            "selector",
            ap("  selector: {matchLabel: {app: a}}\n"),
            "AuthorizationPolicy demo/allow",
            "spec.selector",
            "matchLabel",
        ),
        (
            "targetRef",
            ap("  targetRef: {kind: Service, nam: a}\n"),
            "AuthorizationPolicy demo/allow",
            "spec.targetRef",
            "nam",
        ),
        (
            "top level",
            ap("  rules: [{}]\nspecs: {}\n"),
            "AuthorizationPolicy demo/allow",
            "",
            "specs",
        ),
        (
            "PeerAuthentication spec",
            pa("  mTLS: {mode: STRICT}\n"),
            "PeerAuthentication demo/strict",
            "spec",
            "mTLS",
        ),
        (
            "PeerAuthentication mtls",
            pa("  mtls: {mod: STRICT}\n"),
            "PeerAuthentication demo/strict",
            "spec.mtls",
            "mod",
        ),
        (
            "PeerAuthentication port-level mtls",
            pa(
                "  selector: {matchLabels: {app: a}}\n  portLevelMtls:\n    8080: {mode: DISABLE, extra: 1}\n",
            ),
            "PeerAuthentication demo/strict",
            "spec.portLevelMtls.8080",
            "extra",
        ),
        (
            "PeerAuthentication selector",
            pa("  selector: {matchlabels: {app: a}}\n"),
            "PeerAuthentication demo/strict",
            "spec.selector",
            "matchlabels",
        ),
    ];
    for (case, text, object, path, key) in cases {
        let err = load_documents("policy.yaml", &text).expect_err(case);
        assert_eq!(err.origin().document, 2, "{case}: {err}");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("policy.yaml: document 2 ({object})")),
            "{case}: {text}"
        );
        let at = if path.is_empty() {
            String::new()
        } else {
            format!("{path}: ")
        };
        assert!(
            text.contains(&format!("{at}unknown field `{key}`")),
            "{case}: no key path {path:?} / key {key:?} in {text}"
        );
    }
}

/// What stays tolerant: metadata and status of every kind (the API server adds many fields),
/// the fields of a Pod or Service nobody reads, and every field the Istio API defines for the
/// security kinds (even those ztunnel does not enforce).
#[test]
fn known_and_metadata_fields_still_load() {
    let text = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: full
  namespace: demo
  resourceVersion: "12"
  generation: 3
  managedFields: [{manager: kubectl}]
spec:
  selector: {matchLabels: {app: a}}
  action: ALLOW
  rules:
  - from:
    - source:
        principals: [a]
        notPrincipals: [b]
        requestPrincipals: [c]
        notRequestPrincipals: [d]
        namespaces: [e]
        notNamespaces: [f]
        serviceAccounts: [g]
        notServiceAccounts: [h]
        trustDomains: [td]
        notTrustDomains: [td2]
        ipBlocks: [10.0.0.0/8]
        notIpBlocks: [10.1.0.0/16]
        remoteIpBlocks: [10.2.0.0/16]
        notRemoteIpBlocks: [10.3.0.0/16]
    to:
    - operation: {hosts: [a], notHosts: [b], ports: ["80"], notPorts: ["81"], methods: [GET], notMethods: [PUT], paths: [/], notPaths: [/x]}
    when:
    - {key: source.ip, values: [10.0.0.0/8], notValues: [10.0.0.1]}
status:
  conditions: [{type: Accepted, status: "True"}]
  validationMessages: []
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: custom, namespace: demo}
spec:
  action: CUSTOM
  provider: {name: ext-authz}
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: gw, namespace: demo}]
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: pa, namespace: demo, labels: {a: b}}
spec:
  selector: {matchLabels: {app: a}}
  mtls: {mode: STRICT}
  portLevelMtls: {"8080": {mode: PERMISSIVE}}
status: {anything: [1, 2]}
"#;
    let objects = load_documents("known.yaml", text).expect("every Istio field is known");
    assert_eq!(objects.len(), 3);
}
