//! PeerAuthentication conversion, one table row per bullet of `spec/cni.md` §7.

use ambit_control::objects::{ObjectSet, load_documents};
use ambit_control::translate::{Cluster, ClusterConfig, Translation};
use ambit_model::PolicyKey;
use ambit_model::authz::{Action, Authorization, Clause, Match, Rule, Scope, StringMatch};

const STATIC: &str = "istio-system/istio_converted_static_strict";
const CONVERTED: &str = "ns/converted_peer_authentication_wpa";

fn translate(docs: &[String]) -> Translation {
    let pods = [("w", "ns", "w"), ("o", "ns", "other"), ("r", "istio-system", "w")].map(
        |(name, ns, app)| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: {app}}}}}\n"
            )
        },
    );
    let yaml = pods
        .iter()
        .chain(docs)
        .cloned()
        .collect::<Vec<_>>()
        .join("---\n");
    let objects = load_documents("test.yaml", &yaml).expect("test YAML loads");
    let set = ObjectSet::from_objects(objects).expect("no duplicates");
    Cluster::new(ClusterConfig::default(), set).translate()
}

/// A PeerAuthentication; `time` is the creation minute (empty for none), `spec` flow YAML.
fn pa(name: &str, ns: &str, time: &str, spec: &str) -> String {
    let ts = if time.is_empty() {
        String::new()
    } else {
        format!(", creationTimestamp: '2024-01-01T00:{time}:00Z'")
    };
    format!(
        "apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\n\
         metadata: {{name: {name}, namespace: {ns}{ts}}}\nspec: {spec}\n"
    )
}

fn mesh(mode: &str) -> String {
    pa(
        "mesh",
        "istio-system",
        "",
        &format!("{{mtls: {{mode: {mode}}}}}"),
    )
}

fn namespace(mode: &str) -> String {
    pa("nspa", "ns", "", &format!("{{mtls: {{mode: {mode}}}}}"))
}

/// The workload PeerAuthentication `wpa` selecting pod `w`.
fn workload(mode: &str, ports: &str) -> String {
    pa(
        "wpa",
        "ns",
        "",
        &format!(
            "{{selector: {{matchLabels: {{app: w}}}}, mtls: {{mode: {mode}}}, portLevelMtls: {{{ports}}}}}"
        ),
    )
}

fn plaintext() -> Match {
    Match {
        not_principals: vec![StringMatch::Presence],
        ..Match::default()
    }
}

fn converted(rules: Vec<Rule>) -> Authorization {
    Authorization {
        key: CONVERTED.parse().expect("policy key"),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        dry_run: false,
        rules,
    }
}

/// Workload STRICT, plaintext allowed only on `open` ports: one rule, clauses AND-ed.
fn strict_except(open: &[u16]) -> Authorization {
    let mut clauses = vec![Clause {
        matches: vec![plaintext()],
    }];
    clauses.extend(open.iter().map(|p| Clause {
        matches: vec![Match {
            not_destination_ports: vec![*p],
            ..Match::default()
        }],
    }));
    converted(vec![Rule { clauses }])
}

/// Workload not STRICT, plaintext denied only on `strict` ports: one rule per port.
fn strict_only(strict: &[u16]) -> Authorization {
    converted(
        strict
            .iter()
            .map(|p| Rule {
                clauses: vec![Clause {
                    matches: vec![Match {
                        destination_ports: vec![*p],
                        ..plaintext()
                    }],
                }],
            })
            .collect(),
    )
}

struct Case {
    name: &'static str,
    docs: Vec<String>,
    /// Converted policies expected besides the static one.
    converted: Vec<Authorization>,
    /// Policies listed by pods w (ns, app=w), o (ns, app=other), r (istio-system, app=w).
    listed: [&'static [&'static str]; 3],
}

#[test]
fn peer_authentication_conversion() {
    let cases = vec![
        Case {
            name: "no PeerAuthentication: nothing, not even the static policy",
            docs: vec![],
            converted: vec![],
            listed: [&[], &[], &[]],
        },
        Case {
            name: "static policy published whenever one exists (even PERMISSIVE)",
            docs: vec![mesh("PERMISSIVE")],
            converted: vec![],
            listed: [&[], &[], &[]],
        },
        Case {
            name: "mesh STRICT: every workload lists the static policy",
            docs: vec![mesh("STRICT")],
            converted: vec![],
            listed: [&[STATIC], &[STATIC], &[STATIC]],
        },
        Case {
            name: "mesh UNSET is PERMISSIVE",
            docs: vec![mesh("UNSET")],
            converted: vec![],
            listed: [&[], &[], &[]],
        },
        Case {
            name: "namespace overrides mesh",
            docs: vec![mesh("STRICT"), namespace("PERMISSIVE")],
            converted: vec![],
            listed: [&[], &[], &[STATIC]],
        },
        Case {
            name: "namespace UNSET inherits mesh",
            docs: vec![mesh("STRICT"), namespace("UNSET")],
            converted: vec![],
            listed: [&[STATIC], &[STATIC], &[STATIC]],
        },
        Case {
            name: "workload selector overrides namespace",
            docs: vec![namespace("PERMISSIVE"), workload("STRICT", "")],
            converted: vec![],
            listed: [&[STATIC], &[], &[]],
        },
        Case {
            name: "workload UNSET inherits namespace",
            docs: vec![namespace("STRICT"), workload("UNSET", "")],
            converted: vec![],
            listed: [&[STATIC], &[STATIC], &[]],
        },
        Case {
            name: "DISABLE is not strict (no plaintext-only mode)",
            docs: vec![namespace("STRICT"), workload("DISABLE", "")],
            converted: vec![],
            listed: [&[], &[STATIC], &[]],
        },
        Case {
            name: "workload selector applies only in its namespace",
            docs: vec![pa(
                "sel",
                "other",
                "",
                "{selector: {matchLabels: {app: w}}, mtls: {mode: STRICT}}",
            )],
            converted: vec![],
            listed: [&[], &[], &[]],
        },
        Case {
            name: "conflict: the oldest namespace PeerAuthentication wins",
            docs: vec![
                pa("b-old", "ns", "01", "{mtls: {mode: STRICT}}"),
                pa("a-new", "ns", "02", "{mtls: {mode: PERMISSIVE}}"),
            ],
            converted: vec![],
            listed: [&[STATIC], &[STATIC], &[]],
        },
        Case {
            name: "conflict: same creation time, the first name wins",
            docs: vec![
                pa("b", "ns", "01", "{mtls: {mode: STRICT}}"),
                pa("a", "ns", "01", "{mtls: {mode: PERMISSIVE}}"),
            ],
            converted: vec![],
            listed: [&[], &[], &[]],
        },
        Case {
            name: "conflict: the oldest workload PeerAuthentication wins",
            docs: vec![
                pa(
                    "x-new",
                    "ns",
                    "05",
                    "{selector: {matchLabels: {app: w}}, mtls: {mode: PERMISSIVE}}",
                ),
                pa(
                    "y-old",
                    "ns",
                    "03",
                    "{selector: {matchLabels: {app: w}}, mtls: {mode: STRICT}}",
                ),
            ],
            converted: vec![],
            listed: [&[STATIC], &[], &[]],
        },
        Case {
            name: "workload STRICT + PERMISSIVE port: plaintext denied except there; no static",
            docs: vec![workload("STRICT", "8080: {mode: PERMISSIVE}")],
            converted: vec![strict_except(&[8080])],
            listed: [&[CONVERTED], &[], &[]],
        },
        Case {
            name: "workload STRICT + PERMISSIVE and DISABLE ports: one clause per port, AND-ed",
            docs: vec![workload(
                "STRICT",
                "8080: {mode: PERMISSIVE}, 9090: {mode: DISABLE}, 7070: {mode: STRICT}",
            )],
            converted: vec![strict_except(&[8080, 9090])],
            listed: [&[CONVERTED], &[], &[]],
        },
        Case {
            name: "workload PERMISSIVE + STRICT ports: one rule per strict port",
            docs: vec![workload(
                "PERMISSIVE",
                "8080: {mode: STRICT}, 9090: {mode: STRICT}, 7070: {mode: DISABLE}",
            )],
            converted: vec![strict_only(&[8080, 9090])],
            listed: [&[CONVERTED], &[], &[]],
        },
        Case {
            name: "workload DISABLE + STRICT port",
            docs: vec![workload("DISABLE", "8080: {mode: STRICT}")],
            converted: vec![strict_only(&[8080])],
            listed: [&[CONVERTED], &[], &[]],
        },
        Case {
            name: "workload UNSET, inherited STRICT + PERMISSIVE port: like the first case",
            docs: vec![
                mesh("STRICT"),
                workload("UNSET", "8080: {mode: PERMISSIVE}"),
            ],
            converted: vec![strict_except(&[8080])],
            listed: [&[CONVERTED], &[STATIC], &[STATIC]],
        },
        Case {
            name: "workload UNSET, inherited non-strict + STRICT port: like the second case",
            docs: vec![
                namespace("PERMISSIVE"),
                workload("UNSET", "8080: {mode: STRICT}"),
            ],
            converted: vec![strict_only(&[8080])],
            listed: [&[CONVERTED], &[], &[]],
        },
        Case {
            name: "workload UNSET, STRICT ports under an inherited STRICT are dropped",
            docs: vec![
                namespace("STRICT"),
                workload("UNSET", "8080: {mode: STRICT}, 9090: {mode: PERMISSIVE}"),
            ],
            converted: vec![strict_except(&[9090])],
            listed: [&[CONVERTED], &[STATIC], &[]],
        },
        Case {
            name: "workload UNSET, inherited STRICT, every port STRICT: no converted policy",
            docs: vec![
                namespace("STRICT"),
                workload("UNSET", "8080: {mode: STRICT}"),
            ],
            converted: vec![],
            listed: [&[STATIC], &[STATIC], &[]],
        },
        Case {
            name: "STRICT with every port STRICT: no converted policy, static suffices",
            docs: vec![workload(
                "STRICT",
                "8080: {mode: STRICT}, 9090: {mode: STRICT}",
            )],
            converted: vec![],
            listed: [&[STATIC], &[], &[]],
        },
        Case {
            name: "ports in the workload mode are no override (PERMISSIVE + PERMISSIVE)",
            docs: vec![workload("PERMISSIVE", "8080: {mode: PERMISSIVE}")],
            converted: vec![],
            listed: [&[], &[], &[]],
        },
        Case {
            name: "only with a selector: namespace-wide portLevelMtls converts nothing",
            docs: vec![pa(
                "nspa",
                "ns",
                "",
                "{mtls: {mode: STRICT}, portLevelMtls: {8080: {mode: PERMISSIVE}}}",
            )],
            converted: vec![],
            listed: [&[STATIC], &[STATIC], &[]],
        },
        Case {
            name: "only outside the root namespace",
            docs: vec![pa(
                "wpa",
                "istio-system",
                "",
                "{selector: {matchLabels: {app: w}}, mtls: {mode: STRICT}, portLevelMtls: {8080: {mode: PERMISSIVE}}}",
            )],
            converted: vec![],
            listed: [&[], &[], &[STATIC]],
        },
        Case {
            name: "converted policy listed only where its PeerAuthentication is the effective one",
            docs: vec![
                pa(
                    "older",
                    "ns",
                    "01",
                    "{selector: {matchLabels: {app: w}}, mtls: {mode: STRICT}}",
                ),
                pa(
                    "wpa",
                    "ns",
                    "02",
                    "{selector: {matchLabels: {app: w}}, mtls: {mode: STRICT}, portLevelMtls: {8080: {mode: PERMISSIVE}}}",
                ),
            ],
            converted: vec![strict_except(&[8080])],
            listed: [&[STATIC], &[], &[]],
        },
    ];
    let static_policy = Authorization {
        key: STATIC.parse::<PolicyKey>().unwrap(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        dry_run: false,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![plaintext()],
            }],
        }],
    };
    for case in cases {
        let t = translate(&case.docs);
        let name = case.name;
        assert!(t.warnings.is_empty(), "{name}: {:?}", t.warnings);
        let mut expected = case.converted.clone();
        if !case.docs.is_empty() {
            expected.push(static_policy.clone());
        }
        expected.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(t.policies, expected, "{name}");
        for (pod, listed) in ["w", "o", "r"].iter().zip(case.listed) {
            let w = t.workloads.iter().find(|w| w.name == *pod).unwrap();
            let got: Vec<String> = w
                .authorization_policies
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(got, listed, "{name}: pod {pod}");
        }
    }
}

/// The policies do what §7 says on the wire: plaintext denied where strict, mTLS never.
#[test]
fn converted_policies_deny_plaintext_only_where_strict() {
    use ambit_model::authz::{Connection, evaluate};
    let t = translate(&[workload("STRICT", "8080: {mode: PERMISSIVE}")]);
    let policy = t
        .policies
        .iter()
        .find(|p| p.key.to_string() == CONVERTED)
        .unwrap();
    let id = "spiffe://cluster.local/ns/a/sa/b".parse().ok();
    let cases = [
        (None, 80, false),
        (None, 8080, true),
        (id.clone(), 80, true),
        (id, 8080, true),
    ];
    for (src_identity, dst_port, allowed) in cases {
        let conn = Connection {
            src_identity,
            src_ip: "10.0.0.9".parse().unwrap(),
            dst_ip: "10.0.0.1".parse().unwrap(),
            dst_port,
        };
        assert_eq!(evaluate([policy], &conn).is_allowed(), allowed, "{conn:?}");
    }
}

/// Kubernetes names can not contain `_`, so only objects built in code can clash with the
/// converted names; the PeerAuthentication-derived policy wins.
#[test]
fn authorization_policies_can_not_take_converted_names() {
    use ambit_control::objects::security::AuthorizationPolicy;
    use ambit_control::objects::{Object, Origin, Resource};
    let yaml = mesh("STRICT");
    let mut set = ObjectSet::from_objects(load_documents("t.yaml", &yaml).expect("loads"))
        .expect("no duplicates");
    let mut impostor = AuthorizationPolicy::default();
    impostor.metadata.name = "istio_converted_static_strict".into();
    impostor.metadata.namespace = "istio-system".into();
    set.insert(Object {
        origin: Origin {
            file: "code".into(),
            document: 1,
        },
        resource: Resource::AuthorizationPolicy(impostor),
    })
    .expect("inserted");
    let t = Cluster::new(ClusterConfig::default(), set).translate();
    assert_eq!(t.policies.len(), 1);
    assert_eq!(t.policies[0].action, Action::Deny);
    assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
    assert!(t.warnings[0].contains("reserved"), "{:?}", t.warnings);
}
