//! AuthorizationPolicy → `istio.security.Authorization`, following istiod's ambient conversion
//! (`pilot/pkg/serviceregistry/ambient/authorization.go`, `convertAuthorizationPolicy` and
//! `handleRule`) field by field, and stricter where it would fail open.
//!
//! - Scope: a policy with a selector is WORKLOAD_SELECTOR (workloads list it by key); without
//!   one it is NAMESPACE, or GLOBAL in the root namespace.
//! - A rule becomes one `Rule` whose clauses are AND-ed: one clause with a match per `from`
//!   entry (OR-ed), one with a match per `to` entry (OR-ed), one per `when` condition. Inside
//!   one match the fields of one source (or operation, or condition) are AND-ed, the values of
//!   one field OR-ed (positive) or NOR-ed (negative), as ztunnel evaluates them.
//! - Source fields: `principals`/`namespaces` (and `not…`) become string matches (`*` =
//!   presence, `prefix*`, `*suffix`, else exact); `ipBlocks`/`notIpBlocks` source CIDRs;
//!   `serviceAccounts` `ns/sa` pairs, a bare `sa` in the policy's namespace. Operation:
//!   `ports`/`notPorts`. Conditions: `source.ip`, `source.namespace`, `source.principal`,
//!   `destination.ip`, `destination.port`.
//! - Everything else ztunnel can not check at L4: `remoteIpBlocks` (the client address behind
//!   proxies, not the peer address), request principals, hosts, methods, paths, every other
//!   `when` key (`remote.ip` and `source.serviceAccount` included), and `trustDomains` (which
//!   istiod drops silently, widening an ALLOW). An ALLOW rule using any of them is dropped
//!   (it could never match; a policy whose rules are all dropped still exists and allows
//!   nothing), as istiod does. A DENY rule loses those conditions and so matches more broadly;
//!   where that leaves a `from` or `to` entry with no condition, the entry matches anyone and
//!   its clause is left out (istiod sends an empty match there, which ztunnel skips, so its
//!   DENY never fires: fail open). Either way translation never widens what a policy allows.
//! - What Istio's validation refuses, and a value that can not be parsed (a port, a CIDR, a
//!   service account, an empty source/operation, a condition without values,
//!   `serviceAccounts` beside `principals`/`namespaces`) rejects the whole policy,
//!   fail-closed: an ALLOW policy is sent with no rules (allows nothing), a DENY policy with
//!   one empty rule (denies everything in its scope). So is a policy the Kubernetes source
//!   kept in its refused form ([`AuthorizationPolicy::rejected`]).
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
    AuthorizationPolicy, AuthzAction, Condition, Operation, Rule as SpecRule, Source, labels_match,
    selector_labels,
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
        Some(v) => ambit_contract::values::parse_bool(v).unwrap_or_else(|_| {
            warnings.push(format!(
                "{label}: annotation {DRY_RUN_ANNOTATION}={v:?} is not a boolean; ignored"
            ));
            false
        }),
    };
    let fail_closed = |warnings: &mut Vec<String>, why: String| {
        let outcome = match action {
            Action::Allow => "ALLOW policy sent without rules (allows nothing)",
            Action::Deny => "DENY policy sent with one empty rule (denies everything)",
        };
        warnings.push(format!("{label}: rejected: {why}; {outcome}"));
        let rules = match action {
            Action::Allow => Vec::new(),
            Action::Deny => vec![Rule::default()],
        };
        Authorization {
            key: key.clone(),
            scope,
            action,
            dry_run,
            rules,
        }
    };
    if let Some(reason) = &ap.rejected {
        return Some(fail_closed(warnings, reason.clone()));
    }
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let converted = match convert_rule(action, rule, &meta.namespace) {
            Ok(converted) => converted,
            Err(bad) => return Some(fail_closed(warnings, format!("rules[{i}].{bad}"))),
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

fn convert_rule(action: Action, rule: &SpecRule, namespace: &str) -> Result<Converted, Bad> {
    let mut l7 = Vec::new();
    let mut clauses = Vec::new();

    let mut from = Vec::new();
    let mut from_any = false;
    for (j, entry) in rule.from.iter().enumerate() {
        let path = |field: &str| format!("from[{j}].source.{field}");
        let s = match &entry.source {
            None => return Err(format!("from[{j}].source: missing")),
            Some(s) if *s == Source::default() => {
                return Err(format!("from[{j}].source: empty (Istio refuses it)"));
            }
            Some(s) => s,
        };
        let identity_fields = [
            &s.principals,
            &s.not_principals,
            &s.namespaces,
            &s.not_namespaces,
        ];
        if identity_fields.iter().any(|v| !v.is_empty())
            && !(s.service_accounts.is_empty() && s.not_service_accounts.is_empty())
        {
            return Err(format!(
                "from[{j}].source: serviceAccounts can not be combined with principals or \
                 namespaces (Istio refuses it)"
            ));
        }
        // Checked although never sent: Istio refuses a bad remote CIDR too.
        cidrs(&path("remoteIpBlocks"), &s.remote_ip_blocks)?;
        cidrs(&path("notRemoteIpBlocks"), &s.not_remote_ip_blocks)?;
        for (field, values) in [
            ("requestPrincipals", &s.request_principals),
            ("notRequestPrincipals", &s.not_request_principals),
            ("remoteIpBlocks", &s.remote_ip_blocks),
            ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
            ("trustDomains", &s.trust_domains),
            ("notTrustDomains", &s.not_trust_domains),
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
            service_accounts: service_accounts(
                &path("serviceAccounts"),
                namespace,
                &s.service_accounts,
            )?,
            not_service_accounts: service_accounts(
                &path("notServiceAccounts"),
                namespace,
                &s.not_service_accounts,
            )?,
            source_ips: cidrs(&path("ipBlocks"), &s.ip_blocks)?,
            not_source_ips: cidrs(&path("notIpBlocks"), &s.not_ip_blocks)?,
            ..Match::default()
        };
        if m.is_empty() {
            // Only attributes ztunnel can not check: the entry matches anyone (DENY; an
            // ALLOW rule with such an entry is dropped below).
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
        let path = |field: &str| format!("to[{j}].operation.{field}");
        let op = match &entry.operation {
            None => return Err(format!("to[{j}].operation: missing")),
            Some(op) if *op == Operation::default() => {
                return Err(format!("to[{j}].operation: empty (Istio refuses it)"));
            }
            Some(op) => op,
        };
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
            Some(m) => clauses.push(Clause { matches: vec![m] }),
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

/// A `when` condition as a match; `None` for keys ztunnel can not check. The L4 keys are
/// istiod's: `source.ip`, `source.namespace`, `source.principal`, `destination.ip`,
/// `destination.port` (`remote.ip` and `source.serviceAccount` are not among them).
fn condition(path: &str, cond: &Condition) -> Result<Option<Match>, Bad> {
    let (pos, neg) = (&cond.values, &cond.not_values);
    if cond.key.is_empty() {
        return Err(format!("{path}.key: empty (Istio refuses it)"));
    }
    if pos.is_empty() && neg.is_empty() {
        return Err(format!(
            "{path}: neither values nor notValues for key {:?} (Istio refuses it)",
            cond.key
        ));
    }
    let vpath = format!("{path}.values");
    let npath = format!("{path}.notValues");
    let m = match cond.key.as_str() {
        "source.ip" => Match {
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

/// `namespace/name` pairs, or a bare `name` in the policy's namespace (as istiod); Istio's
/// validation refuses wildcards, empty parts and more than one `/`, and so does this.
fn service_accounts(
    path: &str,
    namespace: &str,
    values: &[String],
) -> Result<Vec<ServiceAccountMatch>, Bad> {
    values
        .iter()
        .map(|v| {
            let (ns, sa) = v.split_once('/').unwrap_or((namespace, v.as_str()));
            if ns.is_empty() || sa.is_empty() || sa.contains('/') || v.contains('*') {
                return Err(format!(
                    "{path} {v:?}: not a \"serviceaccount\" or \"namespace/serviceaccount\""
                ));
            }
            Ok(ServiceAccountMatch {
                namespace: ns.to_string(),
                service_account: sa.to_string(),
            })
        })
        .collect()
}
