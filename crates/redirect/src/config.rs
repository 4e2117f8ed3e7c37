//! Typed configuration of the rules: what the agent decided for one pod or for the host.
//!
//! Everything here is parsed up front ("parse, don't validate"), so renderers never see an
//! interface name that could break out of its token in `iptables-restore` or `nft` input.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::consts::{DEFAULT_PROBE_SNAT_V4, DEFAULT_PROBE_SNAT_V6};

/// Errors building a configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// An interface name that Linux or the rule languages would not accept.
    #[error("invalid interface name {name:?}: {reason}")]
    InvalidIface {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}

/// Which rule engine writes the rules (upstream `NATIVE_NFTABLES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `iptables-restore` / `ip6tables-restore` (either xtables variant).
    Iptables,
    /// Native `nft` transactions (`NATIVE_NFTABLES=true`).
    Nftables,
}

impl Backend {
    /// Upstream's switch: `NATIVE_NFTABLES=true` selects nftables.
    pub fn from_native_nftables(native: bool) -> Self {
        if native {
            Self::Nftables
        } else {
            Self::Iptables
        }
    }
}

/// Address family of an iptables rule set (iptables vs ip6tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4 (`iptables`).
    V4,
    /// IPv6 (`ip6tables`).
    V6,
}

/// A network interface name, valid for the kernel and safe as one unquoted token in
/// `iptables-restore` and `nft` input.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IfaceName(String);

impl IfaceName {
    /// Linux `IFNAMSIZ` minus the NUL.
    pub const MAX_LEN: usize = 15;

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for IfaceName {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| {
            Err(ConfigError::InvalidIface {
                name: s.to_owned(),
                reason,
            })
        };
        if s.is_empty() {
            return bad("empty");
        }
        if s.len() > Self::MAX_LEN {
            return bad("longer than 15 bytes");
        }
        if s == "." || s == ".." {
            return bad("reserved name");
        }
        // The kernel also allows other printable characters, but `@`, `"`, `;`, `{` and
        // friends have meaning in nft syntax; pods' virtual interfaces never need them.
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return bad("only ASCII letters, digits, '-', '_' and '.' are allowed");
        }
        Ok(Self(s.to_owned()))
    }
}

impl fmt::Display for IfaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the agent decided for one pod's in-pod rules (`spec/cni.md` §3.2, §3.3, §3.7).
///
/// Marks, ports and tables are the §0 constants in [`crate::consts`]: they are the interop
/// contract with ztunnel and therefore not configurable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRedirectConfig {
    /// Also write IPv6 rules (`AMBIENT_IPV6`, chart default true).
    pub ipv6: bool,
    /// Redirect DNS (port 53) to ztunnel's DNS proxy.
    pub dns_capture: bool,
    /// `bypass-inbound-capture: "true"`: inbound is not captured.
    pub ingress_mode: bool,
    /// `reroute-virtual-interfaces`: TCP arriving on these is sent to the outbound port.
    pub virtual_interfaces: Vec<IfaceName>,
    /// Source the host SNATs kubelet probes to (IPv4).
    pub probe_snat_v4: Ipv4Addr,
    /// Source the host SNATs kubelet probes to (IPv6).
    pub probe_snat_v6: Ipv6Addr,
}

impl Default for PodRedirectConfig {
    /// Upstream defaults: IPv6 on, DNS capture on, inbound captured, no virtual interfaces.
    fn default() -> Self {
        Self {
            ipv6: true,
            dns_capture: true,
            ingress_mode: false,
            virtual_interfaces: Vec::new(),
            probe_snat_v4: DEFAULT_PROBE_SNAT_V4,
            probe_snat_v6: DEFAULT_PROBE_SNAT_V6,
        }
    }
}

impl PodRedirectConfig {
    /// The families rules are written for.
    pub fn families(&self) -> &'static [Family] {
        if self.ipv6 {
            &[Family::V4, Family::V6]
        } else {
            &[Family::V4]
        }
    }
}

/// What the agent decided for the host netns rules (`spec/cni.md` §3.8, §3.9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRulesConfig {
    /// Also write IPv6 rules and the `-v6` probe set.
    pub ipv6: bool,
    /// SNAT source for IPv4 probes.
    pub probe_snat_v4: Ipv4Addr,
    /// SNAT source for IPv6 probes.
    pub probe_snat_v6: Ipv6Addr,
    /// The kubelet's UID; only the nftables rule matches on it (`skuid`).
    pub kubelet_uid: u32,
}

impl Default for HostRulesConfig {
    fn default() -> Self {
        Self {
            ipv6: true,
            probe_snat_v4: DEFAULT_PROBE_SNAT_V4,
            probe_snat_v6: DEFAULT_PROBE_SNAT_V6,
            kubelet_uid: 0,
        }
    }
}

impl HostRulesConfig {
    /// The families rules are written for.
    pub fn families(&self) -> &'static [Family] {
        if self.ipv6 {
            &[Family::V4, Family::V6]
        } else {
            &[Family::V4]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iface_names() {
        let cases: &[(&str, bool)] = &[
            ("eth0", true),
            ("tun0.100", true),
            ("a_b-c", true),
            ("123456789012345", true),
            ("1234567890123456", false),
            ("", false),
            (".", false),
            ("..", false),
            ("a b", false),
            ("a/b", false),
            ("a;b", false),
            ("veth@if2", false),
            ("\"x\"", false),
        ];
        for (name, ok) in cases {
            assert_eq!(name.parse::<IfaceName>().is_ok(), *ok, "{name:?}");
        }
    }
}
