//! `ambit restart ztunnel|agent NODE`: the node component is run again with its recorded
//! command and environment, in the node namespace, and recorded in `state.json` (the
//! orchestrator and `down` stop it like the original).
//!
//! A ztunnel is replaced as a DaemonSet rolling update replaces upstream's ztunnel pod, with
//! an overlap ([`Mesh::restart_ztunnel`], run by the orchestrator on `ambit restart ztunnel`):
//! the new ztunnel starts in a new ztunnel pod namespace on the node, connects to the agent
//! (which sends it every pod: its listeners bind beside the old ones with SO_REUSEPORT) and
//! becomes ready; only then is the old one sent SIGTERM (it drains, its queued connections
//! move to the new listeners) and its namespace removed.
//!
//! The agent runs in the node namespace (host network, as upstream), so its restart is
//! stop-then-start ([`Mesh::restart_agent`], run by the orchestrator on `ambit restart
//! agent`, so its supervisor does not take the stop for a crash): the old agent is stopped
//! (SIGTERM: it keeps its pods' rules), the new one started and waited for until ready.
//! [`restart`] does the same from the run directory alone, when no orchestrator runs (for a
//! ztunnel too).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use ambit_netns::{NetnsFd, set_command_netns};

use crate::process::{self, ProcessError};
use crate::state::{CommandSpec, MeshState, ProcessRecord, Role, RunDir, StateError, ZtunnelPod};
use ambit_contract::ports;

use crate::up::{Mesh, UpError, ztunnel_pod_name};

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
    #[error("ztunnel pod namespace: {0}")]
    Topology(#[from] ambit_topology::TopologyError),
    #[error(transparent)]
    Up(Box<UpError>),
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
    let (old, spec, log) = recorded(&state, &role)?;
    let old_pid = process::is_alive(&old).then_some(old.pid);
    let left = process::stop_all(std::slice::from_ref(&old), Duration::from_secs(10), || {});
    if !left.is_empty() {
        return Err(RestartError::Stuck { role, pid: old.pid });
    }
    let netns = match component {
        Component::Ztunnel => n.ztunnel_netns().to_path_buf(),
        Component::Agent => n.netns.clone(),
    };
    let mut cmd = spec.command();
    set_command_netns(&mut cmd, &NetnsFd::open(&netns)?)?;
    let (mut child, record) = process::spawn(cmd, role.clone(), &log)?;
    let new_pid = record.pid;
    state.processes.push(record);
    run.save(&state)?;
    let ready = || match component {
        Component::Ztunnel => crate::probe::ok(
            &netns,
            SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_READINESS)),
            "/healthz/ready",
        ),
        Component::Agent => crate::probe::ok(&netns, n.agent_health, "/readyz"),
    };
    await_ready(&mut child, ready, timeout, &role, new_pid, &log)?;
    Ok(Restarted {
        role,
        old_pid,
        new_pid,
    })
}

/// Polls `ready` until it holds, for up to `timeout`; fails early when `child` exits.
fn await_ready(
    child: &mut Child,
    mut ready: impl FnMut() -> bool,
    timeout: Duration,
    role: &Role,
    pid: u32,
    log: &Path,
) -> Result<(), RestartError> {
    let deadline = Instant::now() + timeout;
    let log = || log.display().to_string();
    loop {
        if ready() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(RestartError::Exited {
                role: role.clone(),
                status,
                log: log(),
            });
        }
        if Instant::now() >= deadline {
            return Err(RestartError::NotReady {
                role: role.clone(),
                pid,
                timeout,
                log: log(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The newest recorded process of `role` with the command that started it and its log.
fn recorded(
    state: &MeshState,
    role: &Role,
) -> Result<(ProcessRecord, CommandSpec, std::path::PathBuf), RestartError> {
    let old = state
        .processes
        .iter()
        .rev()
        .find(|p| &p.role == role && p.command.is_some())
        .cloned();
    match old {
        Some(old) => match (old.command.clone(), old.log.clone()) {
            (Some(spec), Some(log)) => Ok((old, spec, log)),
            _ => Err(RestartError::NotRecorded { role: role.clone() }),
        },
        None => Err(RestartError::NotRecorded { role: role.clone() }),
    }
}

impl Mesh {
    /// Replaces `node`'s ztunnel with an overlap (see the module documentation); the new
    /// one is ready before the old one is told to stop.
    pub fn restart_ztunnel(&mut self, node: &str) -> Result<Restarted, RestartError> {
        let known = || {
            self.state
                .nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some(ni) = self.state.nodes.iter().position(|n| n.name == node) else {
            return Err(RestartError::UnknownNode {
                node: node.to_owned(),
                known: known(),
            });
        };
        let role = Role::Ztunnel {
            node: node.to_owned(),
        };
        let (old, spec, log) = recorded(&self.state, &role)?;
        let old_pod = self.state.nodes[ni].ztunnel.clone();
        let generation = old_pod.as_ref().map_or(1, |z| z.generation) + 1;
        let name = ztunnel_pod_name(node, generation);
        let topo = self
            .topology
            .as_mut()
            .ok_or(RestartError::NoMesh(self.run.root().to_path_buf()))?;
        let pod = topo.add_pod(node, &name)?;
        let new_pod = ZtunnelPod {
            name: name.clone(),
            netns: pod.netns_path(),
            ip: pod.ip(),
            generation,
        };
        let mut cmd = spec.command();
        set_command_netns(&mut cmd, &NetnsFd::open(&new_pod.netns)?)?;
        // Appends to the same log, as a restarted container's log continues.
        let (mut child, record) = process::spawn(cmd, role.clone(), &log)?;
        let new_pid = record.pid;
        let new_record = record.clone();
        self.state.processes.push(record);
        self.run.save(&self.state)?;
        let ready = SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_READINESS));
        let netns = new_pod.netns.clone();
        if let Err(e) = await_ready(
            &mut child,
            || crate::probe::ok(&netns, ready, "/healthz/ready"),
            self.cfg.timeout,
            &role,
            new_pid,
            &log,
        ) {
            // The old ztunnel keeps serving; remove the new one's traces.
            let _ = child.kill();
            let _ = child.wait();
            self.state.processes.retain(|p| p != &new_record);
            if let Some(t) = self.topology.as_mut() {
                let _ = t.remove_pod(&name);
            }
            self.run.save(&self.state)?;
            return Err(e);
        }
        self.track(new_record, child);
        // A restart the supervisor had pending for the old one is moot now.
        self.supervisor.forget(&role);
        self.state.nodes[ni].ztunnel = Some(new_pod);
        self.run.save(&self.state)?;
        // Now the old one: SIGTERM, it drains (bounded by its own drain deadline).
        let old_pid = process::is_alive(&old).then_some(old.pid);
        let children = &mut self.children;
        let left = process::stop_all(std::slice::from_ref(&old), Duration::from_secs(10), || {
            for (_, c) in children.iter_mut() {
                let _ = c.try_wait();
            }
        });
        self.children.retain(|(r, _)| r != &old);
        self.state.processes.retain(|p| p != &old);
        if let (Some(old_pod), Some(t)) = (old_pod, self.topology.as_mut())
            && let Err(e) = t.remove_pod(&old_pod.name)
        {
            tracing::warn!(pod = %old_pod.name, error = %e, "removing the old ztunnel pod");
        }
        self.run.save(&self.state)?;
        if !left.is_empty() {
            return Err(RestartError::Stuck { role, pid: old.pid });
        }
        Ok(Restarted {
            role,
            old_pid,
            new_pid,
        })
    }
}

impl Mesh {
    /// Restarts `node`'s agent (stop, then start: it runs in the node namespace, as upstream's
    /// host-network agent) and waits for it to be ready. Run by the orchestrator, so its
    /// supervisor never takes the deliberate stop for a crash.
    pub fn restart_agent(&mut self, node: &str) -> Result<Restarted, RestartError> {
        let Some(n) = self.state.nodes.iter().find(|n| n.name == node).cloned() else {
            return Err(RestartError::UnknownNode {
                node: node.to_owned(),
                known: self
                    .state
                    .nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let role = Role::Agent {
            node: node.to_owned(),
        };
        let (old, spec, log) = recorded(&self.state, &role)?;
        self.supervisor.forget(&role);
        let old_pid = process::is_alive(&old).then_some(old.pid);
        let children = &mut self.children;
        let left = process::stop_all(std::slice::from_ref(&old), Duration::from_secs(10), || {
            for (_, c) in children.iter_mut() {
                let _ = c.try_wait();
            }
        });
        self.children.retain(|(r, _)| r != &old);
        if !left.is_empty() {
            return Err(RestartError::Stuck { role, pid: old.pid });
        }
        let mut cmd = spec.command();
        set_command_netns(&mut cmd, &NetnsFd::open(&n.netns)?)?;
        let (mut child, record) = process::spawn(cmd, role.clone(), &log)?;
        let new_pid = record.pid;
        match self.state.processes.iter().position(|p| p == &old) {
            Some(i) => self.state.processes[i] = record.clone(),
            None => self.state.processes.push(record.clone()),
        }
        self.run.save(&self.state)?;
        let result = await_ready(
            &mut child,
            || crate::probe::ok(&n.netns, n.agent_health, "/readyz"),
            self.cfg.timeout,
            &role,
            new_pid,
            &log,
        );
        // Supervised either way: one that is not ready yet is still the node's agent.
        self.track(record, child);
        result.map(|()| Restarted {
            role,
            old_pid,
            new_pid,
        })
    }
}

impl From<UpError> for RestartError {
    fn from(e: UpError) -> Self {
        RestartError::Up(Box::new(e))
    }
}
