//! AuthorizationPolicy → `istio.security.Authorization`.
//!
//! - Scope: a policy with a selector is WORKLOAD_SELECTOR (workloads list it by key); without
//!   one it is NAMESPACE, or GLOBAL in the root namespace.
//! - A rule becomes one `Rule` whose clauses are AND-ed: one clause with a match per `from`
//!   entry (OR-ed), one with a match per `to` entry (OR-ed), one per `when` condition. An
//!   entry with no L4 condition matches anything, so its clause is left out (a clause with an
//!   empty match would never match in ztunnel).
//! - `principals`/`namespaces` values become string matches: `*` = presence, `prefix*`,
//!   `*suffix`, else exact. `ipBlocks` and `remoteIpBlocks` become source CIDRs (at L4 the
//!   remote address is the source address), `serviceAccounts` `ns/sa` pairs, ports `u16`.
//! - L7 fields (hosts, methods, paths, request principals, `when` keys other than
//!   `source.{ip,namespace,principal,serviceAccount}`, `remote.ip`, `destination.{ip,port}`)
//!   can not be checked by ztunnel. As upstream ztunnel: an ALLOW rule using any of them is
//!   dropped (it could never match; a policy whose rules are all dropped still exists and
//!   allows nothing), a DENY rule just loses those conditions (it matches more broadly).
//!   Either way is deny-safe: translation never widens what a policy allows.
//! - A value that can not be parsed (a port, a CIDR, a service account) rejects the whole
//!   policy, fail-closed: an ALLOW policy is sent with no rules (allows nothing), a DENY
//!   policy with one empty rule (denies everything in its scope).
//! - AUDIT and CUSTOM policies, and policies attached to waypoints (`targetRef(s)`), are not
//!   ztunnel's: skipped.
//! - The annotation `istio.io/dry-run: "true"` sets `dry_run`.

use ambit_model::PolicyKey;
use ambit_model::addr::Cidr;
use ambit_model::authz::{
    Action, Authorization, Clause, Match, Rule, Scope, ServiceAccountMatch, StringMatch,
};

use super::Cluster;
use crate::objects::Pod;
use crate::objects::security::{
    AuthorizationPolicy, AuthzAction, Condition, Rule as SpecRule, labels_match, selector_labels,
};

/// Annotation that turns a policy into a dry-run policy (logged, never enforced).
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// Converts every AuthorizationPolicy of the cluster that ztunnel can enforce.
pub fn convert_all(cluster: &Cluster, warnings: &mut Vec<String>) -> Vec<Authorization> {
    cluster
        .objects
        .authorization_policies
        .iter()
        .filter_map(|ap| convert(&cluster.config.root_namespace, ap, warnings))
        .collect()
}

/// The keys of the selector-scoped policies (among `emitted`, sorted by key) that apply to
/// `pod`: those in its namespace whose selector matches its labels, and those in the root
/// namespace (which select across namespaces, as in Istio).
pub fn selected_policies(
    cluster: &Cluster,
    pod: &Pod,
    emitted: &[Authorization],
) -> Vec<PolicyKey> {
    let root = cluster.config.root_namespace.as_str();
    let ns = pod.metadata.namespace.as_str();
    cluster
        .objects
        .authorization_policies
        .iter()
        .filter(|ap| ap.metadata.namespace == ns || ap.metadata.namespace == root)
        .filter(|ap| {
            selector_labels(&ap.spec.selector)
                .is_some_and(|sel| labels_match(sel, &pod.metadata.labels))
        })
        .filter_map(|ap| PolicyKey::new(&ap.metadata.namespace, &ap.metadata.name).ok())
        .filter(|key| {
            emitted
                .binary_search_by(|p| p.key.cmp(key))
                .is_ok_and(|i| emitted[i].scope == Scope::WorkloadSelector)
        })
        .collect()
}

/// Converts one policy, or explains in `warnings` why it is skipped.
pub fn convert(
    root_namespace: &str,
    ap: &AuthorizationPolicy,
    warnings: &mut Vec<String>,
) -> Option<Authorization> {
    let meta = &ap.metadata;
    let key = match PolicyKey::new(&meta.namespace, &meta.name) {
        Ok(key) => key,
        Err(e) => {
            warnings.push(format!(
                "AuthorizationPolicy {}/{}: {e}; skipped",
                meta.namespace, meta.name
            ));
            return None;
        }
    };
    let label = format!("AuthorizationPolicy {key}");
    let spec = &ap.spec;
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        warnings.push(format!(
            "{label}: attached with targetRef(s) to a waypoint or gateway, not enforced by \
             ztunnel; skipped"
        ));
        return None;
    }
    let action = match spec.action {
        AuthzAction::Allow => Action::Allow,
        AuthzAction::Deny => Action::Deny,
        other => {
            warnings.push(format!(
                "{label}: action {other} is not supported by ztunnel; skipped"
            ));
            return None;
        }
    };
    let scope = match selector_labels(&spec.selector) {
        Some(_) => Scope::WorkloadSelector,
        None if meta.namespace == root_namespace => Scope::Global,
        None => Scope::Namespace,
    };
    let dry_run = match meta.annotations.get(DRY_RUN_ANNOTATION) {
        None => false,
        Some(v) => parse_go_bool(v).unwrap_or_else(|| {
            warnings.push(format!(
                "{label}: annotation {DRY_RUN_ANNOTATION}={v:?} is not a boolean; ignored"
            ));
            false
        }),
    };
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let converted = match convert_rule(action, rule) {
            Ok(converted) => converted,
            Err(bad) => {
                let outcome = match action {
                    Action::Allow => "ALLOW policy sent without rules (allows nothing)",
                    Action::Deny => "DENY policy sent with one empty rule (denies everything)",
                };
                warnings.push(format!("{label}: rejected: rules[{i}].{bad}; {outcome}"));
                let rules = match action {
                    Action::Allow => Vec::new(),
                    Action::Deny => vec![Rule::default()],
                };
                return Some(Authorization {
                    key,
                    scope,
                    action,
                    dry_run,
                    rules,
                });
            }
        };
        if !converted.l7.is_empty() {
            let outcome = match action {
                Action::Allow => "ALLOW rule dropped (it could never match at L4)",
                Action::Deny => "DENY rule kept without these conditions (matches more broadly)",
            };
            warnings.push(format!(
                "{label}: rules[{i}] uses L7 attributes ztunnel can not check ({}); {outcome}",
                converted.l7.join(", ")
            ));
        }
        rules.extend(converted.rule);
    }
    if action == Action::Allow && rules.is_empty() && !spec.rules.is_empty() {
        warnings.push(format!(
            "{label}: every rule was dropped; the ALLOW policy allows nothing"
        ));
    }
    Some(Authorization {
        key,
        scope,
        action,
        dry_run,
        rules,
    })
}

/// A converted rule: `None` when dropped; the L7 fields it used, by path.
struct Converted {
    rule: Option<Rule>,
    l7: Vec<String>,
}

/// Why a rule's value can not be used: `field "value": reason`.
type Bad = String;

fn convert_rule(action: Action, rule: &SpecRule) -> Result<Converted, Bad> {
    let mut l7 = Vec::new();
    let mut clauses = Vec::new();

    let mut from = Vec::new();
    let mut from_any = false;
    for (j, entry) in rule.from.iter().enumerate() {
        let s = &entry.source;
        let path = |field: &str| format!("from[{j}].source.{field}");
        for (field, values) in [
            ("requestPrincipals", &s.request_principals),
            ("notRequestPrincipals", &s.not_request_principals),
        ] {
            if !values.is_empty() {
                l7.push(path(field));
            }
        }
        let m = Match {
            principals: strings(&s.principals),
            not_principals: strings(&s.not_principals),
            namespaces: strings(&s.namespaces),
            not_namespaces: strings(&s.not_namespaces),
            service_accounts: service_accounts(&path("serviceAccounts"), &s.service_accounts)?,
            not_service_accounts: service_accounts(
                &path("notServiceAccounts"),
                &s.not_service_accounts,
            )?,
            source_ips: [
                cidrs(&path("ipBlocks"), &s.ip_blocks)?,
                cidrs(&path("remoteIpBlocks"), &s.remote_ip_blocks)?,
            ]
            .concat(),
            not_source_ips: [
                cidrs(&path("notIpBlocks"), &s.not_ip_blocks)?,
                cidrs(&path("notRemoteIpBlocks"), &s.not_remote_ip_blocks)?,
            ]
            .concat(),
            ..Match::default()
        };
        if m.is_empty() {
            from_any = true;
        } else {
            from.push(m);
        }
    }
    if !from.is_empty() && !from_any {
        clauses.push(Clause { matches: from });
    }

    let mut to = Vec::new();
    let mut to_any = false;
    for (j, entry) in rule.to.iter().enumerate() {
        let op = &entry.operation;
        let path = |field: &str| format!("to[{j}].operation.{field}");
        for (field, values) in [
            ("hosts", &op.hosts),
            ("notHosts", &op.not_hosts),
            ("methods", &op.methods),
            ("notMethods", &op.not_methods),
            ("paths", &op.paths),
            ("notPaths", &op.not_paths),
        ] {
            if !values.is_empty() {
                l7.push(path(field));
            }
        }
        let m = Match {
            destination_ports: ports(&path("ports"), &op.ports)?,
            not_destination_ports: ports(&path("notPorts"), &op.not_ports)?,
            ..Match::default()
        };
        if m.is_empty() {
            to_any = true;
        } else {
            to.push(m);
        }
    }
    if !to.is_empty() && !to_any {
        clauses.push(Clause { matches: to });
    }

    for (j, cond) in rule.when.iter().enumerate() {
        match condition(&format!("when[{j}]"), cond)? {
            Some(m) if !m.is_empty() => clauses.push(Clause { matches: vec![m] }),
            Some(_) => {}
            None => l7.push(format!("when[{j}] key {:?}", cond.key)),
        }
    }

    let rule = if action == Action::Allow && !l7.is_empty() {
        None
    } else {
        Some(Rule { clauses })
    };
    Ok(Converted { rule, l7 })
}

/// A `when` condition as a match; `None` for keys ztunnel can not check (L7).
fn condition(path: &str, cond: &Condition) -> Result<Option<Match>, Bad> {
    let (pos, neg) = (&cond.values, &cond.not_values);
    let vpath = format!("{path}.values");
    let npath = format!("{path}.notValues");
    let m = match cond.key.as_str() {
        "source.ip" | "remote.ip" => Match {
            source_ips: cidrs(&vpath, pos)?,
            not_source_ips: cidrs(&npath, neg)?,
            ..Match::default()
        },
        "source.namespace" => Match {
            namespaces: strings(pos),
            not_namespaces: strings(neg),
            ..Match::default()
        },
        "source.principal" => Match {
            principals: strings(pos),
            not_principals: strings(neg),
            ..Match::default()
        },
        "source.serviceAccount" => Match {
            service_accounts: service_accounts(&vpath, pos)?,
            not_service_accounts: service_accounts(&npath, neg)?,
            ..Match::default()
        },
        "destination.ip" => Match {
            destination_ips: cidrs(&vpath, pos)?,
            not_destination_ips: cidrs(&npath, neg)?,
            ..Match::default()
        },
        "destination.port" => Match {
            destination_ports: ports(&vpath, pos)?,
            not_destination_ports: ports(&npath, neg)?,
            ..Match::default()
        },
        _ => return Ok(None),
    };
    Ok(Some(m))
}

/// Istio's string match syntax: `*` = any non-empty value, `prefix*`, `*suffix`, else exact.
pub fn string_match(value: &str) -> StringMatch {
    if value == "*" {
        StringMatch::Presence
    } else if let Some(suffix) = value.strip_prefix('*') {
        StringMatch::Suffix(suffix.to_string())
    } else if let Some(prefix) = value.strip_suffix('*') {
        StringMatch::Prefix(prefix.to_string())
    } else {
        StringMatch::Exact(value.to_string())
    }
}

fn strings(values: &[String]) -> Vec<StringMatch> {
    values.iter().map(|v| string_match(v)).collect()
}

fn cidrs(path: &str, values: &[String]) -> Result<Vec<Cidr>, Bad> {
    values
        .iter()
        .map(|v| {
            v.parse::<Cidr>()
                .map_err(|_| format!("{path} {v:?}: not an IP address or CIDR"))
        })
        .collect()
}

fn ports(path: &str, values: &[String]) -> Result<Vec<u16>, Bad> {
    values
        .iter()
        .map(|v| match v.parse::<u16>() {
            Ok(p) if p != 0 => Ok(p),
            _ => Err(format!("{path} {v:?}: not a port number (1-65535)")),
        })
        .collect()
}

fn service_accounts(path: &str, values: &[String]) -> Result<Vec<ServiceAccountMatch>, Bad> {
    values
        .iter()
        .map(|v| match v.split_once('/') {
            Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => {
                Ok(ServiceAccountMatch {
                    namespace: ns.to_string(),
                    service_account: sa.to_string(),
                })
            }
            _ => Err(format!(
                "{path} {v:?}: not a \"namespace/serviceaccount\" pair"
            )),
        })
        .collect()
}

/// Go's `strconv.ParseBool`, which Istio uses for boolean annotations.
fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}
