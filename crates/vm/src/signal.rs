//! Signals to processes by pid: SIGTERM to ztunnel and to a running `vm up`.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn pid(p: u32) -> Option<Pid> {
    i32::try_from(p).ok().filter(|p| *p > 0).map(Pid::from_raw)
}

/// Sends SIGTERM; `false` when there is no such process.
pub fn terminate(p: u32) -> bool {
    pid(p).is_some_and(|p| kill(p, Signal::SIGTERM).is_ok())
}

/// Whether a process with this pid exists.
pub fn alive(p: u32) -> bool {
    pid(p).is_some_and(|p| kill(p, None).is_ok())
}
