//! A [`NetnsRunner`] that starts rule tools inside a namespace we hold an fd for (setns
//! between fork and exec via `ambit_netns::set_command_netns`), so pods whose netns has no
//! name (e.g. `/proc/<pid>/ns/net`) work and no `ip netns exec`/`nsenter` is needed.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use ambit_netns::{NetnsFd, set_command_netns};
use ambit_redirect::{Cmd, CmdOutput, CurrentNetns, NetnsRunner, RunError};

/// Runs commands in the namespace of `netns`.
#[derive(Debug, Clone)]
pub struct FdRunner {
    /// The namespace.
    pub netns: Arc<NetnsFd>,
}

impl NetnsRunner for FdRunner {
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        let argv = cmd.argv.join(" ");
        let err = |source| RunError::Spawn {
            argv: argv.clone(),
            source,
        };
        let (program, args) = cmd
            .argv
            .split_first()
            .ok_or_else(|| err(std::io::Error::other("empty argv")))?;
        let mut c = Command::new(program);
        c.args(args)
            .stdin(if cmd.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        set_command_netns(&mut c, &self.netns).map_err(|e| err(std::io::Error::other(e)))?;
        let mut child = c.spawn().map_err(err)?;
        if let (Some(input), Some(mut pipe)) = (cmd.stdin.as_deref(), child.stdin.take()) {
            // Restore inputs are a few KiB, below the pipe buffer: no deadlock with stdout.
            pipe.write_all(input.as_bytes()).map_err(err)?;
        }
        let out = child.wait_with_output().map_err(err)?;
        Ok(CmdOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// The host side: the agent's own netns or a held host netns fd.
#[derive(Debug, Clone)]
pub enum HostRunner {
    /// The agent's own netns.
    Current(CurrentNetns),
    /// An explicit host netns.
    Fd(FdRunner),
}

impl NetnsRunner for HostRunner {
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        match self {
            Self::Current(r) => r.run(cmd),
            Self::Fd(r) => r.run(cmd),
        }
    }
}
