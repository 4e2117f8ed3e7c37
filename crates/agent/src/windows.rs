//! The agent's Windows node parts (`spec/windows.md`): reading a sandbox's HNS namespace
//! from containerd's CRI answer ([`cri`], platform-neutral), asking the runtime for the
//! sandboxes of running pods ([`sandboxes`], the CRI client; its Unix transport is how it is
//! tested against a fake runtime), and on Windows resolving a namespace with HNS and putting
//! the two `L4WFPPROXY` policies on every endpoint (`enrol`).

pub mod cri;
#[cfg(windows)]
pub mod enrol;
pub mod sandboxes;
