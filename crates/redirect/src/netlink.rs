//! The pod netns policy-routing state (`spec/cni.md` §3.1), as `ip` argv.
//!
//! Replies from the app to a spoofed source carry the restored connmark 0x111 as fwmark; this
//! rule and the `local default dev lo` route in table 100 send them back to ztunnel inside the
//! pod instead of out of it. Both backends need it.

use crate::config::Family;
use crate::runner::Cmd;
use ambit_contract::marks::{INPOD_CONN_MARK, INPOD_MASK, ROUTE_TABLE, RULE_PRIORITY};

/// One piece of netlink state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetlinkItem {
    /// `ip rule fwmark 0x111/0xfff pref 32764 lookup 100`
    Rule(Family),
    /// `ip route local default dev lo table 100`
    Route(Family),
}

fn ip(family: Family) -> Vec<String> {
    match family {
        Family::V4 => vec!["ip".into()],
        Family::V6 => vec!["ip".into(), "-6".into()],
    }
}

fn default_route(family: Family) -> &'static str {
    match family {
        Family::V4 => "0.0.0.0/0",
        Family::V6 => "::/0",
    }
}

impl NetlinkItem {
    /// Everything for a config, in apply order.
    pub fn all(ipv6: bool) -> Vec<Self> {
        let mut v = vec![Self::Rule(Family::V4), Self::Route(Family::V4)];
        if ipv6 {
            v.extend([Self::Rule(Family::V6), Self::Route(Family::V6)]);
        }
        v
    }

    fn family(self) -> Family {
        match self {
            Self::Rule(f) | Self::Route(f) => f,
        }
    }

    fn selector(self) -> Vec<String> {
        match self {
            Self::Rule(_) => vec![
                "fwmark".into(),
                format!("{INPOD_CONN_MARK:#x}/{INPOD_MASK:#x}"),
                "pref".into(),
                RULE_PRIORITY.to_string(),
                "lookup".into(),
                ROUTE_TABLE.to_string(),
            ],
            Self::Route(f) => vec![
                "local".into(),
                default_route(f).into(),
                "dev".into(),
                "lo".into(),
                "table".into(),
                ROUTE_TABLE.to_string(),
            ],
        }
    }

    fn with(self, object: &str, verb: &str) -> Cmd {
        let mut v = ip(self.family());
        v.extend([object.to_owned(), verb.to_owned()]);
        v.extend(self.selector());
        Cmd::new(v)
    }

    fn object(self) -> &'static str {
        match self {
            Self::Rule(_) => "rule",
            Self::Route(_) => "route",
        }
    }

    /// Create (`ip rule add` / `ip route replace`). `ip rule add` is not idempotent, so
    /// appliers check [`Self::show`] first.
    pub fn add(self) -> Cmd {
        match self {
            Self::Rule(_) => self.with("rule", "add"),
            Self::Route(_) => self.with("route", "replace"),
        }
    }

    /// Remove.
    pub fn delete(self) -> Cmd {
        self.with(self.object(), "del")
    }

    /// The listing that [`Self::present_in`] reads.
    pub fn show(self) -> Cmd {
        let mut v = ip(self.family());
        match self {
            Self::Rule(_) => v.extend([
                "rule".into(),
                "show".into(),
                "pref".into(),
                RULE_PRIORITY.to_string(),
            ]),
            Self::Route(_) => v.extend([
                "route".into(),
                "show".into(),
                "table".into(),
                ROUTE_TABLE.to_string(),
            ]),
        }
        Cmd::new(v)
    }

    /// Whether `show` output contains this item.
    pub fn present_in(self, show_output: &str) -> bool {
        let rule = format!("fwmark {INPOD_CONN_MARK:#x}/{INPOD_MASK:#x} lookup {ROUTE_TABLE}");
        show_output.lines().any(|l| match self {
            Self::Rule(_) => l.contains(&rule),
            Self::Route(_) => {
                let t: Vec<&str> = l.split_whitespace().take(4).collect();
                t == ["local", "default", "dev", "lo"]
            }
        })
    }
}

/// The sysctl (under `/proc/sys`) that says whether IPv6 is disabled on `lo` in a
/// namespace (then no v6 local route can exist).
pub const LO_DISABLE_IPV6: &str = "net/ipv6/conf/lo/disable_ipv6";

/// Reads [`LO_DISABLE_IPV6`] in the namespace.
pub fn lo_ipv6_disabled_cmd() -> Cmd {
    Cmd::new(["cat".to_owned(), format!("/proc/sys/{LO_DISABLE_IPV6}")])
}
