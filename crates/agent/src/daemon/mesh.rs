//! Adding pods to and removing them from the mesh, in upstream's order (`spec/cni.md`
//! §1.4 step 5, §1.6, §1.7), plus the verification pass over enrolled pods.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ambit_netns::NetnsFd;
use ambit_redirect::{Guard, IfaceName, InPod, KernelError, PodRedirectConfig, RulesMark};

use super::aws_eni;
use super::rules_watch::{self, Verifier, WatchHandle};
use super::verify::{Enrolled, check_pod, rules_present, ztunnel_listening};
use super::{Core, Key, SharedGuard};
use crate::pods::{ENABLED, PENDING, Pod, PodSource, SourceError};
use ambit_contract::zds::PodUid;

use crate::zds::{ZdsError, ZdsPod};
use ambit_redirect::FdRunner;

/// Per-pod traffic override annotations (§2).
const BYPASS_INBOUND: &str = "ambient.istio.io/bypass-inbound-capture";
const DNS_CAPTURE: &str = "ambient.istio.io/dns-capture";
const VIRTUAL_IFACES: &str = "istio.io/reroute-virtual-interfaces";

/// An enrolled pod.
#[derive(Debug)]
pub(crate) struct Slot {
    pub pod: Pod,
    pub netns: Arc<NetnsFd>,
    pub ips: Vec<IpAddr>,
    pub inpod: InPod,
    /// ztunnel acked the last `Add`.
    pub acked: bool,
    /// The pod's ruleset-change watcher (`None`: disabled or not available).
    pub _watch: Option<WatchHandle>,
    /// The pod's fail-closed guard (`None`: disabled, ingress mode, or refused by the
    /// kernel); dropping the last handle removes the owned guard table, the standby table
    /// stays until removed (`ambit_redirect::kernel::guard` docs).
    pub guard: Option<SharedGuard>,
    /// The nf_tables generation of its last clean verification (fresh for every slot: it
    /// stands for this `inpod` in this `netns`).
    pub mark: Arc<RulesMark>,
}

/// Failure of a mesh operation; `retryable` ones are retried by the worker.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// The pod's netns could not be found or opened (not retryable).
    #[error("pod netns {path:?}: {reason}")]
    Netns {
        /// Path tried, if any.
        path: Option<PathBuf>,
        /// Why.
        reason: String,
    },
    /// Writing or deleting in-pod rules failed.
    #[error("in-pod rules: {0}")]
    Rules(#[source] Blocked<ambit_redirect::ApplyError>),
    /// ztunnel did not take the pod (retryable; rules stay: fail closed).
    #[error("ztunnel: {0}")]
    Zds(#[from] ZdsError),
    /// The standby guard table of a pod leaving the mesh could not be removed (retryable:
    /// left behind, it would cut the un-enrolled pod's TCP).
    #[error("removing the standby guard table: {0}")]
    Guard(#[source] Blocked<KernelError>),
    /// Host probe set update failed (retryable).
    #[error("probe set: {0}")]
    ProbeSet(#[source] Blocked<ambit_redirect::ProbeSetError>),
    /// Writing the annotation failed: retried unless the pod is gone (its delete event
    /// cleans up) or the server rejects the patch itself.
    #[error("annotating: {0}")]
    Annotate(#[source] SourceError),
}

impl MeshError {
    /// Whether the worker retries it.
    pub fn retryable(&self) -> bool {
        match self {
            Self::Netns { .. } | Self::Rules(_) => false,
            Self::Zds(_) | Self::ProbeSet(_) | Self::Guard(_) => true,
            Self::Annotate(e) => e.is_retryable(),
        }
    }
}

/// Go `strconv.ParseBool`; invalid values are ignored (with a warning) per §2.
fn annotation_bool(pod: &Pod, key: &str) -> Option<bool> {
    let v = pod.annotations.get(key)?;
    match ambit_contract::values::parse_bool(v) {
        Ok(b) => Some(b),
        Err(_) => {
            tracing::warn!(pod = %pod.name, annotation = key, value = %v, "ignoring invalid boolean");
            None
        }
    }
}

/// A step run on the blocking pool failed: its own error, or the task itself (a panic).
#[derive(Debug, thiserror::Error)]
pub enum Blocked<E: std::error::Error + 'static> {
    #[error(transparent)]
    Step(E),
    #[error("blocking task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// Runs a netlink/iptables step off the async workers, keeping its typed error.
pub(crate) async fn blocking<T: Send + 'static, E: std::error::Error + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, Blocked<E>> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(Blocked::Task)?
        .map_err(Blocked::Step)
}

impl<S: PodSource> Core<S> {
    /// The pod's rule set from global config and its override annotations.
    pub(super) fn inpod_for(&self, pod: &Pod) -> InPod {
        let cfg = PodRedirectConfig {
            ipv6: self.cfg.ipv6,
            dns_capture: annotation_bool(pod, DNS_CAPTURE).unwrap_or(self.cfg.dns_capture),
            ingress_mode: annotation_bool(pod, BYPASS_INBOUND).unwrap_or(false),
            virtual_interfaces: pod
                .annotations
                .get(VIRTUAL_IFACES)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .filter_map(|s| s.parse::<IfaceName>().ok())
                        .collect()
                })
                .unwrap_or_default(),
            probe_snat_v4: self.cfg.probe_snat_v4,
            probe_snat_v6: self.cfg.probe_snat_v6,
        };
        InPod {
            backend: self.backend(),
            config: cfg,
            reconcile: self.cfg.reconcile,
        }
    }

    async fn annotate(&self, pod: &Pod, value: Option<&str>) -> Result<(), MeshError> {
        self.source
            .annotate(&pod.namespace, &pod.name, value)
            .await
            .map_err(MeshError::Annotate)
    }

    /// The pod as ZDS names it; `netns: None` makes a snapshot send `Keep`.
    pub(super) fn zds_pod(pod: &Pod, netns: Option<&Arc<NetnsFd>>) -> Result<ZdsPod, ZdsError> {
        Ok(ZdsPod {
            uid: PodUid::new(pod.uid.clone())?,
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
            netns: netns.cloned(),
        })
    }

    /// Sends `Add` for the pod with its netns and waits for ztunnel's ack.
    async fn zds_add(&self, pod: &Pod, netns: &Arc<NetnsFd>) -> Result<(), ZdsError> {
        self.zds.add(Self::zds_pod(pod, Some(netns))?).await
    }

    /// §1.4 step 5: netns → rules → ztunnel Add → probe set → annotation `enabled`.
    /// `netns_path` comes from the CNI event; `None` (informer path) uses the known netns.
    pub(crate) async fn add_pod_to_mesh(
        &self,
        pod: &Pod,
        ips: &[IpAddr],
        netns_path: Option<PathBuf>,
    ) -> Result<(), MeshError> {
        let mut enrolled = self.enrolled.lock().await;
        // Informer path for a pod ztunnel already acked (a reconcile that read the cache
        // before a concurrent CNI ADD finished, or a retry after a probe-set/annotation
        // failure): only steps d and e can be missing. Redoing c would also turn a
        // shutdown racing the reconcile into a spurious `pending`.
        if netns_path.is_none()
            && let Some(slot) = enrolled.get(&pod.uid).filter(|s| s.acked)
        {
            let ips = slot.ips.clone();
            // The table lock stays held: add/remove never interleave on a pod.
            let result = self.finish_enrol(pod, ips).await;
            drop(enrolled);
            return result;
        }
        // a. netns: keep the held fd when the path names the same namespace.
        let existing = enrolled.get(&pod.uid).map(|s| s.netns.clone());
        let path = netns_path.or_else(|| existing.is_none().then(|| pod.netns.clone()).flatten());
        let netns = match (path, existing) {
            (Some(path), existing) => {
                let p = path.clone();
                let opened =
                    blocking(move || NetnsFd::open(&p))
                        .await
                        .map_err(|e| MeshError::Netns {
                            path: Some(path),
                            reason: e.to_string(),
                        })?;
                match existing {
                    Some(old) if old.same_namespace(&opened) => old,
                    _ => Arc::new(opened),
                }
            }
            (None, Some(old)) => old,
            // §1.5: not cached and no hint: look for it in the host's /proc.
            (None, None) => match self.scan_pod_netns(pod, &enrolled).await {
                Some(netns) => netns,
                None => {
                    return Err(MeshError::Netns {
                        path: None,
                        reason: "unknown (no CNI event yet, no netns hint, not found in /proc)"
                            .into(),
                    });
                }
            },
        };
        // b. rules (idempotent; iptables reconciles a delta when enabled).
        let inpod = self.inpod_for(pod);
        let applied = {
            let (inpod, runner) = (
                inpod.clone(),
                FdRunner {
                    netns: netns.clone(),
                },
            );
            blocking(move || inpod.apply(&runner)).await
        };
        if let Err(e) = applied {
            enrolled.remove(&pod.uid);
            return Err(MeshError::Rules(e));
        }
        let ips: Vec<IpAddr> = ips.iter().map(|ip| ip.to_canonical()).collect();
        // The old slot's watcher (if any) stops as the slot is replaced; its guard stays
        // when it guards the same namespace for the same rules (no gap).
        let kept = enrolled
            .remove(&pod.uid)
            .filter(|s| Arc::ptr_eq(&s.netns, &netns) && s.inpod.config == inpod.config)
            .and_then(|s| s.guard);
        let guard = match kept {
            Some(g) => Some(g),
            None => self.guard_pod(&pod.name, &inpod, &netns).await,
        };
        let watch = self.watch_rules(&pod.uid, &netns);
        enrolled.insert(
            pod.uid.clone(),
            Slot {
                pod: pod.clone(),
                netns: netns.clone(),
                ips: ips.clone(),
                inpod,
                acked: false,
                _watch: watch,
                guard,
                mark: Arc::default(),
            },
        );
        // c. ztunnel; failure leaves the rules in place (fail closed) and marks pending.
        if let Err(e) = self.zds_add(pod, &netns).await {
            if pod.redirection() != Some(PENDING)
                && let Err(ae) = self.annotate(pod, Some(PENDING)).await
            {
                tracing::warn!(pod = %pod.name, error = %ae, "cannot mark pod pending");
            }
            return Err(e.into());
        }
        if let Some(s) = enrolled.get_mut(&pod.uid) {
            s.acked = true;
        }
        let result = self.finish_enrol(pod, ips).await;
        drop(enrolled);
        result
    }

    /// §1.4 step 5 d and e, once ztunnel has the pod.
    async fn finish_enrol(&self, pod: &Pod, ips: Vec<IpAddr>) -> Result<(), MeshError> {
        // d. probe set.
        for ip in ips.iter().copied() {
            let (probe, uid) = (self.probe_handle(), pod.uid.clone());
            blocking(move || probe.upsert(ip, &uid))
                .await
                .map_err(MeshError::ProbeSet)?;
        }
        // AWS branch-ENI pods need host rules for probe replies (§3.11; logged, never fatal).
        {
            let (runner, enabled, name, ips) = (
                self.probe_runner(),
                self.cfg.aws_branch_eni_probe,
                pod.name.clone(),
                ips,
            );
            let _ = tokio::task::spawn_blocking(move || {
                aws_eni::on_add(&runner, enabled, &name, &ips);
            })
            .await;
        }
        // e. annotation.
        if pod.redirection() != Some(ENABLED) {
            self.annotate(pod, Some(ENABLED)).await?;
        }
        Ok(())
    }

    fn probe_handle(&self) -> ambit_redirect::ProbeSet<super::HostRunner> {
        // ProbeSet is a thin handle (runner + flags): a copy can move to a blocking thread.
        ambit_redirect::ProbeSet::new(self.probe_runner(), self.backend(), self.cfg.ipv6)
    }

    /// §1.6 (`is_delete = false`) / §1.7 (`true`): probe set → rules → `Del` to every
    /// ztunnel → annotation removed.
    pub(crate) async fn remove_pod_from_mesh(
        &self,
        pod: &Pod,
        is_delete: bool,
    ) -> Result<(), MeshError> {
        let mut enrolled = self.enrolled.lock().await;
        let ips: Vec<IpAddr> = enrolled
            .get(&pod.uid)
            .map_or_else(|| pod.ips.clone(), |s| s.ips.clone());
        for ip in ips.iter().copied() {
            let (probe, uid) = (self.probe_handle(), pod.uid.clone());
            blocking(move || probe.remove(ip, &uid).map(drop))
                .await
                .map_err(MeshError::ProbeSet)?;
        }
        {
            let (runner, name) = (self.probe_runner(), pod.name.clone());
            let _ =
                tokio::task::spawn_blocking(move || aws_eni::on_remove(&runner, &name, &ips)).await;
        }
        if !is_delete && let Some(slot) = enrolled.get(&pod.uid) {
            let (inpod, runner) = (
                slot.inpod.clone(),
                FdRunner {
                    netns: slot.netns.clone(),
                },
            );
            blocking(move || inpod.delete(&runner))
                .await
                .map_err(MeshError::Rules)?;
            remove_standby(slot).await?;
        }
        enrolled.remove(&pod.uid);
        self.zds.del(&pod.uid).await?;
        match self.annotate(pod, None).await {
            Ok(()) => Ok(()),
            // A deleted pod needs no annotation removed; neither does one that vanished
            // while being un-enrolled (nothing left to retry).
            Err(MeshError::Annotate(e)) if is_delete || e.is_pod_gone() => {
                tracing::debug!(pod = %pod.name, error = %e, "annotation not removed: pod gone");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// §1.5: bring a cached pod to the state its labels ask for.
    pub(crate) async fn reconcile(&self, key: &Key) -> Result<(), MeshError> {
        let Some(pod) = self.cache().pods.get(key).cloned() else {
            return Ok(());
        };
        if pod.phase.is_terminal() {
            return Ok(());
        }
        // Undecidable until the namespace is known: leave the pod as it is (its namespace's
        // event reconciles it). Un-enrolling on missing data would fail open.
        if self.cfg.enablement.needs_namespace(&pod)
            && !self.cache().namespaces.contains_key(&pod.namespace)
        {
            tracing::debug!(pod = %pod.name, namespace = %pod.namespace, "namespace unknown; reconcile deferred");
            return Ok(());
        }
        let should = self.should_enrol(&pod);
        let ann = pod.redirection();
        let change = (ann == Some(ENABLED)) != should || ann == Some(PENDING);
        if !change {
            return Ok(());
        }
        if should {
            if pod.ips.is_empty() {
                return Ok(());
            }
            match self.add_pod_to_mesh(&pod, &pod.ips, None).await {
                // Not retryable: the CNI ADD will come with the netns (§1.5).
                Err(e @ MeshError::Netns { .. }) => {
                    tracing::info!(pod = %pod.name, error = %e, "cannot enrol yet");
                    Ok(())
                }
                other => other,
            }
        } else {
            self.remove_pod_from_mesh(&pod, false).await
        }
    }

    /// One verification pass over every enrolled pod, with repairs (see [`super::verify`]).
    /// Checks every enrolled pod without holding the pod table (checks run a rule listing
    /// per pod: with hundreds of pods a pass takes seconds, and CNI ADDs must not wait for
    /// it); only a pod that needs repair is re-checked and repaired under the lock.
    pub(crate) async fn verify_all(&self) {
        let unprotected = self.verify_pods(None).await;
        self.metrics.unprotected.set(unprotected);
    }

    /// Installs an enrolled pod's fail-closed guard (when enabled). A kernel that refuses
    /// it (no nf_tables, no owned tables before Linux 5.12) leaves the pod with its
    /// redirection rules as the only barrier, as upstream: logged, not fatal.
    pub(crate) async fn guard_pod(
        &self,
        name: &str,
        inpod: &InPod,
        netns: &Arc<NetnsFd>,
    ) -> Option<SharedGuard> {
        if !self.cfg.rule_guard {
            // A standby table an earlier agent (guard on) left would outlive the setting.
            let ns = netns.clone();
            if let Err(e) = blocking(move || Guard::remove_standby_in(&ns)).await {
                tracing::warn!(pod = name, error = %e, "guard disabled, but its standby table could not be removed");
            }
            return None;
        }
        let (inpod, ns) = (inpod.clone(), netns.clone());
        match blocking(move || inpod.guard(&ns)).await {
            Ok(g) => g.map(|g| Arc::new(Mutex::new(g))),
            Err(e) => {
                tracing::warn!(pod = name, error = %e, "no fail-closed guard for this pod: its redirection rules are the only barrier");
                None
            }
        }
    }

    /// Subscribes to the ruleset changes of an enrolled pod's netns (when enabled).
    pub(crate) fn watch_rules(&self, uid: &str, netns: &NetnsFd) -> Option<WatchHandle> {
        self.cfg
            .watch_rules
            .then(|| rules_watch::spawn(uid, netns, &self.dirty))
            .flatten()
    }

    /// Verifies (and repairs) the enrolled pods in `only`, or all; returns how many stayed
    /// unprotected. One blocking task checks them all, one visit per pod (a thread per
    /// read and a task switch per pod were most of a pass's cost at 1,000 pods).
    async fn verify_pods(&self, only: Option<&[String]>) -> i64 {
        let snapshot: Vec<(String, Enrolled)> = self
            .enrolled
            .lock()
            .await
            .iter()
            .filter(|(uid, _)| only.is_none_or(|o| o.contains(uid)))
            .map(|(uid, s)| {
                let pod = Enrolled {
                    netns: s.netns.clone(),
                    ips: s.ips.clone(),
                    inpod: s.inpod.clone(),
                    acked: s.acked,
                    guard: s.guard.clone(),
                    mark: s.mark.clone(),
                };
                (uid.clone(), pod)
            })
            .collect();
        let pods: Vec<(String, Arc<NetnsFd>)> = snapshot
            .iter()
            .map(|(uid, p)| (uid.clone(), p.netns.clone()))
            .collect();
        let verdicts = self.verdicts.clone();
        let checked = tokio::task::spawn_blocking(move || {
            snapshot
                .iter()
                .map(|(uid, pod)| check_pod(uid, pod, &verdicts))
                .collect::<Vec<_>>()
        })
        .await;
        let checked = checked.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "verification pass failed; re-checking every pod");
            Vec::new()
        });
        self.metrics.pod_checks.inc_by(checked.len() as u64);
        let unchanged = checked.iter().filter(|c| c.unchanged).count();
        self.metrics.unchanged_checks.inc_by(unchanged as u64);
        let mut unprotected = 0i64;
        for (i, (uid, netns)) in pods.into_iter().enumerate() {
            // A pass that did not come back checks every pod again under the lock.
            let standby_ok = match checked.get(i) {
                Some(c) if c.ok() => continue,
                Some(c) => c.standby_ok,
                None => false,
            };
            let mut enrolled = self.enrolled.lock().await;
            // The pod may have been removed or re-enrolled meanwhile: only repair the slot
            // that was checked.
            let Some(slot) = enrolled
                .get_mut(&uid)
                .filter(|s| Arc::ptr_eq(&s.netns, &netns))
            else {
                continue;
            };
            // Under the table lock, on the current slot: a pod un-enrolled meanwhile must
            // not get its standby table back.
            if !standby_ok {
                replace_standby(slot).await;
            }
            if !self.verify_slot(slot).await {
                unprotected += 1;
            }
        }
        unprotected
    }

    /// Re-checks one pod and repairs what is missing; `true` when it ends up protected.
    async fn verify_slot(&self, slot: &mut Slot) -> bool {
        let mut rules_ok = rules_present(&slot.inpod, &slot.netns, &self.verdicts).await;
        if !rules_ok {
            tracing::warn!(pod = %slot.pod.name, "in-pod rules missing, re-applying");
            self.metrics.repairs.inc();
            // Repairs always reconcile: partial leftovers must not block the rewrite.
            let mut inpod = slot.inpod.clone();
            inpod.reconcile = true;
            let runner = FdRunner {
                netns: slot.netns.clone(),
            };
            if let Err(e) = blocking(move || inpod.apply(&runner)).await {
                tracing::warn!(pod = %slot.pod.name, error = %e, "re-applying rules failed");
            }
            rules_ok = rules_present(&slot.inpod, &slot.netns, &self.verdicts).await;
            if rules_ok {
                flush_bypassed(slot).await;
            }
        }
        let mut listening = !slot.acked || listening(&slot.netns).await;
        if !listening && self.zds.connected() > 0 {
            tracing::warn!(pod = %slot.pod.name, "ztunnel not listening in pod, re-adding");
            self.metrics.repairs.inc();
            let readd = async {
                self.zds.del(&slot.pod.uid).await?;
                self.zds_add(&slot.pod, &slot.netns).await
            };
            match readd.await {
                Ok(()) => listening = self::listening(&slot.netns).await,
                Err(e) => tracing::warn!(pod = %slot.pod.name, error = %e, "re-add failed"),
            }
        }
        // A pending pod (never acked) is failing closed, not bypassing; it is counted
        // only when its rules are missing.
        rules_ok && listening
    }
}

impl<S: PodSource> Verifier for Core<S> {
    async fn verify_some(&self, uids: &[String]) {
        self.verify_pods(Some(uids)).await;
    }

    async fn verify_every(&self) {
        self.verify_all().await;
    }
}

/// Deletes the conntrack entries the pod's flows made while its rules were missing (they
/// would keep their tuples unredirected; see [`InPod::flush_bypassed_conntrack`]).
async fn flush_bypassed(slot: &Slot) {
    let (inpod, netns) = (slot.inpod.clone(), slot.netns.clone());
    match blocking(move || inpod.flush_bypassed_conntrack(&netns)).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::warn!(pod = %slot.pod.name, entries = n, "deleted conntrack entries that bypassed the missing rules")
        }
        Err(e) => {
            tracing::warn!(pod = %slot.pod.name, error = %e, "deleting bypassing conntrack entries failed")
        }
    }
}

/// Re-creates an enrolled pod's standby guard table; logged, never fatal (the owned table
/// guards while the agent runs).
async fn replace_standby(slot: &Slot) {
    let Some(guard) = slot.guard.clone() else {
        return;
    };
    let replaced = blocking(move || {
        guard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace_standby()
    })
    .await;
    match replaced {
        Ok(()) => {
            tracing::warn!(pod = %slot.pod.name, "standby guard table changed in the pod, re-created")
        }
        Err(e) => {
            tracing::warn!(pod = %slot.pod.name, error = %e, "re-creating the standby guard table failed")
        }
    }
}

/// Removes an un-enrolled pod's standby guard table: over its guard's socket, or, for a
/// pod this agent holds no guard for (disabled, refused, not guardable), from a socket
/// opened in its namespace, where only a table an earlier agent left can be (best effort).
async fn remove_standby(slot: &Slot) -> Result<(), MeshError> {
    match slot.guard.clone() {
        Some(guard) => blocking(move || {
            guard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove_standby()
        })
        .await
        .map_err(MeshError::Guard),
        None => {
            let ns = slot.netns.clone();
            if let Err(e) = blocking(move || Guard::remove_standby_in(&ns)).await {
                tracing::warn!(pod = %slot.pod.name, error = %e, "standby guard table not removed");
            }
            Ok(())
        }
    }
}

async fn listening(netns: &Arc<NetnsFd>) -> bool {
    let netns = netns.clone();
    tokio::task::spawn_blocking(move || ztunnel_listening(&netns))
        .await
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_errors_are_retried() {
        let api = |status| {
            MeshError::Annotate(SourceError::Api {
                pod: "ns/p".into(),
                status,
                message: "m".into(),
            })
        };
        let cases = [
            (
                MeshError::Annotate(SourceError::NotFound("ns/p".into())),
                false,
            ),
            (api(403), true),
            (api(409), true),
            (api(429), true),
            (api(500), true),
            (api(503), true),
            (api(400), false),
            (api(422), false),
            (
                MeshError::Annotate(SourceError::Transport {
                    pod: "ns/p".into(),
                    reason: "connection refused".into(),
                }),
                true,
            ),
            (
                MeshError::ProbeSet(Blocked::Step(ambit_redirect::ProbeSetError::InvalidUid(
                    "x".into(),
                ))),
                true,
            ),
            (
                MeshError::Rules(Blocked::Step(ambit_redirect::ApplyError::Command {
                    step: "x",
                    source: ambit_redirect::RunError::Failed {
                        argv: "iptables-restore".into(),
                        code: Some(1),
                        stderr: String::new(),
                    },
                })),
                false,
            ),
            (
                MeshError::Netns {
                    path: None,
                    reason: "x".into(),
                },
                false,
            ),
            (
                MeshError::Guard(Blocked::Step(KernelError::Refused {
                    what: "nft guard standby removal",
                    code: -1,
                })),
                true,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.retryable(), want, "{e}");
        }
    }
}
