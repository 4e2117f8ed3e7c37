//! The nftables procedure (`spec/cni.md` §3.7): one atomic transaction to apply or delete;
//! verification from `nft list table`.

use super::{ApplyError, Finding, Location, step};
use crate::nft::list::ListedTable;
use crate::nft::{Table, Transaction};
use crate::runner::{Cmd, NetnsRunner};

/// Feed one transaction to `nft -f -` (all or nothing).
pub(crate) fn run_tx(
    r: &dyn NetnsRunner,
    tx: &Transaction,
    what: &'static str,
) -> Result<(), ApplyError> {
    r.run_ok(&Cmd::new(["nft", "-f", "-"]).with_stdin(tx.render()))
        .map_err(step(what))?;
    Ok(())
}

/// List a table; `None` when it does not exist.
pub(crate) fn list_table(
    r: &dyn NetnsRunner,
    name: &str,
) -> Result<Option<ListedTable>, ApplyError> {
    let out = r
        .run(&Cmd::new(["nft", "list", "table", "inet", name]))
        .map_err(step("nft list table"))?;
    Ok(out.success().then(|| ListedTable::parse(&out.stdout)))
}

/// Compare listed tables with planned ones. `owned` names every table this plan manages, so a
/// table the plan leaves out (raw with DNS capture off) is reported if present.
pub(crate) fn verify(
    r: &dyn NetnsRunner,
    planned: &[Table],
    owned: &[&'static str],
) -> Result<Vec<Finding>, ApplyError> {
    verify_listed(planned, owned, |name| list_table(r, name))
}

/// [`verify`] over listings from anywhere (`nft list table`, or nf_tables netlink):
/// `list` returns a table's chains, hooks and rule counts, `None` when it does not exist.
pub(crate) fn verify_listed(
    planned: &[Table],
    owned: &[&'static str],
    mut list: impl FnMut(&str) -> Result<Option<ListedTable>, ApplyError>,
) -> Result<Vec<Finding>, ApplyError> {
    let loc = |table: &str, chain: &str| Location {
        family: None,
        table: table.to_owned(),
        chain: chain.to_owned(),
    };
    let mut findings = Vec::new();
    let effective: Vec<Table> = planned
        .iter()
        .map(Table::effective)
        .filter(|t| !t.rules.is_empty())
        .collect();
    for name in owned {
        let plan = effective.iter().find(|t| t.name == *name);
        let listed = list(name)?;
        let (plan, listed) = match (plan, listed) {
            (None, None) => continue,
            (None, Some(l)) => {
                // A table holding only sets (host probe sets) is not ours to judge here.
                if !l.chains.is_empty() {
                    findings.push(Finding::ExtraTable(loc(name, "")));
                }
                continue;
            }
            (Some(_), None) => {
                findings.push(Finding::MissingTable(loc(name, "")));
                continue;
            }
            (Some(p), Some(l)) => (p, l),
        };
        for (chain, expected) in plan.rule_counts() {
            let Some(lc) = listed.chain(chain) else {
                findings.push(Finding::MissingChain(loc(name, chain)));
                continue;
            };
            let decl = plan.chains.iter().find(|c| c.name == chain);
            if let Some(hook) = decl.and_then(|c| c.hook)
                && lc.hook.as_deref() != Some(hook.hook)
            {
                findings.push(Finding::WrongHook {
                    at: loc(name, chain),
                    expected: hook.hook.to_owned(),
                    found: lc.hook.clone(),
                });
            }
            if lc.rules != expected {
                findings.push(Finding::RuleCount {
                    at: loc(name, chain),
                    expected,
                    found: lc.rules,
                });
            }
        }
        for lc in &listed.chains {
            if !plan.chains.iter().any(|c| c.name == lc.name) {
                findings.push(Finding::ExtraChain(loc(name, &lc.name)));
            }
        }
    }
    Ok(findings)
}
