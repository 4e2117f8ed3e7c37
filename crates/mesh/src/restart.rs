//! `ambit restart ztunnel|agent NODE`: the node component is run again with its recorded
//! command and environment, in the node namespace, and recorded in `state.json` (the
//! orchestrator and `down` stop it like the original).
//!
//! Order: the old process is stopped (SIGTERM: a ztunnel drains, an agent keeps its pods'
//! rules), then the new one is started and waited for until ready. Starting the new one
//! first — upstream's overlapping hand-off — is not possible here: both would run in the
//! node namespace and the second could not bind the admin, stats and readiness ports
//! (15000/15020/15021) or the agent's health port, and the topology cannot add a namespace
//! to a running mesh. The in-pod side of the hand-off (listeners re-created by the new
//! ztunnel from the agent's snapshot) is exercised all the same.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ambit_netns::{NetnsFd, set_command_netns};

use crate::process::{self, ProcessError};
use crate::state::{Role, RunDir, StateError};
use crate::up::ZTUNNEL_READY_PORT;

/// Which node component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Ztunnel,
    Agent,
}

/// Why a restart failed.
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("entering the node namespace: {0}")]
    Netns(#[from] ambit_netns::NetnsError),
    #[error("no mesh in {0}")]
    NoMesh(std::path::PathBuf),
    #[error("no node {node:?}; known: {known}")]
    UnknownNode { node: String, known: String },
    #[error("no {role} recorded (or its command line is not: started by an older ambit)")]
    NotRecorded { role: Role },
    #[error("old {role} (pid {pid}) did not stop")]
    Stuck { role: Role, pid: u32 },
    #[error("new {role} (pid {pid}) not ready after {timeout:?}; see {log}")]
    NotReady {
        role: Role,
        pid: u32,
        timeout: Duration,
        log: String,
    },
    #[error("new {role} exited ({status}); see {log}")]
    Exited {
        role: Role,
        status: std::process::ExitStatus,
        log: String,
    },
}

/// What was restarted.
#[derive(Debug, Clone)]
pub struct Restarted {
    pub role: Role,
    pub old_pid: Option<u32>,
    pub new_pid: u32,
}

/// Restarts `component` on `node` and waits up to `timeout` for the new one to be ready.
pub fn restart(
    run: &RunDir,
    component: Component,
    node: &str,
    timeout: Duration,
) -> Result<Restarted, RestartError> {
    let mut state = run
        .load()?
        .ok_or_else(|| RestartError::NoMesh(run.root().to_path_buf()))?;
    let n = state
        .nodes
        .iter()
        .find(|n| n.name == node)
        .cloned()
        .ok_or_else(|| RestartError::UnknownNode {
            node: node.to_owned(),
            known: state
                .nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let role = match component {
        Component::Ztunnel => Role::Ztunnel {
            node: node.to_owned(),
        },
        Component::Agent => Role::Agent {
            node: node.to_owned(),
        },
    };
    let old = state
        .processes
        .iter()
        .rev()
        .find(|p| p.role == role && p.command.is_some())
        .cloned()
        .ok_or_else(|| RestartError::NotRecorded { role: role.clone() })?;
    let (Some(spec), Some(log)) = (old.command.clone(), old.log.clone()) else {
        return Err(RestartError::NotRecorded { role });
    };
    let old_pid = process::is_alive(&old).then_some(old.pid);
    let left = process::stop_all(std::slice::from_ref(&old), Duration::from_secs(10), || {});
    if !left.is_empty() {
        return Err(RestartError::Stuck { role, pid: old.pid });
    }
    let mut cmd = spec.command();
    set_command_netns(&mut cmd, &NetnsFd::open(&n.netns)?)?;
    let (mut child, record) = process::spawn(cmd, role.clone(), &log)?;
    let new_pid = record.pid;
    state.processes.push(record);
    run.save(&state)?;
    let netns = n.netns.clone();
    let ready = || match component {
        Component::Ztunnel => crate::probe::ok(
            &netns,
            SocketAddr::from(([127, 0, 0, 1], ZTUNNEL_READY_PORT)),
            "/healthz/ready",
        ),
        Component::Agent => crate::probe::ok(&netns, n.agent_health, "/readyz"),
    };
    let deadline = Instant::now() + timeout;
    let log = log.display().to_string();
    loop {
        if ready() {
            return Ok(Restarted {
                role,
                old_pid,
                new_pid,
            });
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(RestartError::Exited { role, status, log });
        }
        if Instant::now() >= deadline {
            return Err(RestartError::NotReady {
                role,
                pid: new_pid,
                timeout,
                log,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
