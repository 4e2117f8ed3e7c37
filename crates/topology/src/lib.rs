//! Builds a small cluster on one machine out of network namespaces: a bridge namespace,
//! one namespace per node and one per pod, wired with veth pairs, addresses and routes.
//! Used by `ambit up`, the end-to-end tests and the benchmarks.
//!
//! # Layout
//!
//! ```text
//!            bridge netns "<prefix>"            br0 198.18.0.1/16
//!             |  node0  |  node1  ...           (one veth end per node, enslaved to br0)
//!   node netns "<prefix>~<node>"                eth0 198.18.0.(i+2)/16, ip_forward=1
//!             |  veth<h> ...                    (one per pod, 198.19.(i+1).1/32 on each)
//!   pod netns "<prefix>~<node>~<pod>"           eth0 198.19.(i+1).h/32, h = 2..=254
//! ```
//!
//! - Node `i` (in order of first mention) owns pod subnet `198.19.(i+1).0/24`. Its pods
//!   route everything via `198.19.(i+1).1`, a gateway address present on every host-side
//!   veth of that node (point-to-point style, as kindnet and the CNI `ptp` plugin do), so
//!   pod → pod traffic on one node is routed through the node namespace too.
//! - Nodes route other nodes' pod subnets via those nodes' `eth0` addresses and send
//!   everything else to the bridge address. Node → pod traffic leaves with the node's
//!   `eth0` address as source, like kubelet's probes on a real node.
//! - The bridge namespace can reach every node and pod (it plays the underlay / "host
//!   network" where a control plane may run).
//!
//! The default ranges are the RFC 2544 benchmarking block `198.18.0.0/15` (nodes in
//! `198.18.0.0/16`, pods in `198.19.0.0/16`), which is never used on real networks. Even
//! so nothing can clash with the host: the root namespace gets no link, address, route
//! or firewall rule at all, every link is created directly inside our namespaces, and
//! two topologies (e.g. parallel tests) reuse the same addresses without seeing each
//! other. [`Addressing`] changes the ranges.
//!
//! # Names
//!
//! Every namespace is named under a per-run prefix (`am` + 5 random base36 characters,
//! see [`random_prefix`]) and bind-mounted in `/var/run/netns`, so `ip netns exec NAME`,
//! `ss`, `iptables` and friends work on it. Interface names need no prefix (they live in
//! our namespaces) and stay well under the 15-character limit: `br0`, `node<i>`, `eth0`,
//! `veth<h>`.
//!
//! # Lifecycle
//!
//! [`TopologyBuilder::build`] creates everything (one `ip -batch` for the namespaces and
//! veth pairs, one per namespace for its addresses and routes, sysctls written directly).
//! Dropping the [`Topology`], including during a panic or after a failed build, deletes
//! every namespace of the prefix, which destroys their links. A crashed process cannot
//! drop anything; [`cleanup`] removes the leftovers of a prefix and [`leftovers`] lists
//! them. Processes started with [`Topology::spawn`] are killed when their [`ChildGuard`]
//! drops.

// Network namespaces, veths and processes in them: Linux only (an empty crate elsewhere).
#![cfg(target_os = "linux")]
#![forbid(unsafe_code)]

mod addressing;
mod cleanup;
mod plan;
mod process;
mod topology;

pub use addressing::Addressing;
pub use cleanup::{Leftovers, cleanup, leftovers, random_prefix};
pub use process::ChildGuard;
pub use topology::{Namespace, Node, Pod, Topology, TopologyBuilder};

use std::io;

/// Errors from building, changing, using and cleaning up a topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A node, pod or prefix name is not acceptable.
    #[error("invalid {kind} name {name:?}: {reason}")]
    InvalidName {
        /// "node", "pod" or "prefix".
        kind: &'static str,
        /// The offending name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A name is used twice (node and pod names share one space).
    #[error("duplicate name {0:?}")]
    Duplicate(String),
    /// No node or pod has this name.
    #[error("no node or pod named {0:?}")]
    Unknown(String),
    /// The address plan has no room left.
    #[error("too many {what}: at most {limit}")]
    TooMany {
        /// "nodes" or "pods on node X".
        what: String,
        /// The limit.
        limit: usize,
    },
    /// The address ranges are unusable.
    #[error("invalid addressing: {0}")]
    Addressing(&'static str),
    /// A command was empty.
    #[error("empty command")]
    EmptyCommand,
    /// A program could not be started.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The underlying error.
        source: io::Error,
    },
    /// An `ip` invocation failed.
    #[error("ip -batch in {netns} failed ({status}): {stderr}")]
    Ip {
        /// The namespace it ran in ("root" for the caller's).
        netns: String,
        /// Exit status.
        status: std::process::ExitStatus,
        /// What ip printed.
        stderr: String,
    },
    /// Writing a sysctl failed.
    #[error("setting sysctl {key} in {netns}: {source}")]
    Sysctl {
        /// The namespace.
        netns: String,
        /// The key, as a path under /proc/sys.
        key: String,
        /// The underlying error.
        source: io::Error,
    },
    /// Opening or entering a namespace failed.
    #[error(transparent)]
    Netns(#[from] ambit_netns::NetnsError),
    /// Reading the system state during cleanup failed.
    #[error("inspecting {what}: {source}")]
    Inspect {
        /// What was read.
        what: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// Cleanup ran but something of the prefix is still there.
    #[error("cleanup of {prefix} left {leftovers:?}")]
    Leftover {
        /// The prefix.
        prefix: String,
        /// What remained.
        leftovers: Leftovers,
    },
}
