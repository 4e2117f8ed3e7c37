//! Applying, verifying and removing the pod's policy-routing state (§3.1).

use super::{ApplyError, Finding, step};
use crate::config::Family;
use crate::netlink::{NetlinkItem, lo_ipv6_disabled_cmd};
use crate::runner::NetnsRunner;

/// `ip rule del` removes one match per call; bound the loop in case of a flood of duplicates.
const MAX_DUPLICATES: usize = 16;

/// The items that apply in this netns: the IPv6 local route needs IPv6 on `lo`.
fn items(r: &dyn NetnsRunner, ipv6: bool) -> Result<Vec<NetlinkItem>, ApplyError> {
    let mut items = NetlinkItem::all(ipv6);
    if ipv6 {
        let out = r
            .run(&lo_ipv6_disabled_cmd())
            .map_err(step("read lo disable_ipv6"))?;
        if !out.success() || out.stdout.trim() != "0" {
            items.retain(|i| *i != NetlinkItem::Route(Family::V6));
        }
    }
    Ok(items)
}

fn present(r: &dyn NetnsRunner, item: NetlinkItem) -> Result<bool, ApplyError> {
    // Listing a routing table that was never created fails ("FIB table does not exist"):
    // that is simply "absent".
    let out = r.run(&item.show()).map_err(step("ip show"))?;
    Ok(out.success() && item.present_in(&out.stdout))
}

pub(crate) fn apply(r: &dyn NetnsRunner, ipv6: bool) -> Result<(), ApplyError> {
    for item in items(r, ipv6)? {
        // `ip rule add` fails with EEXIST when the rule exists; check first so re-apply is a no-op.
        if matches!(item, NetlinkItem::Rule(_)) && present(r, item)? {
            continue;
        }
        r.run_ok(&item.add()).map_err(step("ip rule/route add"))?;
    }
    Ok(())
}

pub(crate) fn verify(r: &dyn NetnsRunner, ipv6: bool) -> Result<Vec<Finding>, ApplyError> {
    let mut findings = Vec::new();
    for item in items(r, ipv6)? {
        if !present(r, item)? {
            findings.push(Finding::MissingNetlink(item));
        }
    }
    Ok(findings)
}

pub(crate) fn delete(r: &dyn NetnsRunner, ipv6: bool) -> Result<(), ApplyError> {
    for item in NetlinkItem::all(ipv6) {
        for _ in 0..MAX_DUPLICATES {
            if !r
                .run(&item.delete())
                .map_err(step("ip rule/route del"))?
                .success()
            {
                break;
            }
        }
    }
    Ok(())
}
