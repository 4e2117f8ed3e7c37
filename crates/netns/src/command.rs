//! Starting child processes inside a network namespace.

use std::process::Command;

use crate::{NetnsError, NetnsFd, imp};

/// Makes `cmd` start inside `netns`: the child calls `setns` between fork and exec, so
/// the parent's threads never change namespace and no `ip netns exec` is needed.
///
/// Unlike `ip netns exec`, `/sys` is not remounted and `/etc/netns/NAME` is not bound;
/// tools that talk netlink or read `/proc/sys/net` (ip, ss, iptables, nft, sysctl) see the
/// namespace correctly. For a `tokio::process::Command` pass `cmd.as_std_mut()`.
pub fn set_command_netns(cmd: &mut Command, netns: &NetnsFd) -> Result<(), NetnsError> {
    // The hook owns its own copy, so the caller may drop `netns` before spawning.
    let fd = netns.try_clone()?.into_owned_fd();
    imp::set_pre_exec(cmd, fd)
}

/// Makes the child started by `cmd` receive SIGKILL when the thread that spawns it exits
/// (`PR_SET_PDEATHSIG`), so a helper process never outlives a parent killed with SIGKILL.
/// Spawn from a thread that lives as long as the child should (the main thread, say).
pub fn kill_with_parent(cmd: &mut Command) {
    imp::set_pdeathsig(cmd);
}
