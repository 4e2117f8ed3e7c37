//! Running rule tools inside a network namespace.
//!
//! Everything this crate does to the kernel goes through [`NetnsRunner`]: one argv (plus
//! optional stdin) executed in some netns. [`FdRunner`] starts the tool inside a namespace
//! held by fd (setns between fork and exec, `ambit_netns::set_command_netns`), so pods whose
//! netns has no name (`/proc/<pid>/ns/net`) work without `ip netns exec` or `nsenter`;
//! [`HostRunner`] is the agent's host side (its own netns or a held host netns);
//! [`IpNetnsExec`] and [`Nsenter`] go through the external tools. All of them spawn through
//! one function.

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use ambit_netns::{NetnsFd, set_command_netns};

/// Failure to run a command (as opposed to a command that ran and failed).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The program could not be started or waited for.
    #[error("running {argv}: {source}")]
    Spawn {
        /// The command line, for the log.
        argv: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The program is not installed (or not in `PATH`): said by name, so a node without
    /// `ipset` or `nft` reads as a missing package, not as a missing file somewhere.
    #[error("{program} is not installed or not in PATH ({path}); needed to run {argv}")]
    NotFound {
        /// `argv[0]`.
        program: String,
        /// The `PATH` it was looked up in.
        path: String,
        /// The command line, for the log.
        argv: String,
    },
    /// The program ran and exited unsuccessfully where success was required.
    #[error("{argv} exited with {code:?}: {stderr}")]
    Failed {
        /// The command line, for the log.
        argv: String,
        /// Exit code (None if killed by a signal).
        code: Option<i32>,
        /// Trimmed stderr.
        stderr: String,
    },
}

/// One command: a program and its arguments, never a shell string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    /// `argv[0]` is the program, looked up in `PATH`.
    pub argv: Vec<String>,
    /// Fed to the program's stdin (restore / transaction input).
    pub stdin: Option<String>,
}

impl Cmd {
    /// A command without stdin.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            stdin: None,
        }
    }

    /// Attach stdin.
    pub fn with_stdin(mut self, stdin: impl Into<String>) -> Self {
        self.stdin = Some(stdin.into());
        self
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.argv.join(" "))
    }
}

/// What a finished command reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdOutput {
    /// Exit code (None if killed by a signal).
    pub code: Option<i32>,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
}

impl CmdOutput {
    /// Exit status 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs commands inside one network namespace.
pub trait NetnsRunner: fmt::Debug {
    /// Run `cmd` to completion in the namespace; a non-zero exit is not an error here.
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError>;

    /// Run `cmd` and require exit status 0.
    fn run_ok(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        let out = self.run(cmd)?;
        if out.success() {
            Ok(out)
        } else {
            Err(RunError::Failed {
                argv: cmd.to_string(),
                code: out.code,
                stderr: out.stderr.trim().to_owned(),
            })
        }
    }
}

/// Runs commands in a named namespace via `ip netns exec NAME`.
#[derive(Debug, Clone)]
pub struct IpNetnsExec {
    /// The name under `/run/netns`.
    pub name: String,
}

/// Runs commands in the namespace at a path via `nsenter --net=PATH`.
#[derive(Debug, Clone)]
pub struct Nsenter {
    /// e.g. `/proc/<pid>/ns/net` or a bind mount under `/run/netns`.
    pub path: PathBuf,
}

/// Runs commands in the caller's own network namespace (the agent's host netns).
#[derive(Debug, Clone, Copy, Default)]
pub struct CurrentNetns;

/// Runs commands in the namespace of `netns`.
#[derive(Debug, Clone)]
pub struct FdRunner {
    /// The namespace.
    pub netns: Arc<NetnsFd>,
}

/// The host side: the caller's own netns or a held host netns fd.
#[derive(Debug, Clone)]
pub enum HostRunner {
    /// The caller's own netns.
    Current(CurrentNetns),
    /// An explicit host netns.
    Fd(FdRunner),
}

impl NetnsRunner for IpNetnsExec {
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        let mut argv = vec![
            "ip".to_owned(),
            "netns".into(),
            "exec".into(),
            self.name.clone(),
        ];
        argv.extend(cmd.argv.iter().cloned());
        spawn(&argv, cmd.stdin.as_deref(), None)
    }
}

impl NetnsRunner for Nsenter {
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        let mut argv = vec![
            "nsenter".to_owned(),
            format!("--net={}", self.path.display()),
            "--".into(),
        ];
        argv.extend(cmd.argv.iter().cloned());
        spawn(&argv, cmd.stdin.as_deref(), None)
    }
}

impl NetnsRunner for CurrentNetns {
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        spawn(&cmd.argv, cmd.stdin.as_deref(), None)
    }
}

impl NetnsRunner for FdRunner {
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        spawn(&cmd.argv, cmd.stdin.as_deref(), Some(&self.netns))
    }
}

impl NetnsRunner for HostRunner {
    fn run(&self, cmd: &Cmd) -> Result<CmdOutput, RunError> {
        match self {
            Self::Current(r) => r.run(cmd),
            Self::Fd(r) => r.run(cmd),
        }
    }
}

/// Runs `argv` to completion, feeding `stdin`, inside `netns` when given (else in the
/// caller's namespace).
fn spawn(
    argv: &[String],
    stdin: Option<&str>,
    netns: Option<&NetnsFd>,
) -> Result<CmdOutput, RunError> {
    let err = |source| RunError::Spawn {
        argv: argv.join(" "),
        source,
    };
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| err(std::io::Error::other("empty argv")))?;
    tracing::debug!(cmd = %argv.join(" "), "run");
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(netns) = netns {
        set_command_netns(&mut command, netns).map_err(|e| err(std::io::Error::other(e)))?;
    }
    let mut child = command.spawn().map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            RunError::NotFound {
                program: program.clone(),
                path: std::env::var("PATH").unwrap_or_default(),
                argv: argv.join(" "),
            }
        } else {
            err(source)
        }
    })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Inputs are a few KiB, well under the pipe buffer, so writing before reading
        // stdout cannot deadlock; the pipe is closed when `pipe` drops.
        pipe.write_all(input.as_bytes()).map_err(err)?;
    }
    let out = child.wait_with_output().map_err(err)?;
    Ok(CmdOutput {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_is_named_as_missing() {
        let tool = format!("ambit-no-such-tool-{}", std::process::id());
        let cmd = Cmd::new([tool.as_str(), "create", "x"]);
        let e = CurrentNetns.run(&cmd).expect_err("the tool does not exist");
        assert!(
            matches!(&e, RunError::NotFound { program, argv, .. }
                if *program == tool && *argv == format!("{tool} create x")),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("{tool} is not installed or not in PATH (")),
            "{msg}"
        );
    }

    #[test]
    fn a_tool_that_fails_is_not_a_missing_tool() {
        let e = CurrentNetns
            .run_ok(&Cmd::new(["sh", "-c", "echo nope >&2; exit 3"]))
            .expect_err("exit 3");
        assert!(
            matches!(&e, RunError::Failed { code: Some(3), stderr, .. } if stderr == "nope"),
            "{e:?}"
        );
    }
}
