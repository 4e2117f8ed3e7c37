//! The address plan: which address every bridge, node and pod gets, and the names of
//! namespaces and interfaces. Pure functions, no system calls.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::TopologyError;

/// Most nodes a topology can hold: node `i` uses host octet `i + 2` (1 is the bridge).
pub(crate) const MAX_NODES: usize = 253;
/// Lowest and highest last octet of a pod address (1 is the node's gateway).
pub(crate) const FIRST_POD_HOST: u8 = 2;
pub(crate) const LAST_POD_HOST: u8 = 254;

/// The two `/16` ranges a topology uses. See the crate docs for the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addressing {
    /// Node network: the bridge gets `.0.1`, node `i` gets `.0.(i+2)`.
    pub node_net: Ipv4Net,
    /// Pod network: node `i` owns `.(i+1).0/24`, gateway `.(i+1).1`.
    pub pod_net: Ipv4Net,
}

impl Default for Addressing {
    /// RFC 2544's benchmarking block, reserved for exactly this kind of test network.
    fn default() -> Self {
        Self {
            node_net: Ipv4Net::new(Ipv4Addr::new(198, 18, 0, 0), 16).unwrap_or_default(),
            pod_net: Ipv4Net::new(Ipv4Addr::new(198, 19, 0, 0), 16).unwrap_or_default(),
        }
    }
}

impl Addressing {
    /// Checks that both ranges are distinct `/16` networks.
    pub fn validate(&self) -> Result<(), TopologyError> {
        if self.node_net.prefix_len() != 16 || self.pod_net.prefix_len() != 16 {
            return Err(TopologyError::Addressing("both ranges must be /16"));
        }
        if self.node_net.network() == self.pod_net.network() {
            return Err(TopologyError::Addressing("node and pod ranges overlap"));
        }
        Ok(())
    }

    fn offset(net: Ipv4Net, third: u8, fourth: u8) -> Ipv4Addr {
        let [a, b, _, _] = net.network().octets();
        Ipv4Addr::new(a, b, third, fourth)
    }

    /// The bridge's address (the nodes' default gateway).
    pub fn bridge_ip(&self) -> Ipv4Addr {
        Self::offset(self.node_net, 0, 1)
    }

    /// Node `index`'s address on its uplink.
    pub(crate) fn node_ip(&self, index: u8) -> Ipv4Addr {
        Self::offset(self.node_net, 0, index + 2)
    }

    /// Node `index`'s pod subnet.
    pub(crate) fn pod_cidr(&self, index: u8) -> Ipv4Net {
        Ipv4Net::new(Self::offset(self.pod_net, index + 1, 0), 24).unwrap_or_default()
    }

    /// The gateway address pods of node `index` route through.
    pub(crate) fn pod_gateway(&self, index: u8) -> Ipv4Addr {
        Self::offset(self.pod_net, index + 1, 1)
    }

    /// Address of the pod with last octet `host` on node `index`.
    pub(crate) fn pod_ip(&self, index: u8, host: u8) -> Ipv4Addr {
        Self::offset(self.pod_net, index + 1, host)
    }
}

/// Namespace of the cluster's bridge: the prefix itself.
pub(crate) fn bridge_netns(prefix: &str) -> String {
    prefix.to_owned()
}

pub(crate) fn node_netns(prefix: &str, node: &str) -> String {
    format!("{prefix}~{node}")
}

pub(crate) fn pod_netns(prefix: &str, node: &str, pod: &str) -> String {
    format!("{prefix}~{node}~{pod}")
}

/// The bridge port of node `index`, in the bridge namespace.
pub(crate) fn bridge_port(index: u8) -> String {
    format!("node{index}")
}

/// The host side of a pod's veth, in the node namespace.
pub(crate) fn host_veth(host: u8) -> String {
    format!("veth{host}")
}

/// Node and pod names end up in namespace file names and in commands people type, so
/// keep them to what Kubernetes allows in a DNS label (plus `.` and `_`), short.
pub(crate) fn validate_name(kind: &'static str, name: &str) -> Result<(), TopologyError> {
    let invalid = |reason| TopologyError::InvalidName {
        kind,
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() || name.len() > 63 {
        return Err(invalid("must be 1 to 63 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(invalid(
            "only ASCII letters, digits, '-', '.' and '_' are allowed",
        ));
    }
    if name.starts_with('.') {
        return Err(invalid("must not start with '.'"));
    }
    Ok(())
}

/// Prefixes select what [`crate::cleanup`] deletes, so a short or odd one could match
/// namespaces that are not ours.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), TopologyError> {
    let invalid = |reason| TopologyError::InvalidName {
        kind: "prefix",
        name: prefix.to_owned(),
        reason,
    };
    if !(4..=16).contains(&prefix.len()) {
        return Err(invalid("must be 4 to 16 characters"));
    }
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(invalid(
            "only lowercase ASCII letters and digits are allowed",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_addresses() {
        let a = Addressing::default();
        a.validate().expect("default is valid");
        let cases: [(&str, String, &str); 6] = [
            ("bridge", a.bridge_ip().to_string(), "198.18.0.1"),
            ("node 0", a.node_ip(0).to_string(), "198.18.0.2"),
            ("node 252", a.node_ip(252).to_string(), "198.18.0.254"),
            ("pod cidr 1", a.pod_cidr(1).to_string(), "198.19.2.0/24"),
            ("gateway 0", a.pod_gateway(0).to_string(), "198.19.1.1"),
            ("pod 0/2", a.pod_ip(0, 2).to_string(), "198.19.1.2"),
        ];
        for (name, got, want) in cases {
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn addressing_validation() {
        let net = |s: &str| s.parse::<Ipv4Net>().expect("net");
        let cases = [
            ("default", Addressing::default(), true),
            (
                "other /16s",
                Addressing {
                    node_net: net("10.250.0.0/16"),
                    pod_net: net("10.251.0.0/16"),
                },
                true,
            ),
            (
                "not /16",
                Addressing {
                    node_net: net("10.250.0.0/24"),
                    pod_net: net("10.251.0.0/16"),
                },
                false,
            ),
            (
                "same range",
                Addressing {
                    node_net: net("10.250.0.0/16"),
                    pod_net: net("10.250.0.0/16"),
                },
                false,
            ),
        ];
        for (name, a, ok) in cases {
            assert_eq!(a.validate().is_ok(), ok, "{name}");
        }
    }

    #[test]
    fn name_validation() {
        let cases = [
            ("node1", true),
            ("client-v1.default", true),
            ("a_b", true),
            ("", false),
            ("has~tilde", false),
            ("has/slash", false),
            (".hidden", false),
            ("x".repeat(64).leak() as &str, false),
        ];
        for (name, ok) in cases {
            assert_eq!(validate_name("pod", name).is_ok(), ok, "{name:?}");
        }
    }

    #[test]
    fn prefix_validation() {
        let cases = [
            ("am12345", true),
            ("test", true),
            ("am", false),
            ("AM12345", false),
            ("am-1234", false),
            ("a".repeat(17).leak() as &str, false),
        ];
        for (prefix, ok) in cases {
            assert_eq!(validate_prefix(prefix).is_ok(), ok, "{prefix:?}");
        }
    }
}
