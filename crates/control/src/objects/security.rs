//! `security.istio.io` PeerAuthentication and AuthorizationPolicy (v1 and v1beta1 have the
//! same shape for the fields read here).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer};

use super::meta::{ObjectMeta, nullable};

/// `spec.selector`: workloads in the object's namespace with all these labels. An absent
/// selector and one with no labels both mean "the whole namespace" (as in Istio).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    #[serde(default, deserialize_with = "nullable")]
    pub match_labels: BTreeMap<String, String>,
}

/// The labels of a selector, `None` when it selects the whole namespace.
pub fn selector_labels(selector: &Option<WorkloadSelector>) -> Option<&BTreeMap<String, String>> {
    selector
        .as_ref()
        .map(|s| &s.match_labels)
        .filter(|labels| !labels.is_empty())
}

/// Whether `labels` satisfy every pair of `selector`.
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PeerAuthentication {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PeerAuthenticationSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub mtls: Option<Mtls>,
    /// Per-port overrides; only meaningful with a selector.
    #[serde(default, deserialize_with = "nullable")]
    pub port_level_mtls: BTreeMap<u16, Mtls>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Mtls {
    #[serde(default, deserialize_with = "nullable")]
    pub mode: MtlsMode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum MtlsMode {
    /// Inherit from the parent scope.
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

impl PeerAuthentication {
    /// `spec.mtls.mode`, `UNSET` when absent.
    pub fn mode(&self) -> MtlsMode {
        self.spec.mtls.map(|m| m.mode).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct AuthorizationPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: AuthorizationPolicySpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    /// Policies attached to a waypoint or gateway (`targetRef(s)`) are not for ztunnel.
    #[serde(default)]
    pub target_ref: Option<TargetRef>,
    #[serde(default, deserialize_with = "nullable")]
    pub target_refs: Vec<TargetRef>,
    #[serde(default, deserialize_with = "nullable")]
    pub action: AuthzAction,
    /// `None` and `Some([])` are the same: no rules (an ALLOW policy then allows nothing).
    #[serde(default, deserialize_with = "nullable")]
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TargetRef {
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum AuthzAction {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
}

impl fmt::Display for AuthzAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthzAction::Allow => "ALLOW",
            AuthzAction::Deny => "DENY",
            AuthzAction::Audit => "AUDIT",
            AuthzAction::Custom => "CUSTOM",
        })
    }
}

/// One rule: `from` entries OR-ed, `to` entries OR-ed, `when` conditions AND-ed, and the
/// three AND-ed together. A rule with none of them matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Rule {
    #[serde(default, deserialize_with = "nullable")]
    pub from: Vec<RuleFrom>,
    #[serde(default, deserialize_with = "nullable")]
    pub to: Vec<RuleTo>,
    #[serde(default, deserialize_with = "nullable")]
    pub when: Vec<Condition>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RuleFrom {
    #[serde(default, deserialize_with = "nullable")]
    pub source: Source,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    #[serde(default, deserialize_with = "nullable")]
    pub principals: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_principals: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub request_principals: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_request_principals: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub namespaces: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_namespaces: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub service_accounts: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_service_accounts: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub ip_blocks: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_ip_blocks: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub remote_ip_blocks: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_remote_ip_blocks: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RuleTo {
    #[serde(default, deserialize_with = "nullable")]
    pub operation: Operation,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    #[serde(default, deserialize_with = "nullable")]
    pub hosts: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_hosts: Vec<String>,
    /// Ports are strings in the Istio API; bare numbers are accepted too.
    #[serde(default, deserialize_with = "strings_or_numbers")]
    pub ports: Vec<String>,
    #[serde(default, deserialize_with = "strings_or_numbers")]
    pub not_ports: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub methods: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_methods: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub paths: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_paths: Vec<String>,
}

/// `when[]`: an attribute and the values it must (not) have.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    pub key: String,
    #[serde(default, deserialize_with = "strings_or_numbers")]
    pub values: Vec<String>,
    #[serde(default, deserialize_with = "strings_or_numbers")]
    pub not_values: Vec<String>,
}

/// A list whose entries may be strings or integers (`ports: [80, "443"]`), as text.
fn strings_or_numbers<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Text(String);
    impl<'de> Deserialize<'de> for Text {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl serde::de::Visitor<'_> for V {
                type Value = Text;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a string or an integer")
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
                fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
                fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
            }
            d.deserialize_any(V)
        }
    }
    let list: Option<Vec<Text>> = Option::deserialize(d)?;
    Ok(list.unwrap_or_default().into_iter().map(|t| t.0).collect())
}
