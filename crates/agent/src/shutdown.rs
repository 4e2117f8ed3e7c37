//! Agent shutdown: upgrade or uninstall (`spec/cni.md` §1.10).
//!
//! On SIGTERM the agent must guess whether it is being replaced (rolling upgrade, node
//! reboot: leave everything in place so enrolled pods stay captured and probes keep
//! working, new ambient pods just stall until the replacement is up) or removed for good
//! (full cleanup, so new pods are not stuck behind a plugin whose agent never returns).
//! Upstream asks the API server about its DaemonSet; here the decision is an
//! [`UninstallCheck`]:
//!
//! - [`AlwaysUpgrade`] (default): keep the CNI config entry, plugin binary, kubeconfig,
//!   host rules and probe set; only sockets close.
//! - [`DisableSafeUpgrade`] (`AMBIENT_DISABLE_SAFE_UPGRADE=true`): always clean up.
//! - [`DaemonSetCheck`]: upstream's rule over a [`DaemonSetLookup`], implemented against
//!   the API server by [`crate::pods::kube_daemonset::KubeDaemonSetLookup`] (what
//!   `ambit cni-agent` uses with the Kubernetes pod source) (DaemonSet present, not deleting, affinity matching
//!   → upgrade; NotFound / deleting / Unauthorized / affinity mismatch → uninstall; lookup
//!   errors retried, undetermined → upgrade, the safe side).
//!
//! Full cleanup: remove the `istio-cni` entry from the CNI config (deleting the file when
//! nothing else is left in it; the Istio-owned or standalone file is deleted), then the
//! plugin kubeconfig and the copied `istio-cni` binary (only in the directories the
//! installer was configured with, see [`crate::installer::uninstall`]), delete host rules,
//! destroy the probe set, remove our socket files and the standby guard table of every
//! enrolled pod (ambit's own addition: it outlives the agent by design, so a pod still
//! running after the uninstall must not keep it). The installer has stopped by then, so
//! it cannot put anything back. Never done, on either path: deleting in-pod redirection
//! rules of running pods (they stay captured until un-enrolled by a running agent). AWS
//! branch-ENI host rules this process added are removed too
//! ([`crate::daemon::aws_eni::remove_all`]).

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use ambit_redirect::{ApplyError, Backend, Guard, HostRules, KernelError, ProbeSet, ProbeSetError};

use crate::config::AgentConfig;
use crate::installer::{InstallConfig, InstallerError};
use ambit_redirect::HostRunner;

/// A boxed future, so checks can be trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a shutdown does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownKind {
    /// Leave config, host rules and probe set in place (a replacement agent follows).
    Upgrade,
    /// Remove everything the agent installed on the node, except in-pod rules.
    Uninstall,
}

/// Decides between upgrade and uninstall at shutdown.
pub trait UninstallCheck: Send + Sync + fmt::Debug {
    /// The decision; must not fail (undetermined means [`ShutdownKind::Upgrade`]).
    fn decide(&self) -> BoxFuture<'_, ShutdownKind>;
}

/// Always an upgrade (the default without a Kubernetes API).
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysUpgrade;

impl UninstallCheck for AlwaysUpgrade {
    fn decide(&self) -> BoxFuture<'_, ShutdownKind> {
        Box::pin(std::future::ready(ShutdownKind::Upgrade))
    }
}

/// Always an uninstall (`AMBIENT_DISABLE_SAFE_UPGRADE=true`).
#[derive(Debug, Clone, Copy, Default)]
pub struct DisableSafeUpgrade;

impl UninstallCheck for DisableSafeUpgrade {
    fn decide(&self) -> BoxFuture<'_, ShutdownKind> {
        Box::pin(std::future::ready(ShutdownKind::Uninstall))
    }
}

/// The check the configuration asks for when no Kubernetes check is supplied.
pub fn check_for(cfg: &AgentConfig) -> Box<dyn UninstallCheck> {
    if cfg.disable_safe_upgrade {
        Box::new(DisableSafeUpgrade)
    } else {
        Box::new(AlwaysUpgrade)
    }
}

/// What the API server says about the agent's DaemonSet (`istio-cni-node` in
/// `POD_NAMESPACE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonSetState {
    /// Exists, not being deleted, and its required node affinity matches this node.
    Active,
    /// Has a deletion timestamp.
    Deleting,
    /// Exists but would no longer schedule on this node.
    AffinityMismatch,
    /// Gone.
    NotFound,
    /// Our RBAC is gone (the chart was uninstalled).
    Unauthorized,
}

/// Why one DaemonSet lookup decided nothing (a transient failure, retried by
/// [`DaemonSetCheck`]); each names the object asked about.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The API server could not be asked, or answered with an error that says nothing
    /// about the object (5xx, 429, a timeout).
    #[error("{kind} {name}: {source}")]
    Api {
        /// `DaemonSet` or `node`.
        kind: &'static str,
        /// `namespace/name` of the DaemonSet, or the node's name.
        name: String,
        /// What the client reported (boxed: it is large and this travels in a `Result`).
        #[source]
        source: Box<ambit_kubeapi::Error>,
    },
    /// The answer does not parse as the object.
    #[error("{kind} {name}: unexpected shape: {source}")]
    Decode {
        /// `DaemonSet` or `node`.
        kind: &'static str,
        /// `namespace/name` of the DaemonSet, or the node's name.
        name: String,
        /// What the decoder reported.
        #[source]
        source: serde_json::Error,
    },
}

/// Looks the DaemonSet up (a Kubernetes client implements this).
pub trait DaemonSetLookup: Send + Sync + fmt::Debug {
    /// One attempt; `Err` is a transient failure worth a retry.
    fn lookup(&self) -> BoxFuture<'_, Result<DaemonSetState, LookupError>>;
}

/// Upstream's decision over a [`DaemonSetLookup`].
#[derive(Debug, Clone)]
pub struct DaemonSetCheck<L> {
    /// The lookup.
    pub lookup: L,
    /// Extra attempts after a failed lookup (upstream: 0, or 2 with
    /// `ISTIO_OWNED_CNI_CONFIG`).
    pub retries: u32,
    /// Pause between attempts (upstream: 1 s).
    pub retry_delay: Duration,
}

impl<L: DaemonSetLookup> UninstallCheck for DaemonSetCheck<L> {
    fn decide(&self) -> BoxFuture<'_, ShutdownKind> {
        Box::pin(async move {
            for attempt in 0..=self.retries {
                match self.lookup.lookup().await {
                    Ok(DaemonSetState::Active) => return ShutdownKind::Upgrade,
                    Ok(state) => {
                        tracing::info!(?state, "agent DaemonSet is going away: uninstalling");
                        return ShutdownKind::Uninstall;
                    }
                    Err(e) => {
                        let error = crate::pods::kube::error_chain(&e);
                        tracing::warn!(attempt, %error, "cannot look up agent DaemonSet");
                        if attempt < self.retries {
                            tokio::time::sleep(self.retry_delay).await;
                        }
                    }
                }
            }
            // Undetermined: keeping state is the safe side (pods stay captured).
            ShutdownKind::Upgrade
        })
    }
}

/// One failed cleanup step.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// Removing the CNI config entry, kubeconfig or plugin binary failed.
    #[error("undoing the CNI install: {0}")]
    Install(#[from] InstallerError),
    /// Deleting host rules failed.
    #[error("deleting host rules: {0}")]
    HostRules(#[from] ApplyError),
    /// Destroying the probe set failed.
    #[error("destroying probe set: {0}")]
    ProbeSet(#[from] ProbeSetError),
    /// A pod's standby guard table could not be removed.
    #[error("removing the standby guard table of pod {pod}: {source}")]
    Guard {
        /// The pod.
        pod: String,
        /// What the kernel said.
        #[source]
        source: KernelError,
    },
    /// The cleanup thread panicked.
    #[error("cleanup task panicked")]
    Panicked,
    /// Removing a socket file failed.
    #[error("removing {path}: {source}")]
    Socket {
        /// The file.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
}

/// Cleanup that did not fully succeed; every step is tried, all failures are reported.
#[derive(Debug, thiserror::Error)]
#[error("uninstall cleanup: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ShutdownError(pub Vec<CleanupError>);

/// What an uninstall removes; built by the agent at start.
#[derive(Debug, Clone)]
pub(crate) struct Cleanup {
    pub host_runner: HostRunner,
    pub backend: Backend,
    pub ipv6: bool,
    pub host_rules: HostRules,
    pub install: InstallConfig,
    pub sockets: Vec<PathBuf>,
}

impl Cleanup {
    /// Full cleanup (blocking). The CNI entry goes first, so the runtime stops calling a
    /// plugin whose agent is leaving, then kubeconfig and binary; host rules before the
    /// set they match on; the enrolled pods' standby guard tables last (each `guards`
    /// entry: pod name, its guard).
    pub fn uninstall(
        &self,
        guards: Vec<(String, std::sync::Arc<std::sync::Mutex<Guard>>)>,
    ) -> Result<(), ShutdownError> {
        let mut errors: Vec<CleanupError> = Vec::new();
        let (removed, failed) = crate::installer::uninstall(&self.install);
        for f in removed {
            tracing::info!(file = %f.display(), "removed istio-cni install");
        }
        errors.extend(failed.into_iter().map(CleanupError::from));
        if let Err(e) = self.host_rules.delete(&self.host_runner) {
            errors.push(e.into());
        }
        for e in crate::daemon::aws_eni::remove_all(&self.host_runner) {
            tracing::warn!(error = %e, "branch-ENI rule not removed");
        }
        let probe = ProbeSet::new(self.host_runner.clone(), self.backend, self.ipv6);
        if let Err(e) = probe.destroy() {
            errors.push(e.into());
        }
        for path in &self.sockets {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    errors.push(CleanupError::Socket {
                        path: path.clone(),
                        source: e,
                    });
                }
                _ => {}
            }
        }
        for (pod, guard) in guards {
            let removed = guard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove_standby();
            if let Err(source) = removed {
                errors.push(CleanupError::Guard { pod, source });
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ShutdownError(errors))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[derive(Debug)]
    struct Script {
        answers: Mutex<Vec<Result<DaemonSetState, LookupError>>>,
        calls: AtomicU32,
    }

    impl DaemonSetLookup for Script {
        fn lookup(&self) -> BoxFuture<'_, Result<DaemonSetState, LookupError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let next = {
                let mut a = self.answers.lock().unwrap_or_else(|e| e.into_inner());
                if a.is_empty() {
                    Err(failure("exhausted"))
                } else {
                    a.remove(0)
                }
            };
            Box::pin(std::future::ready(next))
        }
    }

    /// A transient failure (an undecodable answer) about the object `name`.
    fn failure(name: &str) -> LookupError {
        LookupError::Decode {
            kind: "DaemonSet",
            name: name.into(),
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn daemonset_rule() {
        use DaemonSetState::*;
        use ShutdownKind::*;
        type Answers = Vec<Result<DaemonSetState, LookupError>>;
        let err = || Err::<DaemonSetState, LookupError>(failure("istio-system/istio-cni-node"));
        // (answers, retries, decision, lookups made)
        let cases: Vec<(Answers, u32, ShutdownKind, u32)> = vec![
            (vec![Ok(Active)], 0, Upgrade, 1),
            (vec![Ok(Deleting)], 0, Uninstall, 1),
            (vec![Ok(AffinityMismatch)], 0, Uninstall, 1),
            (vec![Ok(NotFound)], 0, Uninstall, 1),
            (vec![Ok(Unauthorized)], 0, Uninstall, 1),
            (vec![err()], 0, Upgrade, 1),
            (vec![err(), Ok(NotFound)], 0, Upgrade, 1),
            (vec![err(), Ok(NotFound)], 2, Uninstall, 2),
            (vec![err(), err(), err()], 2, Upgrade, 3),
        ];
        for (i, (answers, retries, want, calls)) in cases.into_iter().enumerate() {
            let check = DaemonSetCheck {
                lookup: Script {
                    answers: Mutex::new(answers),
                    calls: AtomicU32::new(0),
                },
                retries,
                retry_delay: Duration::from_secs(1),
            };
            assert_eq!(check.decide().await, want, "case {i}");
            assert_eq!(check.lookup.calls.load(Ordering::SeqCst), calls, "case {i}");
        }
        assert_eq!(AlwaysUpgrade.decide().await, Upgrade);
        assert_eq!(DisableSafeUpgrade.decide().await, Uninstall);
    }
}
