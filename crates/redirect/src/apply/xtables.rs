//! The iptables procedure (`spec/cni.md` §3.6): state check, apply, reconcile, verify, delete.

use std::collections::BTreeMap;

use super::{ApplyError, ApplyOutcome, Finding, Location, step};
use crate::config::Family;
use crate::iptables::save::{self, Saved};
use crate::iptables::{self, RuleSet, XtablesCmd, guardrail_rules};
use crate::runner::{Cmd, NetnsRunner};

/// What the kernel holds compared to a plan, for one family.
pub(crate) struct Inspection {
    saved: Saved,
    observed: BTreeMap<(String, String), usize>,
    planned: BTreeMap<(String, String), usize>,
    /// Indexes into the plan of rules `-C` did not find.
    missing: Vec<usize>,
}

impl Inspection {
    fn is_clean_slate(&self) -> bool {
        self.observed.is_empty()
    }

    fn is_exact(&self) -> bool {
        self.missing.is_empty() && self.observed == self.planned
    }
}

fn save(r: &dyn NetnsRunner, family: Family) -> Result<Saved, ApplyError> {
    let out = r
        .run_ok(&Cmd::new([iptables::save_binary(family)]))
        .map_err(step("iptables-save"))?;
    Ok(Saved::parse(&out.stdout))
}

pub(crate) fn inspect(
    r: &dyn NetnsRunner,
    family: Family,
    plan: &RuleSet,
) -> Result<Inspection, ApplyError> {
    let saved = save(r, family)?;
    let observed = saved.counts();
    let planned = save::planned_counts(plan);
    let mut missing = Vec::new();
    if !observed.is_empty() {
        for (i, rule) in plan.rules.iter().enumerate() {
            let cmd = XtablesCmd {
                family,
                args: rule.check_args(),
            };
            let out = r.run(&cmd.cmd()).map_err(step("iptables -C"))?;
            if !out.success() {
                missing.push(i);
            }
        }
    } else {
        missing = (0..plan.rules.len()).collect();
    }
    Ok(Inspection {
        saved,
        observed,
        planned,
        missing,
    })
}

pub(crate) fn restore(
    r: &dyn NetnsRunner,
    family: Family,
    plan: &RuleSet,
) -> Result<(), ApplyError> {
    let cmd = Cmd::new([iptables::restore_binary(family), "--noflush", "-v"])
        .with_stdin(plan.render_restore());
    r.run_ok(&cmd).map_err(step("iptables-restore"))?;
    Ok(())
}

/// Run commands whose failure is expected when the object is already gone.
fn run_ignoring(r: &dyn NetnsRunner, cmds: &[XtablesCmd]) -> Result<(), ApplyError> {
    for c in cmds {
        let out = r.run(&c.cmd()).map_err(step("iptables cleanup"))?;
        if !out.success() {
            tracing::trace!(cmd = %c.argv().join(" "), stderr = %out.stderr.trim(), "ignored");
        }
    }
    Ok(())
}

/// Remove every `ISTIO_*` chain and every jump to one, as found in a fresh save.
fn remove_leftovers(r: &dyn NetnsRunner, family: Family) -> Result<(), ApplyError> {
    let saved = save(r, family)?;
    let mut cmds = Vec::new();
    for (table, rule) in saved.istio_rules() {
        if !save::is_istio_chain(&rule.chain) {
            let mut args = vec![
                "-t".to_owned(),
                table.clone(),
                "-D".into(),
                rule.chain.clone(),
            ];
            args.extend(rule.args.iter().cloned());
            cmds.push(XtablesCmd { family, args });
        }
    }
    let chains = saved.istio_chains();
    for op in ["-F", "-X"] {
        for (table, chain) in &chains {
            cmds.push(XtablesCmd::new(family, &["-t", table, op, chain]));
        }
    }
    run_ignoring(r, &cmds)
}

/// Apply one family's plan with the state check of §3.6.
pub(crate) fn apply(
    r: &dyn NetnsRunner,
    family: Family,
    plan: &RuleSet,
    reconcile: bool,
) -> Result<ApplyOutcome, ApplyError> {
    let state = inspect(r, family, plan)?;
    if state.is_clean_slate() {
        restore(r, family, plan)?;
        return Ok(ApplyOutcome::Applied);
    }
    if state.is_exact() {
        return Ok(ApplyOutcome::Unchanged);
    }
    if !reconcile {
        tracing::warn!(
            ?family,
            "stale in-pod rules found and reconcile is disabled; applying on top"
        );
        restore(r, family, plan)?;
        return Ok(ApplyOutcome::AppliedOnTop);
    }
    tracing::info!(
        ?family,
        missing = state.missing.len(),
        "reconciling in-pod rules"
    );
    let guards = guardrail_rules();
    for g in &guards {
        r.run_ok(
            &XtablesCmd {
                family,
                args: g.add_args(),
            }
            .cmd(),
        )
        .map_err(step("insert guardrail"))?;
    }
    let result = (|| {
        let mut cmds: Vec<XtablesCmd> = plan
            .rules
            .iter()
            .rev()
            .map(|rule| XtablesCmd {
                family,
                args: rule.delete_args(),
            })
            .collect();
        for op in ["-F", "-X"] {
            for table in plan.tables() {
                for chain in plan.chains(table) {
                    cmds.push(XtablesCmd::new(
                        family,
                        &["-t", table.name(), op, chain.name()],
                    ));
                }
            }
        }
        run_ignoring(r, &cmds)?;
        remove_leftovers(r, family)?;
        restore(r, family, plan)
    })();
    // Guardrails come out whatever happened: leaving them would cut the pod off entirely.
    let unguard: Vec<XtablesCmd> = guards
        .iter()
        .map(|g| XtablesCmd {
            family,
            args: g.delete_args(),
        })
        .collect();
    run_ignoring(r, &unguard)?;
    result.map(|()| ApplyOutcome::Reconciled)
}

/// Compare one family's kernel state to a plan.
pub(crate) fn verify(
    r: &dyn NetnsRunner,
    family: Family,
    plan: &RuleSet,
) -> Result<Vec<Finding>, ApplyError> {
    verify_full(r, family, plan).map(|(findings, _)| findings)
}

/// [`verify`], plus whether the tools that answered are the nf_tables variant of iptables
/// (then the rules they judged are in the kernel's nf_tables ruleset).
pub(crate) fn verify_full(
    r: &dyn NetnsRunner,
    family: Family,
    plan: &RuleSet,
) -> Result<(Vec<Finding>, bool), ApplyError> {
    let state = inspect(r, family, plan)?;
    let nf_tables = state.saved.nf_tables;
    let loc = |table: &str, chain: &str| Location {
        family: Some(family),
        table: table.to_owned(),
        chain: chain.to_owned(),
    };
    let mut findings = Vec::new();
    let observed_chains = state.saved.istio_chains();
    for (table, chain) in state.planned.keys() {
        if save::is_istio_chain(chain) && !observed_chains.contains(&(table.clone(), chain.clone()))
        {
            findings.push(Finding::MissingChain(loc(table, chain)));
        }
    }
    for (table, chain) in &observed_chains {
        if !state.planned.contains_key(&(table.clone(), chain.clone())) {
            findings.push(Finding::ExtraChain(loc(table, chain)));
        }
    }
    for &i in &state.missing {
        let rule = &plan.rules[i];
        findings.push(Finding::MissingRule {
            at: loc(rule.table.name(), rule.chain.name()),
            rule: rule.restore_line(),
        });
    }
    // Extra rules: a chain holding more rules than the planned ones the kernel confirmed.
    for ((table, chain), &found) in &state.observed {
        let mut present_keys: Vec<_> = plan
            .rules
            .iter()
            .enumerate()
            .filter(|(i, rule)| {
                rule.table.name() == table
                    && rule.chain.name() == chain
                    && !state.missing.contains(i)
            })
            .map(|(_, rule)| save::rule_key(rule))
            .collect();
        if found <= present_keys.len() {
            continue;
        }
        let excess = found - present_keys.len();
        let mut extras = Vec::new();
        let saved_rules = state.saved.istio_rules();
        for (_, sr) in saved_rules
            .iter()
            .filter(|(t, sr)| t == table && &sr.chain == chain)
        {
            let key = save::canonical_key(&sr.args);
            if let Some(pos) = present_keys.iter().position(|k| *k == key) {
                present_keys.swap_remove(pos);
            } else {
                extras.push(sr.line.clone());
            }
        }
        if extras.len() == excess {
            findings.extend(extras.into_iter().map(|l| Finding::ExtraRule {
                at: loc(table, chain),
                rule: Some(l),
            }));
        } else {
            // The canonical form could not single them out; still report how many.
            findings.extend((0..excess).map(|_| Finding::ExtraRule {
                at: loc(table, chain),
                rule: None,
            }));
        }
    }
    Ok((findings, nf_tables))
}

/// Run a fixed delete list, ignoring individual failures (§3.6: objects may be absent).
pub(crate) fn delete(r: &dyn NetnsRunner, cmds: &[XtablesCmd]) -> Result<(), ApplyError> {
    run_ignoring(r, cmds)
}
