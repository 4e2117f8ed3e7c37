//! What to create, as data: `ip -batch` lines for the caller's namespace and for each of
//! ours, plus sysctls. Rendering is pure, so the wiring is unit-tested without root;
//! [`apply`] executes a plan.

use std::{io::Write, process::Stdio};

use ambit_netns::{NetnsFd, in_netns};

use crate::{
    Addressing, TopologyError,
    addressing::{bridge_netns, bridge_port, host_veth, node_netns, pod_netns},
};

/// A node as the planner sees it.
#[derive(Clone, Debug)]
pub(crate) struct NodeSpec {
    pub name: String,
    pub index: u8,
}

/// A pod as the planner sees it.
#[derive(Clone, Debug)]
pub(crate) struct PodSpec {
    pub name: String,
    pub node: NodeSpec,
    /// Last octet of its address, also names its host-side veth.
    pub host: u8,
}

/// Sysctls every routing namespace gets. Strict reverse-path filtering would drop
/// replies that come back over the bridge on asymmetric paths, and later redirection
/// rules (in-pod capture) need it off as well; new namespaces may inherit it on.
const NO_RP_FILTER: [(&str, &str); 2] = [
    ("net/ipv4/conf/all/rp_filter", "0"),
    ("net/ipv4/conf/default/rp_filter", "0"),
];

/// Commands to run, in order: `root` first, then each namespace's batch, then sysctls.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Lines for an `ip -batch` in the caller's namespace. They only name other
    /// namespaces: creating links with `netns` on both ends keeps the root clean.
    pub root: Vec<String>,
    /// Lines for `ip -n NS -batch`, per namespace, in first-use order.
    pub per_ns: Vec<(String, Vec<String>)>,
    /// `/proc/sys` keys to write, per namespace.
    pub sysctls: Vec<(String, Vec<(&'static str, &'static str)>)>,
}

impl Plan {
    fn ns(&mut self, name: &str) -> &mut Vec<String> {
        let pos = match self.per_ns.iter().position(|(n, _)| n == name) {
            Some(pos) => pos,
            None => {
                self.per_ns.push((name.to_owned(), Vec::new()));
                self.per_ns.len() - 1
            }
        };
        &mut self.per_ns[pos].1
    }

    /// The bridge namespace and its bridge.
    pub fn bridge(&mut self, prefix: &str, a: &Addressing) {
        let br = bridge_netns(prefix);
        self.root.push(format!("netns add {br}"));
        self.ns(&br).extend([
            "link set lo up".to_owned(),
            "link add br0 type bridge".to_owned(),
            format!("addr add {}/16 dev br0", a.bridge_ip()),
            "link set br0 up".to_owned(),
        ]);
    }

    /// A node namespace, its uplink to the bridge and its routes to `all_nodes`' pods.
    pub fn node(&mut self, prefix: &str, a: &Addressing, node: &NodeSpec, all: &[NodeSpec]) {
        let br = bridge_netns(prefix);
        let ns = node_netns(prefix, &node.name);
        let port = bridge_port(node.index);
        let ip = a.node_ip(node.index);
        self.root.extend([
            format!("netns add {ns}"),
            format!("link add name eth0 netns {ns} type veth peer name {port} netns {br}"),
        ]);
        self.ns(&br).extend([
            format!("link set {port} master br0"),
            format!("link set {port} up"),
            format!("route add {} via {ip}", a.pod_cidr(node.index)),
        ]);
        let lines = self.ns(&ns);
        lines.extend([
            "link set lo up".to_owned(),
            format!("addr add {ip}/16 dev eth0"),
            "link set eth0 up".to_owned(),
            format!("route add default via {}", a.bridge_ip()),
        ]);
        for other in all.iter().filter(|o| o.index != node.index) {
            lines.push(format!(
                "route add {} via {}",
                a.pod_cidr(other.index),
                a.node_ip(other.index)
            ));
        }
        let mut sysctls = vec![("net/ipv4/ip_forward", "1")];
        sysctls.extend(NO_RP_FILTER);
        self.sysctls.push((ns, sysctls));
    }

    /// A pod namespace and its veth to the node.
    pub fn pod(&mut self, prefix: &str, a: &Addressing, pod: &PodSpec) {
        let node_ns = node_netns(prefix, &pod.node.name);
        let ns = pod_netns(prefix, &pod.node.name, &pod.name);
        let veth = host_veth(pod.host);
        let ip = a.pod_ip(pod.node.index, pod.host);
        let gw = a.pod_gateway(pod.node.index);
        self.root.extend([
            format!("netns add {ns}"),
            format!("link add name eth0 netns {ns} type veth peer name {veth} netns {node_ns}"),
        ]);
        self.ns(&node_ns).extend([
            // The same gateway address on every pod veth answers the pods' ARP for it.
            format!("addr add {gw}/32 dev {veth}"),
            format!("link set {veth} up"),
            // Source = node address, so node → pod traffic looks like it does on a node.
            format!(
                "route add {ip}/32 dev {veth} src {}",
                a.node_ip(pod.node.index)
            ),
        ]);
        self.ns(&ns).extend([
            "link set lo up".to_owned(),
            format!("addr add {ip}/32 dev eth0"),
            "link set eth0 up".to_owned(),
            format!("route add {gw} dev eth0 scope link"),
            format!("route add default via {gw} dev eth0"),
        ]);
        self.sysctls.push((ns, NO_RP_FILTER.to_vec()));
    }
}

/// Runs `lines` through one `ip -batch -`, in namespace `netns` (None: the caller's).
pub(crate) fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<(), TopologyError> {
    let mut cmd = std::process::Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let spawn_err = |source| TopologyError::Spawn {
        program: "ip".into(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_err)?;
    let mut input = lines.join("\n");
    input.push('\n');
    // ip reads all of stdin before doing much and its output goes to a pipe we drain in
    // wait_with_output, so writing first cannot deadlock for our batch sizes.
    let written = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(TopologyError::Ip {
            netns: netns.unwrap_or("root").to_owned(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    if let Some(Err(source)) = written {
        return Err(spawn_err(source));
    }
    Ok(())
}

/// Executes `plan`. `open` gives the descriptor of a namespace named in the plan (it
/// exists once the root batch ran).
pub(crate) fn apply(
    plan: &Plan,
    open: impl Fn(&str) -> Result<NetnsFd, TopologyError>,
) -> Result<(), TopologyError> {
    if !plan.root.is_empty() {
        ip_batch(None, &plan.root)?;
    }
    for (ns, lines) in &plan.per_ns {
        ip_batch(Some(ns), lines)?;
    }
    for (ns, sysctls) in &plan.sysctls {
        let fd = open(ns)?;
        // /proc/sys/net resolves against the opening thread's namespace, so writing from
        // inside `in_netns` sets the namespace's value without forking `sysctl`.
        in_netns(&fd, || {
            sysctls.iter().try_for_each(|(key, value)| {
                std::fs::write(format!("/proc/sys/{key}"), value).map_err(|source| {
                    TopologyError::Sysctl {
                        netns: ns.clone(),
                        key: (*key).to_owned(),
                        source,
                    }
                })
            })
        })??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<NodeSpec> {
        ["n1", "n2"]
            .iter()
            .zip(0u8..)
            .map(|(name, index)| NodeSpec {
                name: (*name).to_owned(),
                index,
            })
            .collect()
    }

    #[test]
    fn cluster_plan_wires_bridge_nodes_and_pods() {
        let a = Addressing::default();
        let all = nodes();
        let mut plan = Plan::default();
        plan.bridge("amtest1", &a);
        for n in &all {
            plan.node("amtest1", &a, n, &all);
        }
        plan.pod(
            "amtest1",
            &a,
            &PodSpec {
                name: "client".into(),
                node: all[1].clone(),
                host: 2,
            },
        );

        let expected_root = [
            "netns add amtest1",
            "netns add amtest1~n1",
            "link add name eth0 netns amtest1~n1 type veth peer name node0 netns amtest1",
            "netns add amtest1~n2",
            "link add name eth0 netns amtest1~n2 type veth peer name node1 netns amtest1",
            "netns add amtest1~n2~client",
            "link add name eth0 netns amtest1~n2~client type veth peer name veth2 netns amtest1~n2",
        ];
        assert_eq!(plan.root, expected_root);

        let expected_ns: [(&str, &[&str]); 4] = [
            (
                "amtest1",
                &[
                    "link set lo up",
                    "link add br0 type bridge",
                    "addr add 198.18.0.1/16 dev br0",
                    "link set br0 up",
                    "link set node0 master br0",
                    "link set node0 up",
                    "route add 198.19.1.0/24 via 198.18.0.2",
                    "link set node1 master br0",
                    "link set node1 up",
                    "route add 198.19.2.0/24 via 198.18.0.3",
                ],
            ),
            (
                "amtest1~n1",
                &[
                    "link set lo up",
                    "addr add 198.18.0.2/16 dev eth0",
                    "link set eth0 up",
                    "route add default via 198.18.0.1",
                    "route add 198.19.2.0/24 via 198.18.0.3",
                ],
            ),
            (
                "amtest1~n2",
                &[
                    "link set lo up",
                    "addr add 198.18.0.3/16 dev eth0",
                    "link set eth0 up",
                    "route add default via 198.18.0.1",
                    "route add 198.19.1.0/24 via 198.18.0.2",
                    "addr add 198.19.2.1/32 dev veth2",
                    "link set veth2 up",
                    "route add 198.19.2.2/32 dev veth2 src 198.18.0.3",
                ],
            ),
            (
                "amtest1~n2~client",
                &[
                    "link set lo up",
                    "addr add 198.19.2.2/32 dev eth0",
                    "link set eth0 up",
                    "route add 198.19.2.1 dev eth0 scope link",
                    "route add default via 198.19.2.1 dev eth0",
                ],
            ),
        ];
        assert_eq!(plan.per_ns.len(), expected_ns.len());
        for ((ns, lines), (want_ns, want_lines)) in plan.per_ns.iter().zip(expected_ns) {
            assert_eq!(ns, want_ns);
            assert_eq!(lines, want_lines, "{ns}");
        }

        let sysctl_ns: Vec<_> = plan.sysctls.iter().map(|(ns, _)| ns.as_str()).collect();
        assert_eq!(sysctl_ns, ["amtest1~n1", "amtest1~n2", "amtest1~n2~client"]);
        assert!(plan.sysctls[0].1.contains(&("net/ipv4/ip_forward", "1")));
        assert!(!plan.sysctls[2].1.contains(&("net/ipv4/ip_forward", "1")));
    }
}
