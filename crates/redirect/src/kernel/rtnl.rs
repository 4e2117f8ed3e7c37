//! Policy-routing rules and routes of the calling thread's namespace, over rtnetlink.
//!
//! The predicates say exactly what the `ip` listings the process-based check reads say
//! (`crate::netlink::NetlinkItem::present_in`): a rule is present when `ip rule show pref
//! 32764` would print `fwmark 0x111/0xfff lookup 100` on one line, a route when `ip route
//! show table 100` would print a line starting `local default dev lo`. Each clause below
//! names the `ip` output it stands for.

use ambit_contract::marks::{INPOD_CONN_MARK, INPOD_MASK, ROUTE_TABLE, RULE_PRIORITY};
use netlink_packet_route::route::{RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::rule::{RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;

use super::KernelError;
use super::socket::Netlink;
use crate::config::Family;
use crate::netlink::NetlinkItem;

/// The loopback device's index: the kernel registers `lo` first in every namespace, with
/// the fixed index 1 (`LOOPBACK_IFINDEX`).
const LOOPBACK_IFINDEX: u32 = 1;

/// The rules and routes of some families, as the kernel listed them.
#[derive(Debug, Default)]
pub(crate) struct Routing {
    rules: Vec<RuleMessage>,
    routes: Vec<RouteMessage>,
}

fn af(family: Family) -> AddressFamily {
    match family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    }
}

impl Routing {
    /// Dumps the rules and routes of `families`.
    pub(crate) fn read(families: &[Family]) -> Result<Self, KernelError> {
        let mut nl = Netlink::open(NETLINK_ROUTE)?;
        let mut out = Routing::default();
        for &family in families {
            let mut rule = RuleMessage::default();
            rule.header.family = af(family);
            for m in nl.dump("rule dump", RouteNetlinkMessage::GetRule(rule))? {
                if let RouteNetlinkMessage::NewRule(r) = m {
                    out.rules.push(r);
                }
            }
            let mut route = RouteMessage::default();
            route.header.address_family = af(family);
            for m in nl.dump("route dump", RouteNetlinkMessage::GetRoute(route))? {
                if let RouteNetlinkMessage::NewRoute(r) = m {
                    out.routes.push(r);
                }
            }
        }
        Ok(out)
    }

    /// Whether `item` is present.
    pub(crate) fn has(&self, item: NetlinkItem) -> bool {
        match item {
            NetlinkItem::Rule(f) => self.rules.iter().any(|r| is_our_rule(r, af(f))),
            NetlinkItem::Route(f) => self.routes.iter().any(|r| is_our_route(r, af(f))),
        }
    }
}

fn is_our_rule(r: &RuleMessage, family: AddressFamily) -> bool {
    let mut priority = None;
    let (mut mark, mut mask) = (None, None);
    let mut table = u32::from(r.header.table);
    for a in &r.attributes {
        match a {
            RuleAttribute::Priority(p) => priority = Some(*p),
            RuleAttribute::FwMark(m) => mark = Some(*m),
            RuleAttribute::FwMask(m) => mask = Some(*m),
            RuleAttribute::Table(t) => table = *t,
            // `ip` prints these between `fwmark ...` and `lookup ...`, which would break
            // the line the listing check looks for.
            RuleAttribute::Iifname(_)
            | RuleAttribute::Oifname(_)
            | RuleAttribute::L3MDev(_)
            | RuleAttribute::UidRange(_)
            | RuleAttribute::IpProtocol(_)
            | RuleAttribute::SourcePortRange(_)
            | RuleAttribute::DestinationPortRange(_)
            | RuleAttribute::TunId(_) => return false,
            _ => {}
        }
    }
    // `ip` shows a missing mark as 0 and a missing mask as 0xffffffff.
    let (mark, mask) = match (mark, mask) {
        (None, None) => return false,
        (m, k) => (m.unwrap_or(0), k.unwrap_or(u32::MAX)),
    };
    r.header.family == family
        && priority == Some(RULE_PRIORITY)
        && mark == INPOD_CONN_MARK
        && mask == INPOD_MASK
        && table == ROUTE_TABLE
}

fn is_our_route(r: &RouteMessage, family: AddressFamily) -> bool {
    let h = &r.header;
    let mut table = u32::from(h.table);
    let mut oif = None;
    for a in &r.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Oif(i) => oif = Some(*i),
            // Printed between `default` and `dev lo` (`0.0.0.0/0`, `from`, `nhid`, `as to`,
            // `encap`, `via`).
            RouteAttribute::Destination(_)
            | RouteAttribute::Source(_)
            | RouteAttribute::NhId(_)
            | RouteAttribute::NewDestination(_)
            | RouteAttribute::NewDestinationAddress(_)
            | RouteAttribute::Encap(_)
            | RouteAttribute::Gateway(_)
            | RouteAttribute::Via(_) => return false,
            _ => {}
        }
    }
    h.address_family == family
        && table == ROUTE_TABLE
        && h.kind == RouteType::Local
        && h.destination_prefix_length == 0
        && h.source_prefix_length == 0
        && h.tos == 0
        && oif == Some(LOOPBACK_IFINDEX)
}
