//! [`Topology`] and its builder: owning the namespaces of one cluster, looking nodes and
//! pods up, running things inside them, adding and removing pods, tearing down on drop.

use std::{
    ffi::OsStr,
    net::Ipv4Addr,
    path::PathBuf,
    process::{Command, Output, Stdio},
};

use ambit_netns::{NetnsFd, NetnsSocketFactory, run_in_netns_thread, set_command_netns};
use ipnet::Ipv4Net;

use crate::{
    Addressing, ChildGuard, TopologyError,
    addressing::{
        FIRST_POD_HOST, LAST_POD_HOST, MAX_NODES, bridge_netns, host_veth, node_netns, pod_netns,
        validate_name, validate_prefix,
    },
    cleanup::{NETNS_DIR, cleanup, leftovers, random_prefix},
    plan::{NodeSpec, Plan, PodSpec, apply, ip_batch},
};

/// A named network namespace of the topology (under `/var/run/netns`).
#[derive(Debug)]
pub struct Namespace {
    name: String,
    fd: NetnsFd,
}

impl Namespace {
    fn open(name: &str) -> Result<Self, TopologyError> {
        Ok(Self {
            name: name.to_owned(),
            fd: NetnsFd::open(netns_path(name))?,
        })
    }

    /// The name for `ip netns exec`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mount path, e.g. `/var/run/netns/amx1y2z~node1`.
    pub fn path(&self) -> PathBuf {
        netns_path(&self.name)
    }

    /// An open descriptor of the namespace.
    pub fn fd(&self) -> &NetnsFd {
        &self.fd
    }

    /// A socket factory creating sockets in this namespace.
    pub fn socket_factory(&self, mark: Option<u32>) -> Result<NetnsSocketFactory, TopologyError> {
        Ok(NetnsSocketFactory::new(self.fd.try_clone()?, mark))
    }

    /// A command that starts inside this namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Result<Command, TopologyError> {
        let mut cmd = Command::new(program);
        set_command_netns(&mut cmd, &self.fd)?;
        Ok(cmd)
    }

    /// Runs `f` on a thread inside this namespace and returns its result.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, TopologyError> {
        Ok(run_in_netns_thread(&self.fd, f)?)
    }
}

fn netns_path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// A node: a namespace with an uplink to the bridge, forwarding for its pods.
#[derive(Debug)]
pub struct Node {
    name: String,
    index: u8,
    ip: Ipv4Addr,
    pod_cidr: Ipv4Net,
    netns: Namespace,
}

/// A pod: a namespace with one veth to its node.
#[derive(Debug)]
pub struct Pod {
    name: String,
    node: String,
    host: u8,
    ip: Ipv4Addr,
    gateway: Ipv4Addr,
    netns: Namespace,
}

macro_rules! netns_accessors {
    ($ty:ty) => {
        impl $ty {
            /// The name given to the builder.
            pub fn name(&self) -> &str {
                &self.name
            }
            /// The primary IPv4 address (on `eth0`).
            pub fn ip(&self) -> Ipv4Addr {
                self.ip
            }
            /// The namespace.
            pub fn netns(&self) -> &Namespace {
                &self.netns
            }
            /// The namespace's name for `ip netns exec`.
            pub fn netns_name(&self) -> &str {
                self.netns.name()
            }
            /// The namespace's bind-mount path.
            pub fn netns_path(&self) -> PathBuf {
                self.netns.path()
            }
            /// An open descriptor of the namespace.
            pub fn netns_fd(&self) -> &NetnsFd {
                self.netns.fd()
            }
        }
    };
}
netns_accessors!(Node);
netns_accessors!(Pod);

impl Node {
    /// The subnet its pods get addresses from.
    pub fn pod_cidr(&self) -> Ipv4Net {
        self.pod_cidr
    }

    fn spec(&self) -> NodeSpec {
        NodeSpec {
            name: self.name.clone(),
            index: self.index,
        }
    }
}

impl Pod {
    /// The node it runs on.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Its default gateway (an address of its node).
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// The host side of its veth, in the node's namespace.
    pub fn host_veth(&self) -> String {
        host_veth(self.host)
    }
}

/// Collects nodes and pods; [`TopologyBuilder::build`] creates them.
#[derive(Debug, Default)]
pub struct TopologyBuilder {
    prefix: Option<String>,
    addressing: Addressing,
    nodes: Vec<String>,
    pods: Vec<(String, String)>,
}

impl TopologyBuilder {
    /// Uses `prefix` instead of a random one (4–16 lowercase letters or digits). It must
    /// not be in use: everything starting with it is deleted on drop.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Uses other address ranges.
    pub fn addressing(mut self, addressing: Addressing) -> Self {
        self.addressing = addressing;
        self
    }

    /// Adds a node. Nodes are numbered in order of first mention (also by [`Self::pod`]).
    pub fn node(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        if !self.nodes.contains(&name) {
            self.nodes.push(name);
        }
        self
    }

    /// Adds a pod on `node`, adding the node if it is new.
    pub fn pod(mut self, node: impl Into<String>, pod: impl Into<String>) -> Self {
        let node = node.into();
        self = self.node(node.clone());
        self.pods.push((node, pod.into()));
        self
    }

    /// Creates the namespaces, links, addresses and routes. On error everything created
    /// so far is removed again.
    pub fn build(self) -> Result<Topology, TopologyError> {
        let prefix = self.prefix.unwrap_or_else(random_prefix);
        validate_prefix(&prefix)?;
        self.addressing.validate()?;
        if self.nodes.len() > MAX_NODES {
            return Err(TopologyError::TooMany {
                what: "nodes".into(),
                limit: MAX_NODES,
            });
        }
        let mut seen = std::collections::HashSet::new();
        for name in &self.nodes {
            validate_name("node", name)?;
            if !seen.insert(name.as_str()) {
                return Err(TopologyError::Duplicate(name.clone()));
            }
        }
        for (_, pod) in &self.pods {
            validate_name("pod", pod)?;
            if !seen.insert(pod.as_str()) {
                return Err(TopologyError::Duplicate(pod.clone()));
            }
        }
        // Refuse a prefix that is already in use *before* arming the teardown, which
        // would otherwise delete someone else's namespaces.
        if !leftovers(&prefix)?.is_empty() {
            return Err(TopologyError::Duplicate(prefix));
        }
        let teardown = Teardown {
            prefix: prefix.clone(),
        };

        let a = self.addressing;
        let node_specs: Vec<NodeSpec> = self
            .nodes
            .iter()
            .zip(0u8..)
            .map(|(name, index)| NodeSpec {
                name: name.clone(),
                index,
            })
            .collect();
        let mut plan = Plan::default();
        plan.bridge(&prefix, &a);
        for node in &node_specs {
            plan.node(&prefix, &a, node, &node_specs);
        }
        let mut pod_specs = Vec::with_capacity(self.pods.len());
        let mut next_host = vec![FIRST_POD_HOST; node_specs.len()];
        for (node_name, pod) in &self.pods {
            let Some(node) = node_specs.iter().find(|n| &n.name == node_name) else {
                return Err(TopologyError::Unknown(node_name.clone()));
            };
            let host = next_host[usize::from(node.index)];
            if host > LAST_POD_HOST {
                return Err(too_many_pods(node_name));
            }
            next_host[usize::from(node.index)] = host + 1;
            let spec = PodSpec {
                name: pod.clone(),
                node: node.clone(),
                host,
            };
            plan.pod(&prefix, &a, &spec);
            pod_specs.push(spec);
        }
        apply(&plan, |ns| Ok(NetnsFd::open(netns_path(ns))?))?;

        let bridge = Namespace::open(&bridge_netns(&prefix))?;
        let nodes = node_specs
            .iter()
            .map(|n| {
                Ok(Node {
                    name: n.name.clone(),
                    index: n.index,
                    ip: a.node_ip(n.index),
                    pod_cidr: a.pod_cidr(n.index),
                    netns: Namespace::open(&node_netns(&prefix, &n.name))?,
                })
            })
            .collect::<Result<_, TopologyError>>()?;
        let pods = pod_specs
            .iter()
            .map(|p| pod_from_spec(&prefix, &a, p))
            .collect::<Result<_, TopologyError>>()?;
        Ok(Topology {
            prefix,
            addressing: a,
            bridge,
            nodes,
            pods,
            _teardown: teardown,
        })
    }
}

fn too_many_pods(node: &str) -> TopologyError {
    TopologyError::TooMany {
        what: format!("pods on node {node}"),
        limit: usize::from(LAST_POD_HOST - FIRST_POD_HOST) + 1,
    }
}

fn pod_from_spec(prefix: &str, a: &Addressing, p: &PodSpec) -> Result<Pod, TopologyError> {
    Ok(Pod {
        name: p.name.clone(),
        node: p.node.name.clone(),
        host: p.host,
        ip: a.pod_ip(p.node.index, p.host),
        gateway: a.pod_gateway(p.node.index),
        netns: Namespace::open(&pod_netns(prefix, &p.node.name, &p.name))?,
    })
}

/// Deletes everything of the prefix when dropped. Declared last in [`Topology`], so the
/// namespace descriptors are closed first and the namespaces die with their names.
#[derive(Debug)]
struct Teardown {
    prefix: String,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Err(e) = cleanup(&self.prefix) {
            tracing::warn!(prefix = %self.prefix, error = %e, "topology teardown incomplete");
        }
    }
}

/// A cluster of network namespaces; everything is deleted when it drops.
#[derive(Debug)]
pub struct Topology {
    prefix: String,
    addressing: Addressing,
    bridge: Namespace,
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    _teardown: Teardown,
}

impl Topology {
    /// Starts describing a topology.
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder::default()
    }

    /// The per-run prefix of every namespace name.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The address ranges in use.
    pub fn addressing(&self) -> &Addressing {
        &self.addressing
    }

    /// The bridge namespace (the nodes' underlay; reaches every node and pod).
    pub fn bridge(&self) -> &Namespace {
        &self.bridge
    }

    /// All nodes, in index order.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter()
    }

    /// All pods, in creation order.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.iter()
    }

    /// The node called `name`, if any.
    pub fn get_node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The pod called `name`, if any.
    pub fn get_pod(&self, name: &str) -> Option<&Pod> {
        self.pods.iter().find(|p| p.name == name)
    }

    /// The node called `name`.
    ///
    /// # Panics
    /// If there is none; use [`Self::get_node`] for names that come from input.
    pub fn node(&self, name: &str) -> &Node {
        self.get_node(name)
            .unwrap_or_else(|| panic!("topology {} has no node {name:?}", self.prefix))
    }

    /// The pod called `name`.
    ///
    /// # Panics
    /// If there is none; use [`Self::get_pod`] for names that come from input.
    pub fn pod(&self, name: &str) -> &Pod {
        self.get_pod(name)
            .unwrap_or_else(|| panic!("topology {} has no pod {name:?}", self.prefix))
    }

    /// The namespace of the node or pod called `name`.
    pub fn netns(&self, name: &str) -> Result<&Namespace, TopologyError> {
        self.get_node(name)
            .map(Node::netns)
            .or_else(|| self.get_pod(name).map(Pod::netns))
            .ok_or_else(|| TopologyError::Unknown(name.to_owned()))
    }

    /// A command that starts inside the namespace of node or pod `name`.
    pub fn command(
        &self,
        name: &str,
        program: impl AsRef<OsStr>,
    ) -> Result<Command, TopologyError> {
        self.netns(name)?.command(program)
    }

    fn argv_command<S: AsRef<OsStr>>(
        &self,
        name: &str,
        argv: &[S],
    ) -> Result<Command, TopologyError> {
        let (program, args) = argv.split_first().ok_or(TopologyError::EmptyCommand)?;
        let mut cmd = self.command(name, program)?;
        cmd.args(args).stdin(Stdio::null());
        Ok(cmd)
    }

    /// Runs `argv` inside node or pod `name` and collects its output (like
    /// `ip netns exec NAME argv...`).
    pub fn exec<S: AsRef<OsStr>>(&self, name: &str, argv: &[S]) -> Result<Output, TopologyError> {
        let mut cmd = self.argv_command(name, argv)?;
        cmd.output().map_err(|source| TopologyError::Spawn {
            program: argv_program(argv),
            source,
        })
    }

    /// Starts `argv` inside node or pod `name` (stdin from /dev/null, stdout and stderr
    /// inherited); the process is killed when the guard drops. Use [`Self::command`] for
    /// other stdio.
    pub fn spawn<S: AsRef<OsStr>>(
        &self,
        name: &str,
        argv: &[S],
    ) -> Result<ChildGuard, TopologyError> {
        let mut cmd = self.argv_command(name, argv)?;
        let child = cmd.spawn().map_err(|source| TopologyError::Spawn {
            program: argv_program(argv),
            source,
        })?;
        Ok(ChildGuard::new(child))
    }

    /// Runs `f` on a thread inside node or pod `name`.
    pub fn run_in<R: Send>(
        &self,
        name: &str,
        f: impl FnOnce() -> R + Send,
    ) -> Result<R, TopologyError> {
        self.netns(name)?.run(f)
    }

    /// Adds a pod to a built topology, with the lowest free address of its node.
    pub fn add_pod(&mut self, node: &str, pod: &str) -> Result<&Pod, TopologyError> {
        validate_name("pod", pod)?;
        if self.get_node(pod).is_some() || self.get_pod(pod).is_some() {
            return Err(TopologyError::Duplicate(pod.to_owned()));
        }
        let node_spec = self
            .get_node(node)
            .ok_or_else(|| TopologyError::Unknown(node.to_owned()))?
            .spec();
        let host = (FIRST_POD_HOST..=LAST_POD_HOST)
            .find(|h| !self.pods.iter().any(|p| p.node == node && p.host == *h))
            .ok_or_else(|| too_many_pods(node))?;
        let spec = PodSpec {
            name: pod.to_owned(),
            node: node_spec,
            host,
        };
        let mut plan = Plan::default();
        plan.pod(&self.prefix, &self.addressing, &spec);
        let created = apply(&plan, |ns| Ok(NetnsFd::open(netns_path(ns))?))
            .and_then(|()| pod_from_spec(&self.prefix, &self.addressing, &spec));
        match created {
            Ok(p) => {
                let idx = self.pods.len();
                self.pods.push(p);
                Ok(&self.pods[idx])
            }
            Err(e) => {
                // Undo the half-created pod; the original error is the one to report.
                let _ = self.delete_pod_objects(&spec.node.name, host, pod);
                Err(e)
            }
        }
    }

    /// Removes a pod: its veth pair and its namespace. Processes still inside keep the
    /// namespace alive until they exit, but it is unreachable once its veth is gone.
    pub fn remove_pod(&mut self, pod: &str) -> Result<(), TopologyError> {
        let pos = self
            .pods
            .iter()
            .position(|p| p.name == pod)
            .ok_or_else(|| TopologyError::Unknown(pod.to_owned()))?;
        let removed = self.pods.remove(pos);
        let (node, host) = (removed.node.clone(), removed.host);
        // Close our descriptor first so deleting the name destroys the namespace.
        drop(removed);
        self.delete_pod_objects(&node, host, pod)
    }

    fn delete_pod_objects(&self, node: &str, host: u8, pod: &str) -> Result<(), TopologyError> {
        // Deleting the host veth explicitly (rather than waiting for the namespace's
        // asynchronous destruction) frees its name and address for the next pod at once.
        let veth = ip_batch(
            Some(&node_netns(&self.prefix, node)),
            &[format!("link del {}", host_veth(host))],
        );
        let ns = ip_batch(
            None,
            &[format!("netns del {}", pod_netns(&self.prefix, node, pod))],
        );
        veth.and(ns)
    }
}

fn argv_program<S: AsRef<OsStr>>(argv: &[S]) -> String {
    argv.first()
        .map(|p| p.as_ref().to_string_lossy().into_owned())
        .unwrap_or_default()
}
