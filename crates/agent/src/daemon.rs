//! The node agent: pod events in, enrolment out (`spec/cni.md` §1.3–§1.7, §6).
//!
//! Tasks (all owned by one [`JoinSet`] in [`AgentHandle`], stopped on shutdown): the event
//! loop (keeps the pod/namespace cache current and queues work; it never blocks on rule
//! tools or ztunnel so the plugin path always sees fresh pods), the worker (runs queued
//! reconciles one at a time and retries failures with per-pod backoff 5 ms → 5 s), the ZDS
//! server, the plugin-event HTTP server, health and metrics servers, the verification
//! loop and the CNI installer loop ([`crate::installer`]; `/readyz` is true only while the
//! agent is started *and* the last installer pass left everything in place). Mesh operations (add, remove, verify) are serialised by one async lock over the
//! enrolled-pod table, so a CNI ADD, a label change and a verification pass never
//! interleave on one pod.

pub mod aws_eni;
mod http;
mod mesh;
pub mod metrics;
pub mod plugin_log;
mod restart;
mod rules_watch;
pub mod verify;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ambit_netns::NetnsFd;
use ambit_redirect::{Backend, Guard, HostRules, HostRulesConfig, ProbeSet};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use crate::config::AgentConfig;
use crate::installer::{EntryInputs, Installer, InstallerError, plugin_entry};
use crate::plugin::PLUGIN_SOCKET;
use crate::pods::{Cache, Pod, PodEvent, PodSource};
use crate::shutdown::{BoxFuture, Cleanup, ShutdownError, ShutdownKind, UninstallCheck, check_for};
use crate::zds::{ZdsError, ZdsServer};
use ambit_redirect::{FdRunner, HostRunner};
pub use mesh::MeshError;
use mesh::Slot;
use metrics::{Metrics, ResultLabel};
use plugin_log::{LOG_SOCKET, LogServer, PluginLogError};
pub use restart::RestartReport;

/// Failure starting or running the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The ZDS socket could not be bound.
    #[error(transparent)]
    Zds(#[from] ZdsError),
    /// A server socket could not be bound.
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        /// Which server.
        what: &'static str,
        /// Address or path.
        addr: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The host netns could not be opened.
    #[error("opening host netns: {0}")]
    HostNetns(#[from] ambit_netns::NetnsError),
    /// Host probe set or rules could not be set up.
    #[error("host probe set: {0}")]
    HostProbeSet(#[source] mesh::Blocked<ambit_redirect::ProbeSetError>),
    /// Host rules could not be set up.
    #[error("host rules: {0}")]
    HostRules(#[source] mesh::Blocked<ambit_redirect::ApplyError>),
    /// The plugin log socket could not be bound.
    #[error(transparent)]
    PluginLog(#[from] PluginLogError),
}

type Key = (String, String);

/// Work for the worker.
#[derive(Debug, Clone)]
enum Work {
    /// Re-evaluate a pod from the cache (§1.5).
    Reconcile(Key),
    /// Take a pod out of the mesh (§1.6 / §1.7); `true` = deleted or terminal.
    Remove(Pod, bool),
}

pub(crate) struct Core<S> {
    cfg: AgentConfig,
    source: S,
    zds: ZdsServer,
    cache: Mutex<Cache>,
    /// Enrolled pods by UID; the lock also serialises mesh operations.
    enrolled: tokio::sync::Mutex<HashMap<String, Slot>>,
    host_runner: HostRunner,
    metrics: Arc<Metrics>,
    work: mpsc::UnboundedSender<Work>,
    /// What `/readyz` answers: `server_ready && install_ready` (§6.2).
    ready: AtomicBool,
    /// The ambient server is up (§1.3 step 8 done).
    server_ready: AtomicBool,
    /// The last installer pass succeeded.
    install_ready: AtomicBool,
    /// Pods whose ruleset changed, waiting for verification (see [`rules_watch`]).
    dirty: Arc<rules_watch::Dirty>,
    /// The rule tools' verdicts on pod rulesets, shared by every pod: pods whose rules read
    /// alike are judged by the tools once between them (`InPod::verify_in`).
    verdicts: Arc<ambit_redirect::VerifyMemo>,
}

impl<S> std::fmt::Debug for Core<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").finish_non_exhaustive()
    }
}

impl<S> Core<S> {
    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn probe_runner(&self) -> HostRunner {
        self.host_runner.clone()
    }

    fn update_ready(&self) {
        let install = self.install_ready.load(Ordering::SeqCst);
        self.metrics.install_ready.set(i64::from(install));
        self.ready.store(
            install && self.server_ready.load(Ordering::SeqCst),
            Ordering::SeqCst,
        );
    }

    fn install_ready(&self) -> bool {
        self.install_ready.load(Ordering::SeqCst)
    }

    fn set_install_ready(&self, ready: bool) {
        self.install_ready.store(ready, Ordering::SeqCst);
        self.update_ready();
    }

    fn backend(&self) -> Backend {
        Backend::from_native_nftables(self.cfg.native_nftables)
    }

    fn ns_labels(&self, ns: &str) -> std::collections::BTreeMap<String, String> {
        self.cache()
            .namespaces
            .get(ns)
            .map(|n| n.labels.clone())
            .unwrap_or_default()
    }

    fn should_enrol(&self, pod: &Pod) -> bool {
        !pod.phase.is_terminal()
            && self
                .cfg
                .enablement
                .should_enrol(pod, &self.ns_labels(&pod.namespace))
    }
}

/// An enrolled pod's fail-closed guard, shared by its slot and the verification pass.
pub(crate) type SharedGuard = Arc<Mutex<Guard>>;

/// The enrolled pods' guards (pod name, guard), read once the tasks have stopped: an
/// uninstall removes their standby tables.
type GuardList = Vec<(String, SharedGuard)>;

/// The enrolled pods' guards, when called.
struct EnrolledGuards(Box<dyn FnOnce() -> BoxFuture<'static, GuardList> + Send>);

impl std::fmt::Debug for EnrolledGuards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnrolledGuards")
    }
}

/// A running agent.
#[derive(Debug)]
pub struct AgentHandle {
    tasks: JoinSet<()>,
    stop: watch::Sender<bool>,
    /// Where `/healthz` and `/readyz` are served.
    pub health_addr: SocketAddr,
    /// Where `/metrics` is served.
    pub metrics_addr: SocketAddr,
    /// The ZDS server (connection count, snapshot hook).
    pub zds: ZdsServer,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// What restart discovery found (§1.8).
    pub restart: RestartReport,
    cleanup: Cleanup,
    guards: Option<EnrolledGuards>,
}

impl AgentHandle {
    /// Stops every task and waits for them: an upgrade-safe shutdown (§1.10), host rules,
    /// probe set and CNI config stay.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
    }

    /// Shuts down as `check` decides (§1.10): tasks (the installer loop too) stop either
    /// way; an uninstall then removes the CNI config entry, plugin kubeconfig and binary,
    /// host rules, probe set, socket files and the enrolled pods' standby guard tables. An
    /// upgrade leaves all of them. In-pod redirection rules of running pods are never
    /// touched.
    pub async fn shutdown_with(
        mut self,
        check: &dyn UninstallCheck,
    ) -> Result<ShutdownKind, ShutdownError> {
        let kind = check.decide().await;
        let cleanup = self.cleanup.clone();
        let guards = self.guards.take();
        self.shutdown().await;
        if kind == ShutdownKind::Uninstall {
            tracing::info!(
                "uninstalling: removing CNI config entry, plugin binary and kubeconfig, host rules, probe set and standby guard tables"
            );
            let guards = match guards {
                Some(g) => (g.0)().await,
                None => Vec::new(),
            };
            tokio::task::spawn_blocking(move || cleanup.uninstall(guards))
                .await
                .map_err(|_| ShutdownError(vec![crate::shutdown::CleanupError::Panicked]))??;
        } else {
            tracing::info!("shutting down for upgrade: host state left in place");
        }
        Ok(kind)
    }
}

/// Runs the agent until SIGINT/SIGTERM, then shuts down as the configuration says
/// (`AMBIENT_DISABLE_SAFE_UPGRADE`, see [`crate::shutdown`]).
pub async fn run_agent(cfg: AgentConfig, source: impl PodSource) -> Result<(), AgentError> {
    let check = check_for(&cfg);
    run_agent_with(cfg, source, check.as_ref()).await
}

/// [`run_agent`] with an explicit upgrade/uninstall decision (e.g. a Kubernetes check).
pub async fn run_agent_with(
    cfg: AgentConfig,
    source: impl PodSource,
    check: &dyn UninstallCheck,
) -> Result<(), AgentError> {
    let handle = start(cfg, source).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| AgentError::Bind {
            what: "signal handler",
            addr: "SIGTERM".into(),
            source,
        })?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    if let Err(e) = handle.shutdown_with(check).await {
        tracing::warn!(error = %e, "shutdown cleanup incomplete");
    }
    Ok(())
}

/// Starts the agent (§1.3 order: servers, host setup, ZDS listener, event sync, then
/// accepting ztunnels) and returns once everything listens.
pub async fn start(cfg: AgentConfig, source: impl PodSource) -> Result<AgentHandle, AgentError> {
    let metrics = Arc::new(Metrics::new());
    let host_runner = match &cfg.host_netns {
        None => HostRunner::Current(ambit_redirect::CurrentNetns),
        Some(p) => HostRunner::Fd(FdRunner {
            netns: Arc::new(NetnsFd::open(p)?),
        }),
    };
    let backend = Backend::from_native_nftables(cfg.native_nftables);
    let probe = ProbeSet::new(host_runner.clone(), backend, cfg.ipv6);
    let host_rules = HostRules {
        backend,
        config: HostRulesConfig {
            ipv6: cfg.ipv6,
            probe_snat_v4: cfg.probe_snat_v4,
            probe_snat_v6: cfg.probe_snat_v6,
            kubelet_uid: cfg.kubelet_uid,
        },
    };
    // §1.3 steps 4 and 6: set first (rules match on it), then host rules. Deviation: no
    // flush; restart discovery resyncs the set without a window where running pods'
    // entries are missing (see `restart`).
    mesh::blocking(move || probe.ensure())
        .await
        .map_err(AgentError::HostProbeSet)?;
    let cleanup = Cleanup {
        host_runner: host_runner.clone(),
        backend,
        ipv6: cfg.ipv6,
        host_rules: host_rules.clone(),
        install: cfg.install.clone(),
        sockets: vec![
            cfg.zds_socket.clone(),
            cfg.run_dir.join(PLUGIN_SOCKET),
            cfg.run_dir.join(LOG_SOCKET),
        ],
    };
    {
        let runner = host_runner.clone();
        mesh::blocking(move || host_rules.apply(&runner))
            .await
            .map_err(AgentError::HostRules)?;
    }

    let zds = ZdsServer::new(cfg.zds.clone(), Some(metrics.ztunnel_connected.clone()));
    let zds_listener = ZdsServer::bind(&cfg.zds_socket)?;
    let servers = http::Servers::bind(&cfg).await?;
    let log_server = LogServer::bind(&cfg.run_dir)?.with_limits(cfg.http);
    let (health_addr, metrics_addr) = (servers.health_addr, servers.metrics_addr);

    let entry = plugin_entry(
        &cfg.install,
        EntryInputs {
            selectors: &cfg.enablement.selectors,
            exclude_namespaces: &cfg.enablement.exclude_namespaces,
            pod_namespace: &cfg.pod_namespace,
            native_nftables: cfg.native_nftables,
        },
    );
    let installer = Installer::new(cfg.install.clone(), entry);
    log_skipped_steps(&cfg);

    let (work_tx, work_rx) = mpsc::unbounded_channel();
    let (stop, stop_rx) = watch::channel(false);
    let core = Arc::new(Core {
        cfg,
        source,
        zds: zds.clone(),
        cache: Mutex::new(Cache::default()),
        enrolled: tokio::sync::Mutex::new(HashMap::new()),
        host_runner,
        metrics: metrics.clone(),
        work: work_tx,
        ready: AtomicBool::new(false),
        server_ready: AtomicBool::new(false),
        install_ready: AtomicBool::new(false),
        dirty: Arc::default(),
        verdicts: Arc::default(),
    });

    let mut tasks = JoinSet::new();
    servers.spawn(&mut tasks, core.clone(), stop_rx.clone());
    tasks.spawn(log_server.serve(stop_rx.clone()));
    let events = core.source.watch();
    let (synced_tx, mut synced_rx) = watch::channel(false);
    tasks.spawn(event_loop(core.clone(), events, synced_tx, stop_rx.clone()));
    // Accept ztunnels only once the pod cache is synced and restart discovery (§1.8) has
    // rebuilt the snapshot. The worker starts after discovery, so queued reconciles see
    // the discovered pods.
    let _ = synced_rx.wait_for(|s| *s).await;
    let restart = core.restore_after_restart().await;
    if !restart.found.is_empty() || !restart.keep.is_empty() {
        tracing::info!(
            found = restart.found.len(),
            keep = restart.keep.len(),
            pruned = restart.pruned,
            "restart discovery done"
        );
    }
    tasks.spawn(worker(core.clone(), work_rx, stop_rx.clone()));
    {
        let zds = zds.clone();
        let stop = stop_rx.clone();
        tasks.spawn(async move { zds.serve(zds_listener, stop).await });
    }
    tasks.spawn(verify_loop(core.clone(), stop_rx.clone()));
    {
        let (core, stop) = (core.clone(), stop_rx.clone());
        tasks.spawn(async move { rules_watch::react(&*core, &core.dirty, stop).await });
    }
    core.server_ready.store(true, Ordering::SeqCst);
    // §1.3 step 9, once the agent can serve the plugin: a first installer pass here, so
    // readiness is known when `start` returns, then the watch loop.
    let installer = Arc::new(Mutex::new(installer));
    let mut last_error = None;
    install_pass(&core, &installer, &mut last_error).await;
    tasks.spawn(install_loop(core.clone(), installer, last_error, stop_rx));
    let guards = {
        let core = core.clone();
        EnrolledGuards(Box::new(move || {
            Box::pin(async move {
                let enrolled = core.enrolled.lock().await;
                enrolled
                    .values()
                    .filter_map(|s| Some((s.pod.name.clone(), s.guard.clone()?)))
                    .collect()
            })
        }))
    };
    Ok(AgentHandle {
        tasks,
        stop,
        health_addr,
        metrics_addr,
        zds,
        metrics,
        restart,
        cleanup,
        guards: Some(guards),
    })
}

async fn event_loop<S: PodSource>(
    core: Arc<Core<S>>,
    mut events: mpsc::UnboundedReceiver<PodEvent>,
    synced: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut is_synced = false;
    loop {
        let ev = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            ev = events.recv() => match ev { Some(ev) => ev, None => return },
        };
        let node = &core.cfg.node_name;
        match ev {
            PodEvent::Synced => {
                is_synced = true;
                let keys: Vec<Key> = core.cache().pods.keys().cloned().collect();
                for k in keys {
                    let _ = core.work.send(Work::Reconcile(k));
                }
                let _ = synced.send(true);
            }
            PodEvent::Namespace(ns) => {
                let name = ns.name.clone();
                core.cache().namespaces.insert(name.clone(), ns);
                // A namespace label change may flip every pod in it (§1.5).
                let keys: Vec<Key> = core
                    .cache()
                    .pods
                    .keys()
                    .filter(|(n, _)| *n == name)
                    .cloned()
                    .collect();
                for k in keys {
                    let _ = core.work.send(Work::Reconcile(k));
                }
            }
            PodEvent::NamespaceDeleted(name) => {
                core.cache().namespaces.remove(&name);
            }
            PodEvent::Pod(pod) => {
                if !node.is_empty() && pod.node != *node {
                    continue;
                }
                // ztunnel pods are cached too: their sandboxes go through the CNI plugin,
                // whose ADD must find them (and is answered "not enrolled").
                let key = (pod.namespace.clone(), pod.name.clone());
                let old = core.cache().pods.insert(key.clone(), pod.clone());
                match old {
                    // Pod adds are left to the CNI path, as upstream does (§1.5).
                    None => core.metrics.event("add"),
                    Some(old) => {
                        core.metrics.event("update");
                        let was_in = matches!(old.redirection(), Some("enabled" | "pending"));
                        if pod.phase.is_terminal() && was_in {
                            // Use the old object: a terminal status may carry no IPs.
                            let _ = core.work.send(Work::Remove(old, true));
                        } else if is_synced {
                            let _ = core.work.send(Work::Reconcile(key));
                        }
                    }
                }
            }
            PodEvent::PodDeleted(pod) => {
                core.metrics.event("delete");
                core.cache()
                    .pods
                    .remove(&(pod.namespace.clone(), pod.name.clone()));
                let was_in = matches!(pod.redirection(), Some("enabled" | "pending"));
                if was_in
                    || core
                        .cfg
                        .enablement
                        .should_enrol(&pod, &core.ns_labels(&pod.namespace))
                {
                    let _ = core.work.send(Work::Remove(pod, true));
                }
            }
        }
    }
}

const RETRY_MIN: Duration = Duration::from_millis(5);
const RETRY_MAX: Duration = Duration::from_secs(5);

async fn worker<S: PodSource>(
    core: Arc<Core<S>>,
    mut rx: mpsc::UnboundedReceiver<Work>,
    mut stop: watch::Receiver<bool>,
) {
    // Per-pod retry state: when, current backoff, what.
    let mut retries: HashMap<Key, (Instant, Duration, Work)> = HashMap::new();
    loop {
        let next_due = retries.values().map(|(t, _, _)| *t).min();
        let work = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            w = rx.recv() => match w { Some(w) => w, None => return },
            _ = sleep_until(next_due.unwrap_or_else(Instant::now)), if next_due.is_some() => {
                let now = Instant::now();
                let Some(key) = retries
                    .iter()
                    .find(|(_, (t, _, _))| *t <= now)
                    .map(|(k, _)| k.clone())
                else {
                    continue;
                };
                match retries.get(&key) {
                    Some((_, _, w)) => w.clone(),
                    None => continue,
                }
            }
        };
        let key = match &work {
            Work::Reconcile(k) => k.clone(),
            Work::Remove(p, _) => (p.namespace.clone(), p.name.clone()),
        };
        let result = match &work {
            Work::Reconcile(k) => core.reconcile(k).await,
            Work::Remove(pod, is_delete) => core.remove_pod_from_mesh(pod, *is_delete).await,
        };
        match result {
            Ok(()) => {
                retries.remove(&key);
            }
            Err(e) if e.retryable() => {
                let backoff = retries
                    .get(&key)
                    .map_or(RETRY_MIN, |(_, b, _)| (*b * 2).min(RETRY_MAX));
                tracing::info!(pod = ?key, error = %e, retry_in = ?backoff, "will retry");
                retries.insert(key, (Instant::now() + backoff, backoff, work));
            }
            Err(e) => {
                tracing::warn!(pod = ?key, error = %e, "giving up on pod");
                retries.remove(&key);
            }
        }
    }
}

/// Says once, at start, which installer steps have nothing configured to write to.
fn log_skipped_steps(cfg: &AgentConfig) {
    let i = &cfg.install;
    if i.bin_dir.is_none() {
        tracing::info!(
            "no CNI bin dir (AMBIT_CNI_BIN_DIR or AMBIT_HOST_PREFIX): not copying the istio-cni binary"
        );
    }
    if i.conf_dir.is_none() {
        tracing::info!(
            "no CNI config dir (MOUNTED_CNI_NET_DIR or AMBIT_HOST_PREFIX): not writing CNI config"
        );
    }
    if i.kube_api.is_none() {
        tracing::info!("KUBERNETES_SERVICE_HOST not set: not writing the plugin kubeconfig");
    }
}

/// One installer pass on a blocking thread; updates readiness and logs what changed.
/// Errors are logged when they change (a pass runs every second).
async fn install_pass<S: PodSource>(
    core: &Arc<Core<S>>,
    installer: &Arc<Mutex<Installer>>,
    last_error: &mut Option<String>,
) {
    let (c, inst) = (core.clone(), installer.clone());
    let result = tokio::task::spawn_blocking(move || {
        let mut inst = inst
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = inst.reconcile(&mut || c.set_install_ready(false));
        (r, inst.conf_file().map(std::path::Path::to_owned))
    })
    .await;
    match result {
        Ok((Ok(pass), conf_file)) => {
            if !pass.repaired.is_empty() || last_error.is_some() || !core.install_ready() {
                tracing::info!(
                    repaired = ?pass.repaired,
                    cni_config = ?conf_file,
                    "CNI install in place; watching for changes"
                );
            }
            if !pass.repaired.is_empty() {
                core.metrics
                    .installs
                    .get_or_create(&ResultLabel { result: "SUCCESS" })
                    .inc();
            }
            *last_error = None;
            core.set_install_ready(true);
        }
        Ok((Err(e), _)) => {
            core.set_install_ready(false);
            let text = e.to_string();
            if last_error.as_deref() != Some(text.as_str()) {
                let result = match &e {
                    _ if e.is_waiting() => None,
                    InstallerError::CopyBinary { .. } => Some("COPY_BINARIES_FAILURE"),
                    InstallerError::Kubeconfig { .. } => Some("CREATE_KUBECONFIG_FAILURE"),
                    InstallerError::CniConfig(_) => Some("CREATE_CNI_CONFIG_FAILURE"),
                };
                if let Some(result) = result {
                    core.metrics
                        .installs
                        .get_or_create(&ResultLabel { result })
                        .inc();
                }
                if e.is_waiting() {
                    tracing::info!(error = %e, "waiting for the primary CNI config");
                } else {
                    tracing::error!(error = %e, "CNI install failed; retrying");
                }
                *last_error = Some(text);
            }
        }
        Err(e) => {
            core.set_install_ready(false);
            tracing::error!(error = %e, "CNI installer pass panicked");
        }
    }
}

/// Re-checks the install every `AMBIT_INSTALL_CHECK_INTERVAL` until stopped (§5.5: the
/// primary CNI may rewrite its config and drop our entry, a new primary may appear).
async fn install_loop<S: PodSource>(
    core: Arc<Core<S>>,
    installer: Arc<Mutex<Installer>>,
    mut last_error: Option<String>,
    mut stop: watch::Receiver<bool>,
) {
    let interval = core.cfg.install.check_interval;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(interval) => {}
        }
        install_pass(&core, &installer, &mut last_error).await;
    }
}

async fn verify_loop<S: PodSource>(core: Arc<Core<S>>, mut stop: watch::Receiver<bool>) {
    let mut snapshots = core.zds.snapshots();
    let period = core.cfg.verify_interval;
    let mut next = period.map(|p| Instant::now() + p);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            changed = snapshots.changed() => if changed.is_err() { return },
            _ = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
        }
        core.verify_all().await;
        next = period.map(|p| Instant::now() + p);
    }
}
