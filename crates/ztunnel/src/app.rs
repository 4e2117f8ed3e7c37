//! Process wiring: runtimes, state sources, identity, servers, proxies, signals and drain.
//!
//! Two tokio runtimes like upstream: a current-thread *control* runtime (admin, metrics,
//! readiness, CA client, local config watch) that `run` blocks on, and a multi-threaded
//! *data-plane* runtime (`ZTUNNEL_WORKER_THREADS`) for the proxies, so a burst of traffic
//! cannot starve certificate renewal or readiness, and vice versa.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ambit_model::local::LocalConfig;
use ambit_netns::{DefaultSocketFactory, SocketError, SocketFactory};
use serde_json::{Value, json};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::mpsc;

use crate::admin::{AdminServer, AdminState, DumpSection};
use crate::config::{Config, LocalXds, ProxyMode};
use crate::dns::{DnsContext, DnsServer, Forwarder};
use crate::drain::{self, DrainMode};
use crate::identity::{CaClient, CertManager, CertState};
use crate::inpod::{ExtrasError, InpodManager, PodContext, PodExtras};
use crate::proxy::{ConnectionTracker, Listeners, LocalWorkload, Proxy, ProxyInputs, WorkloadPool};
use crate::readiness::{ReadinessServer, Ready};
use crate::state::ProxyState;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::server::MetricsServer;

/// Why the process could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("logging: {0}")]
    Logging(#[from] crate::telemetry::TelemetryError),
    #[error("building the {0} runtime: {1}")]
    Runtime(&'static str, std::io::Error),
    #[error("local config {source_name}: {message}")]
    LocalConfig {
        source_name: String,
        message: String,
    },
    #[error("certificate authority: {0}")]
    Ca(#[from] crate::grpc::GrpcError),
    #[error("no certificate authority configured (CA_ADDRESS is empty)")]
    NoCa,
    #[error("admin server: {0}")]
    Admin(#[from] crate::admin::AdminError),
    #[error("readiness server: {0}")]
    Readiness(#[from] crate::readiness::ReadinessError),
    #[error("proxy: {0}")]
    Proxy(#[from] crate::proxy::ProxyError),
    #[error("PROXY_MODE=dedicated needs PROXY_WORKLOAD_INFO")]
    NoWorkloadInfo,
    #[error("shared (in-pod) mode: {0}")]
    Shared(String),
    #[error("DNS proxy: {0}")]
    Dns(#[from] crate::dns::DnsError),
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
}

/// Creates sockets in the process's own namespace, marked with `PACKET_MARK` when set.
#[derive(Debug, Clone, Copy)]
pub struct MarkedSocketFactory {
    pub mark: Option<u32>,
}

impl SocketFactory for MarkedSocketFactory {
    fn new_socket(&self, d: Domain, t: Type, p: Protocol) -> Result<Socket, SocketError> {
        DefaultSocketFactory.new_socket(d, t, p)
    }
    fn default_mark(&self) -> Option<u32> {
        self.mark
    }
}

/// What serves traffic: one proxy (dedicated) or the in-pod manager (shared).
enum Running {
    Dedicated(Proxy),
    Shared {
        trigger: drain::DrainTrigger,
        task: tokio::task::JoinHandle<()>,
    },
}

/// Starts a DNS proxy inside every pod the in-pod manager starts (shared mode).
struct DnsPodExtras {
    cfg: Arc<Config>,
    state: Arc<ProxyState>,
    forwarder: Forwarder,
    metrics: Arc<Metrics>,
}

impl PodExtras for DnsPodExtras {
    fn start(
        &self,
        pod: &PodContext<'_>,
        tasks: &mut tokio::task::JoinSet<()>,
        drain: drain::DrainWatcher,
    ) -> Result<(), ExtrasError> {
        let listeners = DnsServer::bind(
            pod.socket_factory.as_ref(),
            &crate::dns::listen_addrs(self.cfg.ipv6_enabled),
        )?;
        let (state, local, node) = (
            self.state.clone(),
            pod.workload.clone(),
            self.cfg.node_name.clone(),
        );
        let ctx = DnsContext {
            state: self.state.clone(),
            client: Arc::new(move || {
                state.find_local_workload(
                    &local.name,
                    &local.namespace,
                    &local.service_account,
                    node.as_deref(),
                )
            }),
            cluster_domain: self.cfg.cluster_domain.clone(),
            prefered_service_namespace: self.cfg.prefered_service_namespace.clone(),
            ipv6_enabled: self.cfg.ipv6_enabled,
            forwarder: self.forwarder.clone(),
            socket_factory: pod.socket_factory.clone(),
            metrics: Arc::new((*self.metrics).clone()),
        };
        tasks.spawn(DnsServer::serve(listeners, ctx, async move {
            drain.signaled().await;
        }));
        Ok(())
    }
}

/// Runs ztunnel until SIGTERM/SIGINT or `POST /quitquitquit`, then drains.
pub fn run(cfg: Config) -> Result<(), AppError> {
    let log = crate::telemetry::logging::init_logging(cfg.log_format, &cfg.rust_log)?;
    tracing::info!(config = %cfg.to_json(), "running with config");
    let data = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads)
        .thread_name("ztunnel-worker")
        .enable_all()
        .build()
        .map_err(|e| AppError::Runtime("data plane", e))?;
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AppError::Runtime("control", e))?;
    let result = control.block_on(async_main(Arc::new(cfg), log, data.handle().clone()));
    data.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Reads the local config named by the configuration.
fn load_local(src: &LocalXds) -> Result<LocalConfig, AppError> {
    let (name, text) = match src {
        LocalXds::Path(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).map_err(|e| AppError::LocalConfig {
                source_name: p.display().to_string(),
                message: e.to_string(),
            })?,
        ),
        LocalXds::Inline(y) => ("LOCAL_XDS".to_string(), y.clone()),
    };
    LocalConfig::from_yaml(&text).map_err(|e| AppError::LocalConfig {
        source_name: name,
        message: e.to_string(),
    })
}

fn apply_local(state: &ProxyState, local: LocalConfig) {
    state.replace_local(local.workloads, local.services, local.policies);
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// ambit extension: re-read `LOCAL_XDS_PATH` when it changes (upstream reads it once). A
/// broken edit is logged and the last good state kept; a good one replaces only the file's
/// own records (xDS records stay).
async fn watch_local_file(path: PathBuf, state: Arc<ProxyState>, drain: drain::DrainWatcher) {
    let mut last = mtime(&path);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = drain.signaled() => return,
            _ = tick.tick() => {}
        }
        let now = mtime(&path);
        if now == last {
            continue;
        }
        last = now;
        match load_local(&LocalXds::Path(path.clone())) {
            Ok(local) => {
                apply_local(&state, local);
                tracing::info!(path = %path.display(), "local config reloaded");
            }
            Err(e) => {
                tracing::error!(error = %e, "local config change rejected; keeping the last good config")
            }
        }
    }
}

struct Dump {
    cfg: Arc<Config>,
    state: Arc<ProxyState>,
    certs: Arc<CertManager>,
    static_config: Value,
    /// Set once shared mode started (its pods feed `workloadState`).
    inpod: Arc<std::sync::OnceLock<Arc<InpodManager>>>,
}

impl Dump {
    fn section(&self, section: DumpSection) -> Value {
        match section {
            DumpSection::Workloads => {
                let mut w = self.state.all_workloads();
                w.sort_by(|a, b| a.uid.cmp(&b.uid));
                Value::Array(w.iter().map(|w| crate::state::dump::workload(w)).collect())
            }
            DumpSection::Services => {
                let mut s = self.state.all_services();
                s.sort_by(|a, b| a.key.cmp(&b.key));
                Value::Array(
                    s.iter()
                        .map(|s| crate::state::dump::service(s, &self.state.endpoints(s)))
                        .collect(),
                )
            }
            DumpSection::Policies => {
                let mut p = self.state.all_policies();
                p.sort_by(|a, b| a.key.cmp(&b.key));
                Value::Array(p.iter().map(|p| crate::state::dump::policy(p)).collect())
            }
            DumpSection::StagedServices => json!({}),
            DumpSection::StaticConfig => self.static_config.clone(),
            DumpSection::Version => crate::admin::build_version(&self.cfg.istio_version),
            DumpSection::Config => self.cfg.to_json(),
            DumpSection::Certificates => Value::Array(
                self.certs
                    .states()
                    .into_iter()
                    .map(|(id, st)| {
                        let (state, chain, roots) = match st {
                            CertState::Initializing => ("Initializing".to_string(), vec![], vec![]),
                            CertState::Available(c) => (
                                "Available".to_string(),
                                c.chain_summaries(),
                                c.root_summaries(),
                            ),
                            CertState::Unavailable { error, .. } => {
                                (format!("Unavailable: {error}"), vec![], vec![])
                            }
                        };
                        let summary = |s: &ambit_tls::CertSummary| {
                            json!({
                                "pem": s.pem,
                                "serialNumber": s.serial_hex,
                                "validFrom": crate::admin::rfc3339(s.not_before),
                                "expirationTime": crate::admin::rfc3339(s.not_after),
                            })
                        };
                        json!({
                            "identity": id.to_string(),
                            "state": state,
                            "certChain": chain.iter().map(summary).collect::<Vec<_>>(),
                            "rootCerts": roots.iter().map(summary).collect::<Vec<_>>(),
                        })
                    })
                    .collect(),
            ),
            DumpSection::WorkloadState => self
                .inpod
                .get()
                .map_or_else(|| json!({}), |m| m.workload_state()),
        }
    }
}

async fn async_main(
    cfg: Arc<Config>,
    log: crate::telemetry::LogHandle,
    data: tokio::runtime::Handle,
) -> Result<(), AppError> {
    let state = Arc::new(ProxyState::new());
    let ready = Ready::new();
    let state_task = ready.register_task("state manager");
    let (servers_drain, servers_watcher) = drain::new();

    let mut static_config = Value::Null;
    if let Some(src) = &cfg.local_xds {
        let local = load_local(src)?;
        static_config = json!({
            "workloads": local.workloads.len(),
            "services": local.services.len(),
            "policies": local.policies.len(),
        });
        apply_local(&state, local);
    }

    let ca_address = cfg.ca_address.clone().ok_or(AppError::NoCa)?;
    let root = crate::grpc::load_root(&cfg.ca_root_cert)?;
    // Control-plane connections carry the packet mark so in-pod capture rules (dedicated mode
    // inside a captured namespace) never redirect ztunnel's own traffic.
    let channel = crate::grpc::channel_with_mark(
        &ca_address,
        &root,
        cfg.alt_ca_hostname.as_deref(),
        cfg.packet_mark,
    )?;
    let ca = CaClient::new(
        channel,
        cfg.auth_token.clone(),
        cfg.cluster_id.clone(),
        cfg.ca_headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cfg.secret_ttl,
        cfg.proxy_mode == ProxyMode::Shared,
    );
    let certs = CertManager::new(ca);
    let metrics = Arc::new(Metrics::new(&cfg.istio_version));
    metrics.register_tokio_runtime("dataplane", data.clone());

    let (quit_tx, mut quit_rx) = mpsc::channel::<()>(1);
    let inpod_slot: Arc<std::sync::OnceLock<Arc<InpodManager>>> = Arc::default();
    let dump = Arc::new(Dump {
        cfg: cfg.clone(),
        state: state.clone(),
        certs: certs.clone(),
        static_config,
        inpod: inpod_slot.clone(),
    });
    let admin_state = AdminState::new(
        move |section: DumpSection| dump.section(section),
        move || {
            let _ = quit_tx.try_send(());
        },
    )
    .with_log_handle(log);
    let admin = AdminServer::bind(cfg.admin_addr, admin_state)?;
    let stats = MetricsServer::bind(cfg.stats_addr, (*metrics).clone())?;
    let readiness = ReadinessServer::bind(cfg.readiness_addr, ready.clone())?;
    let mut servers = tokio::task::JoinSet::new();
    servers.spawn(admin.serve(servers_watcher.clone()));
    servers.spawn(stats.serve(servers_watcher.clone()));
    servers.spawn(readiness.serve(servers_watcher.clone()));
    if let Some(LocalXds::Path(p)) = &cfg.local_xds {
        servers.spawn(watch_local_file(
            p.clone(),
            state.clone(),
            servers_watcher.clone(),
        ));
    }
    // Both the local file and xDS feed the same store (like upstream), each owning its own
    // records (`state::sources`); the state is synced, and readiness released, at the first
    // ACKed response of each xDS type.
    if let Some(address) = &cfg.xds_address {
        let root = crate::grpc::load_root(&cfg.xds_root_cert)?;
        let channel = crate::grpc::channel_with_mark(
            address,
            &root,
            cfg.alt_xds_hostname.as_deref(),
            cfg.packet_mark,
        )?;
        let client = crate::xds::XdsClient::new(
            channel,
            crate::xds::XdsClientConfig::from_config(&cfg),
            state.clone(),
            (*metrics).clone(),
        );
        servers.spawn(client.run(state_task, servers_watcher.clone()));
    } else {
        // The local file (if any) was loaded above: nothing else to wait for.
        state.mark_synced();
        drop(state_task);
    }
    drop(servers_watcher);

    let tracker = ConnectionTracker::new();
    let policy_watch = data.spawn(tracker.clone().watch_policies(state.clone()));

    let mut dns_task_handle = None;
    let running = match cfg.proxy_mode {
        ProxyMode::Dedicated => {
            let info = cfg
                .proxy_workload_info
                .clone()
                .ok_or(AppError::NoWorkloadInfo)?;
            let proxy_task = ready.register_task("proxy");
            let factory: Arc<dyn SocketFactory> = Arc::new(MarkedSocketFactory {
                mark: cfg.packet_mark,
            });
            let listeners = {
                let _guard = data.enter();
                Listeners::bind(&cfg, factory.as_ref())?
            };
            tracing::info!(addresses = ?listeners.addresses(), transparent = listeners.transparent, "proxy listening");
            let inputs = ProxyInputs {
                cfg: cfg.clone(),
                state: state.clone(),
                certs: certs.clone(),
                metrics: metrics.clone(),
                socket_factory: factory.clone(),
                pool: WorkloadPool::new(
                    crate::proxy::pool_config(&cfg),
                    certs.clone(),
                    factory,
                    ambit_netns::SocketOptions {
                        nodelay: true,
                        ..Default::default()
                    },
                ),
                local: LocalWorkload {
                    name: info.name.clone(),
                    namespace: info.namespace.clone(),
                    service_account: info.service_account.clone(),
                },
                tracker: tracker.clone(),
                transparent: false,
            };
            // Prefetch our certificate so the first connection does not wait for the CA.
            if let Some(w) = inputs.local_workload() {
                certs.prefetch(w.identity());
            }
            if cfg.dns_proxy {
                let dns_task = ready.register_task("dns proxy");
                let mut addrs = vec![cfg.dns_proxy_addr];
                if cfg.ipv6_enabled && cfg.dns_proxy_addr.ip() == std::net::Ipv4Addr::LOCALHOST {
                    addrs.push(SocketAddr::from((
                        std::net::Ipv6Addr::LOCALHOST,
                        cfg.dns_proxy_addr.port(),
                    )));
                }
                let dns_listeners = {
                    let _guard = data.enter();
                    DnsServer::bind(inputs.socket_factory.as_ref(), &addrs)?
                };
                let forwarder = Forwarder::from_resolv_conf(&cfg.dns_resolv_conf)?;
                let client_inputs = inputs.clone();
                let ctx = DnsContext {
                    state: state.clone(),
                    client: Arc::new(move || client_inputs.local_workload()),
                    cluster_domain: cfg.cluster_domain.clone(),
                    prefered_service_namespace: cfg.prefered_service_namespace.clone(),
                    ipv6_enabled: cfg.ipv6_enabled,
                    forwarder,
                    socket_factory: inputs.socket_factory.clone(),
                    metrics: Arc::new((*metrics).clone()),
                };
                let watcher = servers_drain.watcher();
                let synced = state.clone();
                dns_task_handle = Some(data.spawn(async move {
                    // Like the proxy listeners, answer nothing before the state synced
                    // (queries wait in the socket buffers meanwhile).
                    tokio::select! {
                        _ = watcher.signaled() => return,
                        () = synced.wait_synced() => {}
                    }
                    DnsServer::serve(dns_listeners, ctx, async move {
                        watcher.signaled().await;
                    })
                    .await;
                }));
                drop(dns_task);
            }
            let proxy = {
                let _guard = data.enter();
                Proxy::serve(listeners, inputs)
            };
            drop(proxy_task);
            Running::Dedicated(proxy)
        }
        ProxyMode::Shared => {
            let mut mgr = InpodManager::new(
                cfg.clone(),
                state.clone(),
                certs.clone(),
                metrics.clone(),
                tracker.clone(),
                ready.clone(),
                data.clone(),
            );
            if cfg.dns_proxy {
                mgr = mgr.with_extras(Arc::new(DnsPodExtras {
                    cfg: cfg.clone(),
                    state: state.clone(),
                    forwarder: Forwarder::from_resolv_conf(&cfg.dns_resolv_conf)?,
                    metrics: metrics.clone(),
                }));
            }
            let mgr = Arc::new(mgr);
            let _ = inpod_slot.set(mgr.clone());
            let (trigger, watcher) = drain::new();
            let task = tokio::spawn(mgr.run(watcher));
            Running::Shared { trigger, task }
        }
    };

    let mut sigterm = crate::signal::Terminate::new().map_err(AppError::Signal)?;
    tokio::select! {
        () = sigterm.recv() => tracing::info!("SIGTERM received, draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received, draining"),
        _ = quit_rx.recv() => tracing::info!("/quitquitquit received, draining"),
    }
    let deadline = cfg.connection_termination_deadline;
    let second_signal = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let stop = async {
        match running {
            Running::Dedicated(proxy) => {
                let _ = data.spawn(proxy.drain(DrainMode::Graceful, deadline)).await;
            }
            Running::Shared { trigger, task } => {
                trigger
                    .start_drain_and_wait(DrainMode::Graceful, deadline + Duration::from_secs(1))
                    .await;
                let _ = task.await;
            }
        }
    };
    tokio::select! {
        _ = stop => {}
        _ = second_signal => tracing::warn!("second signal: stopping immediately"),
    }
    policy_watch.abort();
    if let Some(dns) = dns_task_handle {
        dns.abort();
    }
    servers_drain
        .start_drain_and_wait(DrainMode::Graceful, Duration::from_secs(1))
        .await;
    servers.abort_all();
    tracing::info!("shutdown complete");
    Ok(())
}
