//! The agent's Windows node parts (`spec/windows.md`): reading a sandbox's HNS namespace
//! from containerd's CRI answer ([`cri`], platform-neutral), asking the runtime for the
//! sandboxes of running pods ([`sandboxes`], the CRI client; its Unix transport is how it is
//! tested against a fake runtime), capturing the pods that already run ([`running`]: CRI,
//! then HNS, then the two `L4WFPPROXY` policies on every endpoint, platform-neutral over
//! traits), the node agent's loop that ties them to the pod watch, ZDS and the annotations
//! ([`daemon`], platform-neutral over traits), the readiness and metrics it publishes for the
//! health and metrics servers ([`monitor`], platform-neutral), and on Windows the HCN calls
//! behind those traits and one pod's capture and release (`enrol`).

#[cfg(windows)]
pub mod agent;
pub mod config;
pub mod cri;
pub mod daemon;
#[cfg(windows)]
pub mod enrol;
pub mod monitor;
pub mod running;
pub mod sandboxes;

use ambit_netns::guid::Guid;

/// A pod's HNS namespace as ZDS names it to ztunnel (`platform::PodNamespace` on Windows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HnsPodNamespace {
    /// The namespace ID.
    pub guid: Guid,
    /// Its compartment as last read from HNS; 0 while it has none.
    pub compartment: u32,
}
