//! The agent's Windows node parts (`spec/windows.md`): reading a sandbox's HNS namespace
//! from containerd's CRI answer ([`cri`], platform-neutral), and on Windows resolving it
//! with HNS and putting the two `L4WFPPROXY` policies on every endpoint (`enrol`).

pub mod cri;
#[cfg(windows)]
pub mod enrol;
