//! Child processes started inside a topology namespace, killed when their guard drops.

use std::{
    io,
    process::{Child, Output},
};

/// A child process that is killed (and reaped) when the guard drops, so a failing test
/// cannot leave processes holding namespaces alive.
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
}

impl ChildGuard {
    pub(crate) fn new(child: Child) -> Self {
        Self { child: Some(child) }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The child, e.g. to take its stdout or poll `try_wait`.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Waits for the child to exit on its own and collects its output.
    pub fn wait_with_output(mut self) -> io::Result<Output> {
        match self.child.take() {
            Some(child) => child.wait_with_output(),
            None => Err(io::Error::other("child already reaped")),
        }
    }

    /// Kills the child now and reaps it.
    pub fn kill(mut self) -> io::Result<()> {
        self.kill_and_reap()
    }

    fn kill_and_reap(&mut self) -> io::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // Fails only if it already exited, which wait() below handles.
        let _ = child.kill();
        child.wait().map(drop)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // Nothing useful to do with an error while dropping; the process is gone or ours
        // to leak either way.
        let _ = self.kill_and_reap();
    }
}
