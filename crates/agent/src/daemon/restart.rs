//! Agent restart (`spec/cni.md` §1.8, ConstructInitialSnapshot): before ztunnels are
//! accepted, rebuild the state a previous agent left behind, without touching the data
//! path of running pods.
//!
//! The snapshot is every cached pod annotated `ambient.istio.io/redirection=enabled` that
//! is not terminal (the cache already holds only this node's non-ztunnel pods).
//! 1. Probe-set resync: upsert each snapshot pod's IPs (an IP claimed twice is logged and
//!    skipped), then prune entries for IPs outside the snapshot (see the deviation below).
//! 2. Find each pod's netns with a `<host prefix>/proc` scan ([`crate::discovery`]); a pod
//!    the scan misses falls back to its [`Pod::netns`] hint (embedded mesh), with the same
//!    IP-ownership check.
//! 3. With `AMBIENT_RECONCILE_POD_RULES_ON_STARTUP`, re-apply in-pod rules in each found
//!    netns (idempotent; errors only logged).
//! 4. Found pods get an enrolled slot (verified and repaired like any other) and an `Add`
//!    in the ZDS snapshot; the others are remembered without netns, so ztunnel gets `Keep`.
//!
//! Deviation: upstream flushes the probe set at startup and re-adds the snapshot, so
//! kubelet probes to running pods are not SNATed for a moment. We never flush: upserts
//! and the prune leave live entries in place throughout. When some snapshot pod has no IP
//! yet, upstream skips pruning; we still prune entries whose owner UID is not a snapshot
//! pod (those cannot be the IP-less pod's).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ambit_netns::NetnsFd;
use ambit_redirect::ProbeSet;

use super::Core;
use super::mesh::Slot;
use crate::discovery::{Found, find_pod_netns, interface_ips};
use crate::pods::{ENABLED, Pod, PodSource};
use ambit_redirect::{FdRunner, HostRunner};

/// What the restart pass did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestartReport {
    /// Snapshot pod UIDs whose netns was found (they get `Add`).
    pub found: Vec<String>,
    /// Snapshot pod UIDs without a netns (they get `Keep`).
    pub keep: Vec<String>,
    /// Probe-set entries pruned.
    pub pruned: usize,
}

impl<S: PodSource> Core<S> {
    fn proc_root(&self) -> PathBuf {
        if self.cfg.host_prefix.as_os_str().is_empty() {
            PathBuf::from("/proc")
        } else {
            self.cfg.host_prefix.join("proc")
        }
    }

    fn snapshot_pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = self
            .cache()
            .pods
            .values()
            .filter(|p| p.redirection() == Some(ENABLED) && !p.phase.is_terminal())
            .cloned()
            .collect();
        pods.sort_by(|a, b| a.uid.cmp(&b.uid));
        pods
    }

    /// Runs the restart pass; call after the pod cache is synced, before ZDS accepts.
    pub(crate) async fn restore_after_restart(&self) -> RestartReport {
        // Holding the table lock serialises us with CNI adds arriving meanwhile.
        let mut enrolled = self.enrolled.lock().await;
        let snapshot: Vec<Pod> = self
            .snapshot_pods()
            .into_iter()
            .filter(|p| !enrolled.contains_key(&p.uid))
            .collect();
        let mut report = RestartReport::default();

        // 1. Probe set.
        let mut keep_ips: HashSet<IpAddr> = enrolled
            .values()
            .flat_map(|s| s.ips.iter().copied())
            .collect();
        let uids: HashSet<String> = snapshot
            .iter()
            .map(|p| p.uid.clone())
            .chain(enrolled.keys().cloned())
            .collect();
        let mut upserts = Vec::new();
        let mut owners: HashMap<IpAddr, &str> = HashMap::new();
        for pod in &snapshot {
            for ip in pod.ips.iter().map(IpAddr::to_canonical) {
                match owners.get(&ip) {
                    Some(other) if *other != pod.uid => {
                        tracing::warn!(%ip, pod = %pod.name, owner = %other, "IP claimed by two snapshot pods, skipping");
                    }
                    _ => {
                        owners.insert(ip, &pod.uid);
                        keep_ips.insert(ip);
                        upserts.push((ip, pod.uid.clone()));
                    }
                }
            }
        }
        let all_have_ips = snapshot.iter().all(|p| !p.ips.is_empty());
        let probe = ProbeSet::new(self.probe_runner(), self.backend(), self.cfg.ipv6);
        report.pruned = tokio::task::spawn_blocking(move || {
            resync_probe_set(&probe, &upserts, &keep_ips, &uids, all_have_ips)
        })
        .await
        .unwrap_or(0);

        // 2. Scan.
        let wanted: HashMap<String, Vec<IpAddr>> = snapshot
            .iter()
            .map(|p| {
                (
                    p.uid.clone(),
                    p.ips.iter().map(IpAddr::to_canonical).collect(),
                )
            })
            .collect();
        let claimed = enrolled.values().map(|s| s.netns.identity()).collect();
        let proc_root = self.proc_root();
        let hints: Vec<(String, PathBuf, Vec<IpAddr>)> = snapshot
            .iter()
            .filter_map(|p| Some((p.uid.clone(), p.netns.clone()?, wanted.get(&p.uid)?.clone())))
            .collect();
        let mut found: HashMap<String, Found> = tokio::task::spawn_blocking(move || {
            let mut found = match find_pod_netns(&proc_root, &wanted, &claimed) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(error = %e, "restart discovery: proc scan failed");
                    HashMap::new()
                }
            };
            for (uid, path, ips) in hints {
                if found.contains_key(&uid) || ips.is_empty() {
                    continue;
                }
                if let Some(netns) = NetnsFd::open(&path).ok().filter(|n| {
                    interface_ips(n).is_ok_and(|local| ips.iter().any(|ip| local.contains(ip)))
                }) {
                    found.insert(
                        uid,
                        Found {
                            pid: 0,
                            start_time: u64::MAX,
                            netns,
                        },
                    );
                }
            }
            found
        })
        .await
        .unwrap_or_default();

        // 3 + 4.
        for pod in snapshot {
            let Some(f) = found.remove(&pod.uid) else {
                tracing::info!(pod = %pod.name, uid = %pod.uid, "restart: netns not found, ztunnel gets Keep");
                match Self::zds_pod(&pod, None) {
                    Ok(zds_pod) => self.zds.remember(zds_pod),
                    Err(e) => {
                        tracing::warn!(pod = %pod.name, error = %e, "restart: pod not sent to ztunnel")
                    }
                }
                report.keep.push(pod.uid);
                continue;
            };
            let netns = Arc::new(f.netns);
            let inpod = self.inpod_for(&pod);
            if self.cfg.reconcile {
                let (inpod, runner) = (
                    inpod.clone(),
                    FdRunner {
                        netns: netns.clone(),
                    },
                );
                match tokio::task::spawn_blocking(move || inpod.apply(&runner)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(pod = %pod.name, error = %e, "restart: re-applying rules failed");
                    }
                    Err(e) => {
                        tracing::warn!(pod = %pod.name, error = %e, "restart: rule task failed");
                    }
                }
            }
            tracing::info!(pod = %pod.name, uid = %pod.uid, pid = f.pid, netns = %netns.identity(), "restart: found pod netns");
            match Self::zds_pod(&pod, Some(&netns)) {
                Ok(zds_pod) => self.zds.remember(zds_pod),
                Err(e) => {
                    tracing::warn!(pod = %pod.name, error = %e, "restart: pod not sent to ztunnel")
                }
            }
            report.found.push(pod.uid.clone());
            let watch = self.watch_rules(&pod.uid, &netns);
            let guard = self.guard_pod(&pod.name, &inpod, &netns).await;
            enrolled.insert(
                pod.uid.clone(),
                Slot {
                    ips: pod.ips.iter().map(IpAddr::to_canonical).collect(),
                    inpod,
                    netns,
                    // It was enabled, so a ztunnel acked it and (if still running) listens.
                    acked: true,
                    _watch: watch,
                    guard,
                    mark: Default::default(),
                    pod,
                },
            );
        }
        report
    }
}

impl<S: PodSource> Core<S> {
    /// §1.5: the netns of one running pod the informer path wants to enrol, from a
    /// `/proc` scan (namespaces held by `enrolled` pods are skipped).
    pub(super) async fn scan_pod_netns(
        &self,
        pod: &Pod,
        enrolled: &HashMap<String, Slot>,
    ) -> Option<Arc<NetnsFd>> {
        let ips: Vec<IpAddr> = pod.ips.iter().map(IpAddr::to_canonical).collect();
        if ips.is_empty() {
            return None;
        }
        let wanted = HashMap::from([(pod.uid.clone(), ips)]);
        let claimed = enrolled.values().map(|s| s.netns.identity()).collect();
        let proc_root = self.proc_root();
        let uid = pod.uid.clone();
        tokio::task::spawn_blocking(move || {
            find_pod_netns(&proc_root, &wanted, &claimed)
                .map_err(|e| tracing::warn!(error = %e, "proc scan failed"))
                .ok()?
                .remove(&uid)
                .map(|f| Arc::new(f.netns))
        })
        .await
        .ok()
        .flatten()
    }
}

/// §1.8 step 1; returns how many entries were pruned. Errors are logged: a broken probe
/// set degrades probes, it must not keep the agent from serving ztunnel.
fn resync_probe_set(
    probe: &ProbeSet<HostRunner>,
    upserts: &[(IpAddr, String)],
    keep: &HashSet<IpAddr>,
    uids: &HashSet<String>,
    all_have_ips: bool,
) -> usize {
    for (ip, uid) in upserts {
        if let Err(e) = probe.upsert(*ip, uid) {
            tracing::warn!(%ip, %uid, error = %e, "restart: probe set upsert failed");
        }
    }
    let result = if all_have_ips {
        probe.prune(keep)
    } else {
        probe.list().map(|entries| {
            entries
                .into_iter()
                .filter(|(ip, owner)| !keep.contains(ip) && !uids.contains(owner))
                .filter(|(ip, owner)| probe.remove(*ip, owner).unwrap_or(false))
                .count()
        })
    };
    result.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "restart: probe set prune failed");
        0
    })
}
