//! `istio.security.Authorization` ↔ [`Authorization`].

use ambit_proto::security as ps;

use super::{ConversionError, ConversionErrorKind, Ctx, ResourceType};
use crate::addr::{self, Cidr};
use crate::authz::{
    Action, Authorization, Clause, Match, Rule, Scope, ServiceAccountMatch, StringMatch,
};
use crate::names::PolicyKey;

impl TryFrom<ps::Authorization> for Authorization {
    type Error = ConversionError;

    fn try_from(a: ps::Authorization) -> Result<Self, Self::Error> {
        let ctx = Ctx::new(
            ResourceType::Authorization,
            format!("{}/{}", a.namespace, a.name),
        );
        if a.namespace.is_empty() {
            return Err(ctx.err("namespace", ConversionErrorKind::Missing));
        }
        if a.name.is_empty() {
            return Err(ctx.err("name", ConversionErrorKind::Missing));
        }
        let key = ctx.at("namespace/name", PolicyKey::new(a.namespace, a.name))?;
        let scope = ctx.enumeration("scope", a.scope, |s: ps::Scope| match s {
            ps::Scope::Global => Scope::Global,
            ps::Scope::Namespace => Scope::Namespace,
            ps::Scope::WorkloadSelector => Scope::WorkloadSelector,
        })?;
        let action = ctx.enumeration("action", a.action, |s: ps::Action| match s {
            ps::Action::Allow => Action::Allow,
            ps::Action::Deny => Action::Deny,
        })?;
        let rules = a
            .rules
            .iter()
            .map(|r| {
                let clauses = r
                    .clauses
                    .iter()
                    .map(|c| {
                        let matches = c
                            .matches
                            .iter()
                            .map(|m| to_match(&ctx, m))
                            .collect::<Result<_, _>>()?;
                        Ok(Clause { matches })
                    })
                    .collect::<Result<_, ConversionError>>()?;
                Ok(Rule { clauses })
            })
            .collect::<Result<_, ConversionError>>()?;
        Ok(Authorization {
            key,
            scope,
            action,
            dry_run: a.dry_run,
            rules,
        })
    }
}

fn to_match(ctx: &Ctx, m: &ps::Match) -> Result<Match, ConversionError> {
    let strings = |field: &'static str,
                   list: &[ps::StringMatch]|
     -> Result<Vec<StringMatch>, ConversionError> {
        list.iter()
            .map(|s| {
                use ps::string_match::MatchType;
                match &s.match_type {
                    Some(MatchType::Exact(v)) => Ok(StringMatch::Exact(v.clone())),
                    Some(MatchType::Prefix(v)) => Ok(StringMatch::Prefix(v.clone())),
                    Some(MatchType::Suffix(v)) => Ok(StringMatch::Suffix(v.clone())),
                    Some(MatchType::Presence(())) => Ok(StringMatch::Presence),
                    None => Err(ctx.err(field, ConversionErrorKind::Missing)),
                }
            })
            .collect()
    };
    let cidrs = |field: &'static str, list: &[ps::Address]| -> Result<Vec<Cidr>, ConversionError> {
        list.iter()
            .map(|a| ctx.cidr(field, &a.address, a.length))
            .collect()
    };
    let ports = |field: &'static str, list: &[u32]| -> Result<Vec<u16>, ConversionError> {
        list.iter().map(|p| ctx.port(field, *p)).collect()
    };
    let accounts = |list: &[ps::ServiceAccountMatch]| -> Vec<ServiceAccountMatch> {
        list.iter()
            .map(|a| ServiceAccountMatch {
                namespace: a.namespace.clone(),
                service_account: a.service_account.clone(),
            })
            .collect()
    };
    Ok(Match {
        namespaces: strings("rules.clauses.matches.namespaces", &m.namespaces)?,
        not_namespaces: strings("rules.clauses.matches.not_namespaces", &m.not_namespaces)?,
        principals: strings("rules.clauses.matches.principals", &m.principals)?,
        not_principals: strings("rules.clauses.matches.not_principals", &m.not_principals)?,
        source_ips: cidrs("rules.clauses.matches.source_ips", &m.source_ips)?,
        not_source_ips: cidrs("rules.clauses.matches.not_source_ips", &m.not_source_ips)?,
        destination_ips: cidrs("rules.clauses.matches.destination_ips", &m.destination_ips)?,
        not_destination_ips: cidrs(
            "rules.clauses.matches.not_destination_ips",
            &m.not_destination_ips,
        )?,
        destination_ports: ports(
            "rules.clauses.matches.destination_ports",
            &m.destination_ports,
        )?,
        not_destination_ports: ports(
            "rules.clauses.matches.not_destination_ports",
            &m.not_destination_ports,
        )?,
        service_accounts: accounts(&m.service_accounts),
        not_service_accounts: accounts(&m.not_service_accounts),
    })
}

impl From<&Authorization> for ps::Authorization {
    fn from(a: &Authorization) -> Self {
        ps::Authorization {
            name: a.key.name().to_string(),
            namespace: a.key.namespace().to_string(),
            scope: match a.scope {
                Scope::Global => ps::Scope::Global,
                Scope::Namespace => ps::Scope::Namespace,
                Scope::WorkloadSelector => ps::Scope::WorkloadSelector,
            } as i32,
            action: match a.action {
                Action::Allow => ps::Action::Allow,
                Action::Deny => ps::Action::Deny,
            } as i32,
            rules: a
                .rules
                .iter()
                .map(|r| ps::Rule {
                    clauses: r
                        .clauses
                        .iter()
                        .map(|c| ps::Clause {
                            matches: c.matches.iter().map(from_match).collect(),
                        })
                        .collect(),
                })
                .collect(),
            dry_run: a.dry_run,
            extensions: Vec::new(),
        }
    }
}

fn from_match(m: &Match) -> ps::Match {
    use ps::string_match::MatchType;
    let strings = |list: &[StringMatch]| -> Vec<ps::StringMatch> {
        list.iter()
            .map(|s| ps::StringMatch {
                match_type: Some(match s {
                    StringMatch::Exact(v) => MatchType::Exact(v.clone()),
                    StringMatch::Prefix(v) => MatchType::Prefix(v.clone()),
                    StringMatch::Suffix(v) => MatchType::Suffix(v.clone()),
                    StringMatch::Presence => MatchType::Presence(()),
                }),
            })
            .collect()
    };
    let cidrs = |list: &[Cidr]| -> Vec<ps::Address> {
        list.iter()
            .map(|c| ps::Address {
                address: addr::ip_to_bytes(c.addr()),
                length: u32::from(c.prefix_len()),
            })
            .collect()
    };
    let ports = |list: &[u16]| -> Vec<u32> { list.iter().map(|p| u32::from(*p)).collect() };
    let accounts = |list: &[ServiceAccountMatch]| -> Vec<ps::ServiceAccountMatch> {
        list.iter()
            .map(|a| ps::ServiceAccountMatch {
                namespace: a.namespace.clone(),
                service_account: a.service_account.clone(),
            })
            .collect()
    };
    ps::Match {
        namespaces: strings(&m.namespaces),
        not_namespaces: strings(&m.not_namespaces),
        principals: strings(&m.principals),
        not_principals: strings(&m.not_principals),
        source_ips: cidrs(&m.source_ips),
        not_source_ips: cidrs(&m.not_source_ips),
        destination_ips: cidrs(&m.destination_ips),
        not_destination_ips: cidrs(&m.not_destination_ips),
        destination_ports: ports(&m.destination_ports),
        not_destination_ports: ports(&m.not_destination_ports),
        service_accounts: accounts(&m.service_accounts),
        not_service_accounts: accounts(&m.not_service_accounts),
        extensions: Vec::new(),
    }
}
