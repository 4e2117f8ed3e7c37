//! Restarting what dies, as a kubelet does for `restartPolicy: Always`: every component the
//! orchestrator started (the control plane, each node's agent and ztunnel, every pod's
//! process) that exits on its own is started again with its recorded command, in the same
//! namespace (a kubelet restarts a container inside the pod's existing sandbox), and counted.
//!
//! The delay follows the kubelet's crash-loop back-off ([`Backoff`]): the first exit is
//! restarted at once, the next ones after 10 s, 20 s, 40 s, … capped at 5 min, and a process
//! that ran for 10 min starts the sequence again. The embedded mesh keeps kubelet's figures
//! unscaled: a single crash is restarted at once either way, which is what the recovery
//! drills measure, and only a component that keeps dying waits longer.
//!
//! Everything runs on the orchestrator's one loop ([`Mesh::supervise`] between two API
//! requests), so a restart never races `ambit down` or Ctrl-C: the loop stops supervising
//! before the teardown starts, and a process it has just started is already one of the
//! mesh's children, which the teardown stops. A process stopped on purpose (a hand-off, a
//! deleted pod, a teardown) is taken out of the children first and never restarted.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use ambit_netns::{NetnsFd, set_command_netns};

use crate::process;
use crate::state::{ProcessRecord, Role};
use crate::up::{Mesh, UpError};

/// The delay before the second restart of a crash loop (kubelet's initial back-off).
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// The longest delay between two restarts (kubelet's cap).
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A process that ran this long before exiting is restarted at once again (kubelet forgets
/// a container's back-off after 10 minutes without a restart).
pub const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// One component's crash-loop back-off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backoff {
    /// The delay of the next restart after the first (`None`: no crash loop yet).
    next: Option<Duration>,
}

impl Backoff {
    /// The delay before restarting a process that exited after running for `ran`: zero the
    /// first time, then [`BACKOFF_INITIAL`] doubling up to [`BACKOFF_MAX`]; a run of
    /// [`BACKOFF_RESET`] or more starts over.
    pub fn delay(&mut self, ran: Duration) -> Duration {
        if ran >= BACKOFF_RESET {
            self.next = None;
        }
        let delay = self.next.unwrap_or(Duration::ZERO);
        self.next = Some(match self.next {
            None => BACKOFF_INITIAL,
            Some(d) => (d * 2).min(BACKOFF_MAX),
        });
        delay
    }
}

/// What the supervisor did, for the orchestrator's log.
#[derive(Debug, Clone)]
pub enum Event {
    /// A component exited on its own; it is restarted after `restart_in` (`None`: it is not
    /// part of the mesh any more).
    Exited {
        role: Role,
        status: ExitStatus,
        log: Option<PathBuf>,
        restart_in: Option<Duration>,
    },
    /// A component was started again (after a crash or at the end of a [`Mesh::hold`]);
    /// `restarts` counts the crash restarts of its role.
    Restarted { role: Role, pid: u32, restarts: u32 },
    /// Starting it again failed; tried again after `retry_in`.
    RestartFailed {
        role: Role,
        error: String,
        retry_in: Duration,
    },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Exited {
                role,
                status,
                log,
                restart_in,
            } => {
                write!(f, "{role} exited ({status})")?;
                match restart_in {
                    Some(d) if d.is_zero() => f.write_str("; restarting it")?,
                    Some(d) => write!(f, "; restarting it in {}s (back-off)", d.as_secs())?,
                    None => f.write_str("; no longer part of the mesh, not restarted")?,
                }
                if let Some(log) = log {
                    write!(f, "; log: {}", log.display())?;
                }
                Ok(())
            }
            Event::Restarted {
                role,
                pid,
                restarts,
            } => write!(f, "{role} restarted (pid {pid}, restart {restarts})"),
            Event::RestartFailed {
                role,
                error,
                retry_in,
            } => write!(
                f,
                "restarting {role} failed: {error}; trying again in {}s",
                retry_in.as_secs()
            ),
        }
    }
}

/// A restart waiting for its time.
#[derive(Debug, Clone)]
struct Pending {
    /// The exited process (its command, log and role).
    record: ProcessRecord,
    due: Instant,
    /// A restart after a crash (counted), or the end of a [`Mesh::hold`] (not counted).
    crashed: bool,
}

/// The supervisor's memory: when each child started, each role's back-off, the restarts
/// waiting for their time.
#[derive(Debug, Default)]
pub(crate) struct Supervisor {
    started: HashMap<u32, Instant>,
    backoff: BTreeMap<Role, Backoff>,
    pending: Vec<Pending>,
}

impl Supervisor {
    /// Forgets `role`'s pending restart and back-off: it was stopped or replaced on purpose.
    pub(crate) fn forget(&mut self, role: &Role) {
        self.pending.retain(|p| &p.record.role != role);
        self.backoff.remove(role);
    }
}

impl Mesh {
    /// Adds a started process to the mesh's children (stopped on teardown, supervised).
    pub(crate) fn track(&mut self, record: ProcessRecord, child: Child) {
        self.supervisor.started.insert(record.pid, Instant::now());
        self.children.push((record, child));
    }

    /// One supervision pass: reaps the children that exited, schedules their restart, and
    /// starts the ones whose delay is over. Called from the orchestrator's loop.
    pub fn supervise(&mut self) -> Vec<Event> {
        let now = Instant::now();
        let mut events = Vec::new();
        let mut exited = Vec::new();
        self.children.retain_mut(|(r, c)| match c.try_wait() {
            Ok(Some(status)) => {
                exited.push((r.clone(), status));
                false
            }
            _ => true,
        });
        for (record, status) in exited {
            let ran = self
                .supervisor
                .started
                .remove(&record.pid)
                .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
            let restart_in = self.wanted(&record.role).then(|| {
                let delay = self
                    .supervisor
                    .backoff
                    .entry(record.role.clone())
                    .or_default()
                    .delay(ran);
                self.supervisor.pending.push(Pending {
                    record: record.clone(),
                    due: now + delay,
                    crashed: true,
                });
                delay
            });
            tracing::warn!(role = %record.role, %status, ?restart_in, "component exited");
            events.push(Event::Exited {
                role: record.role.clone(),
                status,
                log: record.log.clone(),
                restart_in,
            });
        }
        let (due, waiting): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.supervisor.pending)
                .into_iter()
                .partition(|p| p.due <= now);
        self.supervisor.pending = waiting;
        for p in due {
            let role = p.record.role.clone();
            if !self.wanted(&role) {
                continue;
            }
            match self.respawn(&p.record) {
                Ok(pid) => {
                    let restarts = if p.crashed {
                        self.state.count_restart(&role)
                    } else {
                        self.state.restarts(&role)
                    };
                    if let Err(e) = self.run.save(&self.state) {
                        tracing::warn!(error = %e, "recording a restart");
                    }
                    tracing::info!(%role, pid, restarts, "component restarted");
                    events.push(Event::Restarted {
                        role,
                        pid,
                        restarts,
                    });
                }
                Err(e) => {
                    let retry_in = self
                        .supervisor
                        .backoff
                        .entry(role.clone())
                        .or_default()
                        .delay(Duration::ZERO);
                    tracing::warn!(%role, error = %e, ?retry_in, "restart failed");
                    self.supervisor.pending.push(Pending {
                        record: p.record,
                        due: now + retry_in,
                        crashed: p.crashed,
                    });
                    events.push(Event::RestartFailed {
                        role,
                        error: e.to_string(),
                        retry_in,
                    });
                }
            }
        }
        events
    }

    /// Stops `role`'s process (SIGTERM, then SIGKILL after 10 s) and starts it again after
    /// `down_for`, as scaling a deployment to zero and back would: an outage rehearsal
    /// (`ambit stop`), not counted as a restart. Returns the stopped pid.
    pub fn hold(&mut self, role: &Role, down_for: Duration) -> Result<u32, UpError> {
        let Some(old) = self
            .state
            .processes
            .iter()
            .rev()
            .find(|p| &p.role == role && process::is_alive(p))
            .cloned()
        else {
            return Err(UpError::NotRunning { role: role.clone() });
        };
        if !self.children.iter().any(|(r, _)| r == &old) {
            return Err(UpError::NotRestartable { role: role.clone() });
        }
        self.supervisor.forget(role);
        let children = &mut self.children;
        let left = process::stop_all(std::slice::from_ref(&old), Duration::from_secs(10), || {
            for (_, c) in children.iter_mut() {
                let _ = c.try_wait();
            }
        });
        self.children.retain(|(r, _)| r != &old);
        self.supervisor.started.remove(&old.pid);
        if !left.is_empty() {
            return Err(UpError::Stuck {
                role: role.clone(),
                pid: old.pid,
            });
        }
        // The API bounds `down_for`; an unrepresentable instant is restarted at once.
        let now = Instant::now();
        self.supervisor.pending.push(Pending {
            record: old.clone(),
            due: now.checked_add(down_for).unwrap_or(now),
            crashed: false,
        });
        tracing::info!(%role, ?down_for, "component stopped on request");
        Ok(old.pid)
    }

    /// Whether `role` is still part of the mesh (a deleted pod's process is not restarted).
    fn wanted(&self, role: &Role) -> bool {
        match role {
            Role::Orchestrator => false,
            Role::Control => true,
            Role::Agent { node } | Role::Ztunnel { node } => {
                self.state.nodes.iter().any(|n| &n.name == node)
            }
            Role::Pod { namespace, name } => self
                .state
                .pods
                .iter()
                .any(|p| &p.namespace == namespace && &p.name == name && p.created),
            Role::Vm { namespace, name } | Role::VmCommand { namespace, name } => self
                .state
                .vms
                .iter()
                .any(|v| &v.namespace == namespace && &v.name == name),
        }
    }

    /// The namespace `role` runs in: the control plane in the bridge's, an agent in its
    /// node's, a ztunnel in its current ztunnel pod's, a pod's process in the pod's.
    pub(crate) fn netns_of(&self, role: &Role) -> Option<PathBuf> {
        match role {
            Role::Orchestrator => None,
            Role::Control => self.topology.as_ref().map(|t| t.bridge().path()),
            Role::Agent { node } => self
                .state
                .nodes
                .iter()
                .find(|n| &n.name == node)
                .map(|n| n.netns.clone()),
            Role::Ztunnel { node } => self
                .state
                .nodes
                .iter()
                .find(|n| &n.name == node)
                .map(|n| n.ztunnel_netns().to_path_buf()),
            Role::Pod { namespace, name } => self
                .state
                .pods
                .iter()
                .find(|p| &p.namespace == namespace && &p.name == name)
                .map(|p| p.netns.clone()),
            Role::Vm { namespace, name } | Role::VmCommand { namespace, name } => self
                .state
                .vms
                .iter()
                .find(|v| &v.namespace == namespace && &v.name == name)
                .map(|v| v.netns.clone()),
        }
    }

    /// Starts `old`'s command again in its role's namespace, appending to the same log,
    /// and records the new process in place of the old one.
    fn respawn(&mut self, old: &ProcessRecord) -> Result<u32, UpError> {
        let (Some(spec), Some(log)) = (&old.command, &old.log) else {
            return Err(UpError::NotRestartable {
                role: old.role.clone(),
            });
        };
        let netns = self
            .netns_of(&old.role)
            .ok_or_else(|| UpError::NotRestartable {
                role: old.role.clone(),
            })?;
        let mut cmd = spec.command();
        set_command_netns(&mut cmd, &NetnsFd::open(&netns)?)?;
        let (child, record) = process::spawn(cmd, old.role.clone(), log)?;
        let pid = record.pid;
        match self.state.processes.iter().position(|p| p == old) {
            Some(i) => self.state.processes[i] = record.clone(),
            None => self.state.processes.push(record.clone()),
        }
        self.track(record, child);
        self.run.save(&self.state)?;
        Ok(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_follows_the_kubelet() {
        let s = Duration::from_secs;
        // (how long the process ran, the delay before its restart)
        let cases = [
            (s(1), s(0)),
            (s(1), s(10)),
            (s(5), s(20)),
            (s(30), s(40)),
            (s(0), s(80)),
            (s(0), s(160)),
            (s(0), s(300)),
            (s(0), s(300)),
            (s(599), s(300)),
            // Ten minutes of running: a new crash counts as the first one.
            (s(600), s(0)),
            (s(1), s(10)),
        ];
        let mut b = Backoff::default();
        for (i, (ran, want)) in cases.into_iter().enumerate() {
            assert_eq!(b.delay(ran), want, "exit {i} after {ran:?}");
        }
    }
}
