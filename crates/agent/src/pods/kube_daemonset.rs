//! [`KubeDaemonSetLookup`]: the [`DaemonSetLookup`] behind the shutdown decision
//! (`spec/cni.md` §1.10), asking the API server about the agent's own DaemonSet.
//!
//! One lookup is `GET /apis/apps/v1/namespaces/<POD_NAMESPACE>/daemonsets/istio-cni-node`,
//! then, only when the pod template constrains nodes, `GET /api/v1/nodes/<NODE_NAME>`:
//!
//! | answer | state |
//! |---|---|
//! | 200, no `metadata.deletionTimestamp`, template schedules on this node | [`DaemonSetState::Active`] (upgrade) |
//! | 200 with `metadata.deletionTimestamp` | [`DaemonSetState::Deleting`] |
//! | 200, but `nodeSelector` / required node affinity rejects this node, or the node is gone | [`DaemonSetState::AffinityMismatch`] |
//! | 404 | [`DaemonSetState::NotFound`] |
//! | 401 or 403 | [`DaemonSetState::Unauthorized`] (our RBAC went with the chart) |
//! | anything else (5xx, 429, transport) | `Err`: retried by [`DaemonSetCheck`] |
//!
//! Upstream's `errors.IsUnauthorized` is 401 only; removing the chart's ClusterRoleBinding
//! while the service account still exists yields 403, which is the common uninstall order,
//! so both count. A 401/403 on the node lookup (an RBAC without `nodes get`) is not an
//! uninstall signal: the DaemonSet is there, so the node is assumed to match.
//!
//! Node affinity follows the scheduler's `requiredDuringSchedulingIgnoredDuringExecution`
//! rules: terms are ORed, the expressions and fields of one term ANDed, an empty term
//! matches nothing; operators `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt` on labels
//! and `In` / `NotIn` on the field `metadata.name`. `spec.template.spec.nodeSelector` must
//! match as well.

use std::collections::BTreeMap;
use std::time::Duration;

use ambit_kubeapi::Client;
use serde::Deserialize;
use serde_json::Value;

use crate::shutdown::{
    BoxFuture, DaemonSetCheck, DaemonSetLookup, DaemonSetState, DisableSafeUpgrade, LookupError,
    UninstallCheck,
};

/// The chart's DaemonSet name (`spec/cni.md` §1.10).
pub const DAEMONSET_NAME: &str = "istio-cni-node";

/// Pause between lookups (upstream: a constant 1 s backoff).
pub const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Looks up the agent's DaemonSet and this node through the API server.
#[derive(Debug, Clone)]
pub struct KubeDaemonSetLookup {
    client: Client,
    namespace: String,
    name: String,
    node: String,
}

impl KubeDaemonSetLookup {
    /// The DaemonSet [`DAEMONSET_NAME`] in `namespace` (`POD_NAMESPACE`), affinity checked
    /// against `node` (`NODE_NAME`; empty skips the affinity check).
    pub fn new(client: Client, namespace: impl Into<String>, node: impl Into<String>) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            name: DAEMONSET_NAME.to_owned(),
            node: node.into(),
        }
    }

    /// Another DaemonSet name (e.g. a revisioned chart's `istio-cni-node-<rev>`).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// One lookup; `Err` is a transient failure.
    pub async fn lookup_once(&self) -> Result<DaemonSetState, LookupError> {
        let path = format!(
            "/apis/apps/v1/namespaces/{}/daemonsets/{}",
            self.namespace, self.name
        );
        let ds_name = || format!("{}/{}", self.namespace, self.name);
        let ds = match self.client.get(&path).await {
            Ok(ds) => ds,
            Err(e) => {
                return match e.status() {
                    Some(404) => Ok(DaemonSetState::NotFound),
                    Some(401 | 403) => Ok(DaemonSetState::Unauthorized),
                    _ => Err(LookupError::Api {
                        kind: "DaemonSet",
                        name: ds_name(),
                        source: Box::new(e),
                    }),
                };
            }
        };
        let ds = DaemonSet::deserialize(&ds).map_err(|source| LookupError::Decode {
            kind: "DaemonSet",
            name: ds_name(),
            source,
        })?;
        if ds.metadata.deletion_timestamp.is_some() {
            return Ok(DaemonSetState::Deleting);
        }
        let pod = ds.spec.template.spec;
        let required = pod
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required);
        let selector = pod.node_selector.unwrap_or_default();
        if (required.is_none() && selector.is_empty()) || self.node.is_empty() {
            return Ok(DaemonSetState::Active);
        }
        let node = match self
            .client
            .get(&format!("/api/v1/nodes/{}", self.node))
            .await
        {
            Ok(node) => node,
            Err(e) => {
                return match e.status() {
                    Some(404) => Ok(DaemonSetState::AffinityMismatch),
                    Some(401 | 403) => {
                        tracing::warn!(node = %self.node, error = %e,
                            "cannot read this node to check the DaemonSet's affinity; assuming it matches");
                        Ok(DaemonSetState::Active)
                    }
                    _ => Err(LookupError::Api {
                        kind: "node",
                        name: self.node.clone(),
                        source: Box::new(e),
                    }),
                };
            }
        };
        let node = Node::deserialize(&node).map_err(|source| LookupError::Decode {
            kind: "node",
            name: self.node.clone(),
            source,
        })?;
        let labels = node.metadata.labels.unwrap_or_default();
        let name = node.metadata.name.unwrap_or_else(|| self.node.clone());
        let selector_ok = selector.iter().all(|(k, v)| labels.get(k) == Some(v));
        let affinity_ok = required.is_none_or(|r| r.matches(&name, &labels));
        Ok(if selector_ok && affinity_ok {
            DaemonSetState::Active
        } else {
            DaemonSetState::AffinityMismatch
        })
    }
}

impl DaemonSetLookup for KubeDaemonSetLookup {
    fn lookup(&self) -> BoxFuture<'_, Result<DaemonSetState, LookupError>> {
        Box::pin(self.lookup_once())
    }
}

/// The shutdown decision for an agent with API access: `AMBIENT_DISABLE_SAFE_UPGRADE`
/// always uninstalls; otherwise upstream's DaemonSet rule with 0 retries, or 2 with
/// `ISTIO_OWNED_CNI_CONFIG` (`istio_owned_cni_config`), [`RETRY_DELAY`] apart.
pub fn daemonset_check(
    lookup: KubeDaemonSetLookup,
    disable_safe_upgrade: bool,
    istio_owned_cni_config: bool,
) -> Box<dyn UninstallCheck> {
    if disable_safe_upgrade {
        return Box::new(DisableSafeUpgrade);
    }
    Box::new(DaemonSetCheck {
        lookup,
        retries: if istio_owned_cni_config { 2 } else { 0 },
        retry_delay: RETRY_DELAY,
    })
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    deletion_timestamp: Option<Value>,
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct DaemonSet {
    metadata: Meta,
    spec: DaemonSetSpec,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct DaemonSetSpec {
    template: PodTemplate,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PodTemplate {
    spec: PodSpec,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodSpec {
    node_selector: Option<BTreeMap<String, String>>,
    affinity: Option<Affinity>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Affinity {
    node_affinity: Option<NodeAffinity>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeAffinity {
    #[serde(rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    required: Option<NodeSelector>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NodeSelector {
    node_selector_terms: Vec<Term>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Term {
    match_expressions: Option<Vec<Requirement>>,
    match_fields: Option<Vec<Requirement>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Requirement {
    key: String,
    operator: String,
    values: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Node {
    metadata: Meta,
}

impl NodeSelector {
    fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector_terms
            .iter()
            .any(|t| t.matches(node_name, labels))
    }
}

impl Term {
    fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        let exprs = self.match_expressions.as_deref().unwrap_or_default();
        let fields = self.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        exprs
            .iter()
            .all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
            && fields.iter().all(|r| {
                r.key == "metadata.name"
                    && matches!(r.operator.as_str(), "In" | "NotIn")
                    && r.matches(Some(node_name))
            })
    }
}

impl Requirement {
    fn matches(&self, value: Option<&str>) -> bool {
        let values = self.values.as_deref().unwrap_or_default();
        let number = |s: &str| s.parse::<i64>().ok();
        match self.operator.as_str() {
            "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
            "NotIn" => value.is_none_or(|v| values.iter().all(|w| w != v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "Gt" | "Lt" => {
                let (Some(have), [want]) = (value.and_then(number), values) else {
                    return false;
                };
                let Some(want) = number(want) else {
                    return false;
                };
                if self.operator == "Gt" {
                    have > want
                } else {
                    have < want
                }
            }
            other => {
                tracing::warn!(operator = other, key = %self.key, "unknown node selector operator");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown::ShutdownKind;
    use ambit_kubeapi::testing::{FakeApiServer, Route};
    use serde_json::json;

    const DAEMONSETS: &str = "/apis/apps/v1/daemonsets";
    const NODES: &str = "/api/v1/nodes";
    const DS_PATH: &str = "/apis/apps/v1/namespaces/istio-system/daemonsets/istio-cni-node";

    fn daemonset(extra_meta: Value, pod_spec: Value) -> Value {
        let mut metadata = json!({"name": DAEMONSET_NAME, "namespace": "istio-system"});
        if let (Value::Object(m), Value::Object(extra)) = (&mut metadata, extra_meta) {
            m.extend(extra);
        }
        json!({"metadata": metadata, "spec": {"template": {"spec": pod_spec}}})
    }

    fn linux_only() -> Value {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions":
                [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}})
    }

    fn status(code: u16, reason: &str) -> String {
        json!({"kind": "Status", "status": "Failure", "reason": reason, "message": "injected",
               "code": code})
        .to_string()
    }

    /// The state of the fake API server before the agent shuts down.
    #[derive(Debug, Clone, Copy)]
    enum Setup {
        Present,
        Deleting,
        Absent,
        Forbidden,
        Unauthenticated,
        FailOnceThenPresent,
        FailOnceThenAbsent,
        Garbage,
        AffinityMatches,
        AffinityMismatch,
        NodeSelectorMismatch,
        NodeGone,
        NodesForbidden,
        NodeFailsOnce,
    }

    async fn server_for(setup: Setup) -> FakeApiServer {
        use Setup::*;
        let server = FakeApiServer::start().await.unwrap();
        server.apply(
            NODES,
            json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/os": "linux"}}}),
        );
        let plain = daemonset(json!({}), json!({"containers": []}));
        match setup {
            Present => drop(server.apply(DAEMONSETS, plain)),
            Deleting => drop(server.apply(
                DAEMONSETS,
                daemonset(
                    json!({"deletionTimestamp": "2025-01-01T00:00:00Z"}),
                    json!({}),
                ),
            )),
            Absent => {}
            Forbidden => {
                server.apply(DAEMONSETS, plain);
                server.forbid(DAEMONSETS);
            }
            Unauthenticated => {
                server.apply(DAEMONSETS, plain);
                server.respond_once(
                    Route::List(DS_PATH.into()),
                    401,
                    status(401, "Unauthorized"),
                );
            }
            FailOnceThenPresent => {
                server.apply(DAEMONSETS, plain);
                server.respond_once(
                    Route::List(DS_PATH.into()),
                    500,
                    status(500, "InternalError"),
                );
            }
            FailOnceThenAbsent => {
                server.respond_once(Route::List(DS_PATH.into()), 503, "upstream connect error");
            }
            Garbage => {
                server.apply(DAEMONSETS, plain);
                server.respond_once(Route::List(DS_PATH.into()), 200, "{\"metadata\": 7}");
            }
            AffinityMatches => drop(server.apply(DAEMONSETS, daemonset(json!({}), linux_only()))),
            AffinityMismatch => {
                let mut spec = linux_only();
                spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                    ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = json!(["windows"]);
                server.apply(DAEMONSETS, daemonset(json!({}), spec));
            }
            NodeSelectorMismatch => drop(server.apply(
                DAEMONSETS,
                daemonset(json!({}), json!({"nodeSelector": {"pool": "ambient"}})),
            )),
            NodeGone => {
                server.apply(DAEMONSETS, daemonset(json!({}), linux_only()));
                server.delete(NODES, "", "n1");
            }
            NodesForbidden => {
                server.apply(DAEMONSETS, daemonset(json!({}), linux_only()));
                server.forbid(NODES);
            }
            NodeFailsOnce => {
                server.apply(DAEMONSETS, daemonset(json!({}), linux_only()));
                server.respond_once(Route::List(format!("{NODES}/n1")), 500, status(500, "x"));
            }
        }
        server
    }

    #[tokio::test]
    async fn shutdown_decision_against_the_api_server() {
        use DaemonSetState as S;
        use Setup::*;
        use ShutdownKind::*;
        // (setup, retries, first lookup (None: transient error), decision, DaemonSet GETs)
        let cases = [
            (Present, 0, Some(S::Active), Upgrade, 1),
            (Deleting, 0, Some(S::Deleting), Uninstall, 1),
            (Absent, 0, Some(S::NotFound), Uninstall, 1),
            (Forbidden, 0, Some(S::Unauthorized), Uninstall, 1),
            (Unauthenticated, 0, Some(S::Unauthorized), Uninstall, 1),
            (FailOnceThenPresent, 2, None, Upgrade, 2),
            (FailOnceThenAbsent, 2, None, Uninstall, 2),
            // Undetermined after the retries: the check keeps state.
            (FailOnceThenAbsent, 0, None, Upgrade, 1),
            (Garbage, 0, None, Upgrade, 1),
            (Garbage, 2, None, Upgrade, 2),
            (AffinityMatches, 0, Some(S::Active), Upgrade, 1),
            (AffinityMismatch, 0, Some(S::AffinityMismatch), Uninstall, 1),
            (
                NodeSelectorMismatch,
                0,
                Some(S::AffinityMismatch),
                Uninstall,
                1,
            ),
            (NodeGone, 0, Some(S::AffinityMismatch), Uninstall, 1),
            (NodesForbidden, 0, Some(S::Active), Upgrade, 1),
            (NodeFailsOnce, 2, None, Upgrade, 2),
        ];
        for (setup, retries, first, want, gets) in cases {
            let case = format!("{setup:?} with {retries} retries");
            // The first lookup on its own.
            let server = server_for(setup).await;
            let lookup = |server: &FakeApiServer| {
                KubeDaemonSetLookup::new(
                    Client::new(server.config()).unwrap(),
                    "istio-system",
                    "n1",
                )
            };
            let got = lookup(&server).lookup_once().await;
            match (&got, first) {
                (Ok(state), Some(want)) => assert_eq!(*state, want, "{case}"),
                (Err(e), None) => assert!(!e.to_string().is_empty(), "{case}"),
                _ => panic!("{case}: first lookup {got:?}, want {first:?}"),
            }
            // The whole decision, on a fresh server in the same state.
            let server = server_for(setup).await;
            let check = DaemonSetCheck {
                lookup: lookup(&server),
                retries,
                retry_delay: Duration::from_millis(1),
            };
            assert_eq!(check.decide().await, want, "{case}");
            let ds_gets = server
                .requests()
                .iter()
                .filter(|r| r.method == "GET" && r.path == DS_PATH)
                .count();
            assert_eq!(ds_gets, gets, "{case}");
        }
    }

    #[tokio::test]
    async fn configured_checks() {
        let server = server_for(Setup::Absent).await;
        let lookup =
            KubeDaemonSetLookup::new(Client::new(server.config()).unwrap(), "istio-system", "n1");
        // AMBIENT_DISABLE_SAFE_UPGRADE: no lookup at all.
        let check = daemonset_check(lookup.clone(), true, false);
        assert_eq!(check.decide().await, ShutdownKind::Uninstall);
        assert!(server.requests().is_empty());
        assert_eq!(
            daemonset_check(lookup.clone(), false, true).decide().await,
            ShutdownKind::Uninstall
        );
        // Another name.
        server.apply(
            DAEMONSETS,
            json!({"metadata": {"name": "istio-cni-node-canary", "namespace": "istio-system"}}),
        );
        let canary = lookup.with_name("istio-cni-node-canary");
        assert!(matches!(
            canary.lookup_once().await,
            Ok(DaemonSetState::Active)
        ));
    }

    /// A failed lookup names the object it asked about and the cause.
    #[tokio::test]
    async fn lookup_errors_name_the_failing_input() {
        use Setup::*;
        // (setup, words the message must contain)
        let cases: [(Setup, &[&str]); 4] = [
            (
                Garbage,
                &["DaemonSet istio-system/istio-cni-node", "unexpected shape"],
            ),
            (
                FailOnceThenPresent,
                &["DaemonSet istio-system/istio-cni-node", "500"],
            ),
            (
                FailOnceThenAbsent,
                &["DaemonSet istio-system/istio-cni-node", "503"],
            ),
            (NodeFailsOnce, &["node n1", "500"]),
        ];
        for (setup, words) in cases {
            let server = server_for(setup).await;
            let lookup = KubeDaemonSetLookup::new(
                Client::new(server.config()).unwrap(),
                "istio-system",
                "n1",
            );
            let message = match lookup.lookup_once().await {
                Err(e) => e.to_string(),
                Ok(state) => panic!("{setup:?}: decided {state:?}"),
            };
            for word in words {
                assert!(message.contains(word), "{setup:?}: {message}");
            }
        }
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn node_affinity_rules() {
        let node = labels(&[("kubernetes.io/os", "linux"), ("gpu", "4"), ("zone", "a")]);
        let term = |exprs: Value| json!({"nodeSelectorTerms": [{"matchExpressions": exprs}]});
        let expr = |key: &str, op: &str, values: &[&str]| json!({"key": key, "operator": op, "values": values});
        // (required node affinity, matches "n1" with `node` labels)
        let cases = [
            (
                term(json!([expr("kubernetes.io/os", "In", &["linux"])])),
                true,
            ),
            (
                term(json!([expr("kubernetes.io/os", "In", &["windows"])])),
                false,
            ),
            (term(json!([expr("zone", "NotIn", &["b", "c"])])), true),
            (term(json!([expr("zone", "NotIn", &["a"])])), false),
            (term(json!([expr("missing", "NotIn", &["a"])])), true),
            (term(json!([expr("gpu", "Exists", &[])])), true),
            (term(json!([expr("gpu", "DoesNotExist", &[])])), false),
            (term(json!([expr("gpu", "Gt", &["3"])])), true),
            (term(json!([expr("gpu", "Lt", &["3"])])), false),
            (term(json!([expr("zone", "Gt", &["3"])])), false),
            (term(json!([expr("gpu", "Gt", &["x"])])), false),
            (term(json!([expr("gpu", "Sideways", &["4"])])), false),
            // ANDed within a term.
            (
                term(json!([
                    expr("zone", "In", &["a"]),
                    expr("gpu", "In", &["8"])
                ])),
                false,
            ),
            // ORed across terms; an empty term matches nothing.
            (
                json!({"nodeSelectorTerms": [{}, {"matchExpressions": [expr("zone", "In", &["a"])]}]}),
                true,
            ),
            (json!({"nodeSelectorTerms": [{}]}), false),
            (json!({"nodeSelectorTerms": []}), false),
            (
                json!({"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", "In", &["n1"])]}]}),
                true,
            ),
            (
                json!({"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", "NotIn", &["n1"])]}]}),
                false,
            ),
            (
                json!({"nodeSelectorTerms": [{"matchFields": [expr("spec.x", "In", &["n1"])]}]}),
                false,
            ),
        ];
        for (required, want) in cases {
            let sel = NodeSelector::deserialize(&required).unwrap();
            assert_eq!(sel.matches("n1", &node), want, "{required}");
        }
    }
}
