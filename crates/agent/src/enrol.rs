//! Which pods are enrolled (`spec/cni.md` §2): hostNetwork and sidecar pods never; ztunnel
//! pods never; excluded namespaces never; otherwise any enablement selector pair whose pod
//! selector matches the pod's labels and namespace selector the namespace's labels.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::pods::Pod;

/// Annotation that marks a sidecar-injected pod.
pub const SIDECAR_STATUS: &str = "sidecar.istio.io/status";

/// A label selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Operator {
    /// Label present with one of the values.
    In,
    /// Label absent or with none of the values.
    NotIn,
    /// Label present.
    Exists,
    /// Label absent.
    DoesNotExist,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Requirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub operator: Operator,
    /// Values (In/NotIn).
    #[serde(default)]
    pub values: Vec<String>,
}

/// A Kubernetes label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Exact matches.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Expressions.
    #[serde(default)]
    pub match_expressions: Vec<Requirement>,
}

impl LabelSelector {
    /// Whether `labels` satisfy every term.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let got = labels.get(&r.key);
                match r.operator {
                    Operator::In => got.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => got.is_none_or(|v| !r.values.contains(v)),
                    Operator::Exists => got.is_some(),
                    Operator::DoesNotExist => got.is_none(),
                }
            })
    }
}

/// One entry of `AMBIENT_ENABLEMENT_SELECTOR`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnablementSelector {
    /// Pod selector (absent = everything).
    #[serde(default)]
    pub pod_selector: LabelSelector,
    /// Namespace selector (absent = everything).
    #[serde(default)]
    pub namespace_selector: LabelSelector,
}

/// The chart's default selectors.
pub fn default_selectors() -> Vec<EnablementSelector> {
    let label = "istio.io/dataplane-mode";
    vec![
        EnablementSelector {
            pod_selector: LabelSelector {
                match_labels: [(label.to_owned(), "ambient".to_owned())].into(),
                ..LabelSelector::default()
            },
            namespace_selector: LabelSelector::default(),
        },
        EnablementSelector {
            pod_selector: LabelSelector {
                match_expressions: vec![Requirement {
                    key: label.into(),
                    operator: Operator::NotIn,
                    values: vec!["none".into()],
                }],
                ..LabelSelector::default()
            },
            namespace_selector: LabelSelector {
                match_labels: [(label.to_owned(), "ambient".to_owned())].into(),
                ..LabelSelector::default()
            },
        },
    ]
}

/// Parses `AMBIENT_ENABLEMENT_SELECTOR` (a YAML or JSON list); empty → the defaults.
pub fn parse_selectors(text: &str) -> Result<Vec<EnablementSelector>, String> {
    if text.trim().is_empty() {
        return Ok(default_selectors());
    }
    serde_norway::from_str(text).map_err(|e| e.to_string())
}

/// The enrolment predicate with its configuration.
#[derive(Debug, Clone)]
pub struct Enablement {
    /// Selector pairs (OR-ed).
    pub selectors: Vec<EnablementSelector>,
    /// Namespaces never enrolled.
    pub exclude_namespaces: Vec<String>,
    /// Where ztunnel pods live (`app=ztunnel` there is never enrolled).
    pub system_namespace: String,
}

impl Enablement {
    /// Whether the pod is a ztunnel (never snapshotted or enqueued).
    pub fn is_ztunnel(&self, pod: &Pod) -> bool {
        pod.namespace == self.system_namespace
            && pod.labels.get("app").map(String::as_str) == Some("ztunnel")
    }

    /// §2 in order: hostNetwork, sidecar, ztunnel, excluded namespace, selectors.
    pub fn should_enrol(&self, pod: &Pod, ns_labels: &BTreeMap<String, String>) -> bool {
        self.may_enrol(pod)
            && self.selectors.iter().any(|s| {
                s.pod_selector.matches(&pod.labels) && s.namespace_selector.matches(ns_labels)
            })
    }

    /// Whether [`Self::should_enrol`] depends on the labels of the pod's namespace: the pod
    /// is not excluded on its own, no selector enrols it whatever the namespace (pod label
    /// `ambient` with the defaults), and some selector would with the right namespace labels.
    /// A pod for which this holds can not be decided before its namespace is known.
    pub fn needs_namespace(&self, pod: &Pod) -> bool {
        let candidates = || {
            self.selectors
                .iter()
                .filter(|s| s.pod_selector.matches(&pod.labels))
        };
        self.may_enrol(pod)
            && !candidates().any(|s| s.namespace_selector == LabelSelector::default())
            && candidates().next().is_some()
    }

    fn may_enrol(&self, pod: &Pod) -> bool {
        !pod.host_network
            && !pod.annotations.contains_key(SIDECAR_STATUS)
            && !self.is_ztunnel(pod)
            && !self.exclude_namespaces.contains(&pod.namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn precedence() {
        let e = Enablement {
            selectors: default_selectors(),
            exclude_namespaces: vec!["kube-system".into()],
            system_namespace: "istio-system".into(),
        };
        let m = "istio.io/dataplane-mode";
        struct Case {
            name: &'static str,
            ns: &'static str,
            pod: Vec<(&'static str, &'static str)>,
            ns_labels: Vec<(&'static str, &'static str)>,
            host_network: bool,
            sidecar: bool,
            want: bool,
        }
        let base = |name, pod, ns_labels, want| Case {
            name,
            ns: "demo",
            pod,
            ns_labels,
            host_network: false,
            sidecar: false,
            want,
        };
        let cases = [
            base("nothing", vec![], vec![], false),
            base("pod ambient", vec![(m, "ambient")], vec![], true),
            base(
                "pod ambient in none ns",
                vec![(m, "ambient")],
                vec![(m, "none")],
                true,
            ),
            base("ns ambient", vec![], vec![(m, "ambient")], true),
            base(
                "pod none beats ns ambient",
                vec![(m, "none")],
                vec![(m, "ambient")],
                false,
            ),
            base(
                "pod other value, ns ambient",
                vec![(m, "x")],
                vec![(m, "ambient")],
                true,
            ),
            base("ns other value", vec![], vec![(m, "sidecar")], false),
            Case {
                host_network: true,
                ..base("hostNetwork never", vec![(m, "ambient")], vec![], false)
            },
            Case {
                sidecar: true,
                ..base(
                    "sidecar never",
                    vec![(m, "ambient")],
                    vec![(m, "ambient")],
                    false,
                )
            },
            Case {
                ns: "kube-system",
                ..base(
                    "excluded ns never",
                    vec![(m, "ambient")],
                    vec![(m, "ambient")],
                    false,
                )
            },
            Case {
                ns: "istio-system",
                ..base(
                    "ztunnel never",
                    vec![("app", "ztunnel"), (m, "ambient")],
                    vec![(m, "ambient")],
                    false,
                )
            },
            Case {
                ns: "other",
                ..base(
                    "app=ztunnel elsewhere is a pod",
                    vec![("app", "ztunnel"), (m, "ambient")],
                    vec![],
                    true,
                )
            },
        ];
        for c in cases {
            let mut pod = Pod {
                namespace: c.ns.into(),
                labels: labels(&c.pod),
                host_network: c.host_network,
                ..Pod::default()
            };
            if c.sidecar {
                pod.annotations.insert(SIDECAR_STATUS.into(), "{}".into());
            }
            assert_eq!(
                e.should_enrol(&pod, &labels(&c.ns_labels)),
                c.want,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn which_pods_need_their_namespace() {
        let e = Enablement {
            selectors: default_selectors(),
            exclude_namespaces: vec!["kube-system".into()],
            system_namespace: "istio-system".into(),
        };
        let m = "istio.io/dataplane-mode";
        // (case, namespace, pod labels, hostNetwork, needs the namespace)
        let cases = [
            (
                "no label: the namespace decides",
                "demo",
                vec![],
                false,
                true,
            ),
            (
                "other labels: the namespace decides",
                "demo",
                vec![("app", "a")],
                false,
                true,
            ),
            (
                "pod label ambient wins everywhere",
                "demo",
                vec![(m, "ambient")],
                false,
                false,
            ),
            (
                "pod label none wins everywhere",
                "demo",
                vec![(m, "none")],
                false,
                false,
            ),
            ("hostNetwork is never enrolled", "demo", vec![], true, false),
            ("excluded namespace", "kube-system", vec![], false, false),
        ];
        for (case, ns, pod_labels, host_network, want) in cases {
            let pod = Pod {
                namespace: ns.into(),
                labels: labels(&pod_labels),
                host_network,
                ..Pod::default()
            };
            assert_eq!(e.needs_namespace(&pod), want, "{case}");
        }
    }

    #[test]
    fn operators_and_parsing() {
        let sel = parse_selectors(
            "- podSelector:\n    matchExpressions:\n    - {key: a, operator: In, values: [x, y]}\n    - {key: b, operator: Exists}\n    - {key: c, operator: DoesNotExist}\n",
        )
        .unwrap();
        let s = &sel[0].pod_selector;
        for (l, want) in [
            (vec![("a", "x"), ("b", "")], true),
            (vec![("a", "y"), ("b", "1")], true),
            (vec![("a", "z"), ("b", "1")], false),
            (vec![("b", "1")], false),
            (vec![("a", "x")], false),
            (vec![("a", "x"), ("b", "1"), ("c", "1")], false),
        ] {
            assert_eq!(s.matches(&labels(&l)), want, "{l:?}");
        }
        assert!(
            sel[0]
                .namespace_selector
                .matches(&labels(&[("any", "thing")]))
        );
        assert_eq!(parse_selectors("").unwrap(), default_selectors());
        assert!(
            parse_selectors("- podSelector: {matchExpressions: [{key: a, operator: Near}]}")
                .is_err()
        );
    }
}
