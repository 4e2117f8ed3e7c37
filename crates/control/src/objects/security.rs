//! `security.istio.io` PeerAuthentication and AuthorizationPolicy (v1 and v1beta1 have the
//! same shape for the fields read here).
//!
//! Unlike the other kinds, these refuse unknown fields at every depth below `metadata`
//! (`deny_unknown_fields`): a misspelt key would otherwise read as an absent one, and an
//! absent condition widens a policy (`from: [{source: {principal: [...]}}]` would be an
//! ALLOW from anyone). Every field the Istio API defines is known here, including those
//! ztunnel can not enforce; `metadata` and `status` stay tolerant (the API server adds to
//! both). An object refused this way is an error for a file source; the Kubernetes source
//! keeps it in its fail-closed form instead ([`AuthorizationPolicy::rejected`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer};

use super::meta::{ObjectMeta, nullable};

/// A field whose content is accepted and not read (`apiVersion`, `kind`, `status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ignored;

impl<'de> Deserialize<'de> for Ignored {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Ignored)
    }
}

/// `spec.selector`: workloads in the object's namespace with all these labels. An absent
/// selector and one with no labels both mean "the whole namespace" (as in Istio).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerAuthentication {
    #[serde(default)]
    pub api_version: Ignored,
    #[serde(default)]
    pub kind: Ignored,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PeerAuthenticationSpec,
    #[serde(default)]
    pub status: Ignored,
    /// Set (never read from the object) when the Kubernetes source kept a refused object in
    /// its fail-closed form: the reason. Such a PeerAuthentication counts as STRICT for its
    /// whole scope, without port-level exceptions.
    #[serde(skip)]
    pub rejected: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerAuthenticationSpec {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub mtls: Option<Mtls>,
    /// Per-port overrides; only meaningful with a selector. Keys are numbers in YAML and
    /// strings in JSON (the API server's form); both read.
    #[serde(default, deserialize_with = "port_map")]
    pub port_level_mtls: BTreeMap<u16, Mtls>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// `spec.mtls.mode`, `UNSET` when absent; STRICT for a [`Self::rejected`] object.
    pub fn mode(&self) -> MtlsMode {
        if self.rejected.is_some() {
            return MtlsMode::Strict;
        }
        self.spec.mtls.map(|m| m.mode).unwrap_or_default()
    }

    /// The fail-closed stand-in for a refused object: its metadata and selector, STRICT,
    /// no port-level settings.
    pub fn rejected(
        metadata: ObjectMeta,
        selector: Option<WorkloadSelector>,
        reason: String,
    ) -> Self {
        Self {
            metadata,
            spec: PeerAuthenticationSpec {
                selector,
                mtls: Some(Mtls {
                    mode: MtlsMode::Strict,
                }),
                port_level_mtls: BTreeMap::new(),
            },
            rejected: Some(reason),
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorizationPolicy {
    #[serde(default)]
    pub api_version: Ignored,
    #[serde(default)]
    pub kind: Ignored,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: AuthorizationPolicySpec,
    #[serde(default)]
    pub status: Ignored,
    /// Set (never read from the object) when the Kubernetes source kept a refused object in
    /// its fail-closed form: the reason. Translation then sends the policy as it sends one
    /// with an unparseable value: an ALLOW allows nothing, a DENY denies everything in scope.
    #[serde(skip)]
    pub rejected: Option<String>,
}

impl AuthorizationPolicy {
    /// The fail-closed stand-in for a refused object: its metadata and the fields that decide
    /// where it applies (selector, targetRefs, action); no rules.
    pub fn rejected(
        metadata: ObjectMeta,
        selector: Option<WorkloadSelector>,
        target_refs: Vec<TargetRef>,
        action: AuthzAction,
        reason: String,
    ) -> Self {
        Self {
            metadata,
            spec: AuthorizationPolicySpec {
                selector,
                target_refs,
                action,
                ..AuthorizationPolicySpec::default()
            },
            rejected: Some(reason),
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
    /// The external authorizer of a CUSTOM policy (never ztunnel's).
    #[serde(default)]
    pub provider: Option<Provider>,
    /// `None` and `Some([])` are the same: no rules (an ALLOW policy then allows nothing).
    #[serde(default, deserialize_with = "nullable")]
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetRef {
    #[serde(default, deserialize_with = "nullable")]
    pub group: String,
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
}

/// `spec.provider` of a CUSTOM policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
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
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default, deserialize_with = "nullable")]
    pub from: Vec<RuleFrom>,
    #[serde(default, deserialize_with = "nullable")]
    pub to: Vec<RuleTo>,
    #[serde(default, deserialize_with = "nullable")]
    pub when: Vec<Condition>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFrom {
    /// `None` when absent or null (Istio's validation refuses that; translation too).
    #[serde(default)]
    pub source: Option<Source>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
    pub trust_domains: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub not_trust_domains: Vec<String>,
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
#[serde(deny_unknown_fields)]
pub struct RuleTo {
    /// `None` when absent or null (Istio's validation refuses that; translation too).
    #[serde(default)]
    pub operation: Option<Operation>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    pub key: String,
    #[serde(default, deserialize_with = "strings_or_numbers")]
    pub values: Vec<String>,
    #[serde(default, deserialize_with = "strings_or_numbers")]
    pub not_values: Vec<String>,
}

/// A map keyed by port number, the key an integer or a string holding one.
fn port_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u16, Mtls>, D::Error> {
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    struct Port(u16);
    impl<'de> Deserialize<'de> for Port {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl serde::de::Visitor<'_> for V {
                type Value = Port;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a port number (0-65535)")
                }
                fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Port, E> {
                    u16::try_from(v)
                        .map(Port)
                        .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
                }
                fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Port, E> {
                    u16::try_from(v)
                        .map(Port)
                        .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Port, E> {
                    v.parse()
                        .map(Port)
                        .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
                }
            }
            d.deserialize_any(V)
        }
    }
    let map: Option<BTreeMap<Port, Mtls>> = Option::deserialize(d)?;
    Ok(map
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.0, v))
        .collect())
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
