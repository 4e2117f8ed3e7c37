//! `ambit vm up DIR` / `ambit vm down` (`docs/vm.md`): a VM joins the mesh from its bundle.
//!
//! Order, so that SSH and the excluded ports never depend on the mesh and a failed start
//! leaves nothing behind:
//!
//! 1. read the bundle ([`Bundle::load`]); a bad one fails before anything is touched;
//! 2. resolve the control plane (the bundle's `hosts` first, then the system resolver) and
//!    open a TCP connection to it within [`CA_CONNECT_TIMEOUT`]: an unreachable CA fails
//!    before any rule or process exists;
//! 3. start ztunnel in dedicated mode as the bundle's workload ([`ztunnel_env`]) and wait for
//!    its readiness (`:15021/healthz/ready`) within [`Config::ready_timeout`];
//! 4. only then write the host-level rules (`ambit_redirect::vm`);
//! 5. run until stopped; a ztunnel that exits is restarted (1 s doubling to 30 s) while the
//!    rules stay, so captured traffic fails rather than bypasses;
//! 6. on stop, or on any failure after step 2: remove every VM rule (both backends), then
//!    stop ztunnel (SIGTERM, SIGKILL after [`STOP_GRACE`]).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ambit_contract::{marks, ports};
use ambit_redirect::Backend;
use ambit_redirect::{NetnsRunner, VmRules};

use crate::bundle::{Bundle, BundleErrors};

/// Bound on the pre-flight connection to the control plane.
pub const CA_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long ztunnel has to exit after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// Bound on one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The pid file `vm down` signals, in [`Config::run_dir`].
pub const PID_FILE: &str = "vm-up.pid";
/// Present in [`Config::run_dir`] while ztunnel is ready and the rules are in place (written
/// after step 4, removed first on stop): what a supervisor (`ambit up`) waits for before it
/// starts the VM's own programs.
pub const READY_FILE: &str = "vm-up.ready";

/// What `ambit vm up` needs besides the bundle.
#[derive(Debug, Clone)]
pub struct Config {
    /// The bundle directory.
    pub bundle_dir: PathBuf,
    /// The program and arguments that start ztunnel (`ambit ztunnel`).
    pub ztunnel: Vec<String>,
    /// iptables or nftables for the rules.
    pub backend: Backend,
    /// How long ztunnel has to become ready.
    pub ready_timeout: Duration,
    /// Where the pid file goes.
    pub run_dir: PathBuf,
    /// Variables passed to ztunnel besides the bundle's (`RUST_LOG`, `PATH`).
    pub extra_env: Vec<(String, String)>,
}

/// Why `vm up` or `vm down` failed.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// The bundle does not read.
    #[error(transparent)]
    Bundle(#[from] BundleErrors),
    /// The control plane's name does not resolve.
    #[error("{source_key} {address}: the name does not resolve (add it to {dir}/hosts): {reason}")]
    Resolve {
        /// The key (or file) that named the address.
        source_key: String,
        /// The address.
        address: String,
        /// The bundle directory.
        dir: String,
        /// The resolver's answer.
        reason: String,
    },
    /// The control plane does not accept connections.
    #[error("{source_key} {address} ({resolved}): the control plane is unreachable: {reason}")]
    Unreachable {
        /// The key (or file) that named the address.
        source_key: String,
        /// The address.
        address: String,
        /// What it resolved to.
        resolved: SocketAddr,
        /// The connect error.
        reason: std::io::Error,
    },
    /// ztunnel could not be started.
    #[error("cannot start ztunnel ({program}): {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
    /// ztunnel exited before it was ready.
    #[error("ztunnel exited before it was ready ({0})")]
    ExitedEarly(ExitStatus),
    /// ztunnel did not become ready in time.
    #[error("ztunnel was not ready within {0:?} (is the token valid for the control plane?)")]
    NotReady(Duration),
    /// Writing or removing the rules failed.
    #[error("VM rules: {0}")]
    Rules(#[from] ambit_redirect::ApplyError),
    /// Rules are still present after `vm down` removed them.
    #[error("VM rules are still present after removing them")]
    RulesLeft,
    /// The pid file could not be written or read.
    #[error("{path}: {source}")]
    PidFile {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Stopped (by a signal) before the start completed.
    #[error("stopped before ztunnel was ready")]
    Stopped,
}

/// The control plane as ztunnel will reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlane {
    /// The address connected to.
    pub addr: SocketAddr,
    /// The name its certificate is checked against, when the bundle gave a name.
    pub hostname: Option<String>,
    /// This host's address on the connection to it: the VM's address when the bundle
    /// declares none (`ISTIO_SVC_IP`), so auto-registration and ztunnel agree on it.
    pub local: Option<IpAddr>,
}

/// Resolves and checks the bundle's control plane (step 2).
pub fn preflight(b: &Bundle) -> Result<ControlPlane, UpError> {
    let (host, port) =
        crate::bundle::split_address(&b.ca_address).ok_or_else(|| UpError::Resolve {
            source_key: b.ca_address_key.clone(),
            address: b.ca_address.clone(),
            dir: b.dir.display().to_string(),
            reason: "not HOST:PORT".into(),
        })?;
    let (ip, hostname) = match host.parse::<IpAddr>() {
        Ok(ip) => (ip, None),
        Err(_) => {
            let ip = match b.host_address(host) {
                Some(ip) => ip,
                None => (host, port)
                    .to_socket_addrs()
                    .map_err(|e| e.to_string())
                    .and_then(|mut a| a.next().ok_or_else(|| "no address".to_owned()))
                    .map_err(|reason| UpError::Resolve {
                        source_key: b.ca_address_key.clone(),
                        address: b.ca_address.clone(),
                        dir: b.dir.display().to_string(),
                        reason,
                    })?
                    .ip(),
            };
            (ip, Some(host.to_owned()))
        }
    };
    let addr = SocketAddr::new(ip, port);
    let probe = TcpStream::connect_timeout(&addr, CA_CONNECT_TIMEOUT).map_err(|reason| {
        UpError::Unreachable {
            source_key: b.ca_address_key.clone(),
            address: b.ca_address.clone(),
            resolved: addr,
            reason,
        }
    })?;
    let local = probe
        .local_addr()
        .ok()
        .map(|a| a.ip().to_canonical())
        .filter(|ip| !ip.is_unspecified());
    Ok(ControlPlane {
        addr,
        hostname,
        local,
    })
}

/// ztunnel's environment for the bundle's workload (dedicated mode).
pub fn ztunnel_env(b: &Bundle, cp: &ControlPlane) -> Vec<(String, String)> {
    let abs = |p: &Path| {
        std::path::absolute(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string()
    };
    let url = format!("https://{}", cp.addr);
    let root = abs(&b.dir.join(crate::bundle::ROOT_CERT));
    let id = &b.identity;
    let mut env: Vec<(String, String)> = Vec::new();
    // Node metadata first, so the settings below win on a clash (DNS_CAPTURE).
    for (k, v) in &b.metadata {
        env.push((k.clone(), v.clone()));
    }
    let mut set = |k: &str, v: String| {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_owned(), v));
    };
    set("PROXY_MODE", "dedicated".into());
    // An auto-registering VM is the WorkloadEntry the control plane names after the group and
    // the VM's address; ztunnel finds its own workload by that name.
    let instance_ip = b.instance_ip.or(cp.local);
    let name = match (&b.auto_register_group, instance_ip) {
        (Some(group), Some(ip)) => autoregistered_name(group, ip, &b.network),
        _ => b.workload_name.clone(),
    };
    set(
        "PROXY_WORKLOAD_INFO",
        format!("{}/{name}/{}", id.namespace, id.service_account),
    );
    set("POD_NAMESPACE", id.namespace.clone());
    set("SERVICE_ACCOUNT", id.service_account.clone());
    set("TRUST_DOMAIN", id.trust_domain.clone());
    set("CA_ADDRESS", url.clone());
    set("XDS_ADDRESS", url);
    set("CA_ROOT_CA", root.clone());
    set("XDS_ROOT_CA", root);
    if let Some(h) = &cp.hostname {
        set("ALT_CA_HOSTNAME", h.clone());
        set("ALT_XDS_HOSTNAME", h.clone());
    }
    set("AUTH_TOKEN", abs(&b.token_path));
    // The VM rules let ztunnel's own sockets through by this mark.
    set("PACKET_MARK", marks::INPOD_MARK.to_string());
    // Inbound connections to the VM's apps come from ztunnel's own address: the host has no
    // in-pod routing that would bring replies to a spoofed peer address back to ztunnel.
    set("ENABLE_ORIG_SRC", "false".into());
    set("CLUSTER_ID", b.cluster_id.clone());
    set("NETWORK", b.network.clone());
    // The VM's address: the bundle's, else the one it reaches the control plane from (what
    // ztunnel sends as INSTANCE_IPS, and so what an auto-registered entry gets).
    if let Some(ip) = instance_ip {
        set("INSTANCE_IP", ip.to_string());
    }
    let dns = b.redirect.as_ref().map_or_else(
        || {
            b.metadata
                .get("ISTIO_META_DNS_CAPTURE")
                .is_some_and(|v| v == "true")
        },
        |r| r.dns_capture,
    );
    set("ISTIO_META_DNS_CAPTURE", dns.to_string());
    set("IPV6_ENABLED", kernel_has_ipv6().to_string());
    env
}

/// The name `ambit control` (like istiod) gives an auto-registered WorkloadEntry:
/// `<group>-<address, ':' as '-'>[-<network>]`, its last 253 characters.
pub fn autoregistered_name(group: &str, ip: IpAddr, network: &str) -> String {
    let mut name = format!("{group}-{}", ip.to_string().replace(':', "-"));
    if !network.is_empty() {
        name.push('-');
        name.push_str(network);
    }
    match name.len().checked_sub(253) {
        Some(cut) if cut > 0 && name.is_char_boundary(cut) => name[cut..].to_string(),
        _ => name,
    }
}

fn kernel_has_ipv6() -> bool {
    Path::new("/proc/sys/net/ipv6").exists()
}

/// `ambit vm up`: steps 1–6 above, in the calling thread's network namespace; returns when
/// `stop` is set (after cleaning up) or on a failure (after cleaning up).
pub fn run(cfg: &Config, rules: &dyn NetnsRunner, stop: &AtomicBool) -> Result<(), UpError> {
    let bundle = match Bundle::load(&cfg.bundle_dir) {
        Ok(b) => b,
        Err(e) => {
            // Leftovers of a crashed run must not outlive a failed start.
            ambit_redirect::vm::delete_all(rules)?;
            return Err(e.into());
        }
    };
    for w in &bundle.warnings {
        tracing::warn!("{}: {w}", cfg.bundle_dir.display());
    }
    // A killed run's rules would capture the pre-flight connection into a ztunnel that is
    // gone: remove them first (the new run writes its own once ztunnel is ready).
    ambit_redirect::vm::delete_all(rules)?;
    let cp = match preflight(&bundle) {
        Ok(cp) => cp,
        Err(e) => {
            ambit_redirect::vm::delete_all(rules)?;
            return Err(e);
        }
    };
    tracing::info!(
        identity = %bundle.identity.spiffe_id(),
        control_plane = %cp.addr,
        "VM bundle read"
    );
    let env = ztunnel_env(&bundle, &cp);
    let pid_path = cfg.run_dir.join(PID_FILE);
    let mut z = Ztunnel::new(cfg, env);
    let ready_path = cfg.run_dir.join(READY_FILE);
    let started = start(cfg, &bundle, rules, stop, &mut z, &pid_path).and_then(|()| {
        std::fs::write(&ready_path, b"").map_err(|source| UpError::PidFile {
            path: ready_path.clone(),
            source,
        })
    });
    if let Err(e) = started {
        let _ = std::fs::remove_file(&ready_path);
        let cleanup = ambit_redirect::vm::delete_all(rules);
        z.stop();
        let _ = std::fs::remove_file(&pid_path);
        cleanup?;
        return Err(e);
    }
    let mut backoff = Duration::from_secs(1);
    let mut restart_at: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        match z.try_exit() {
            Some(status) if restart_at.is_none() => {
                tracing::error!(%status, ?backoff, "ztunnel exited; restarting (rules kept)");
                restart_at = Some(Instant::now() + backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            _ => {}
        }
        if restart_at.is_some_and(|t| Instant::now() >= t) {
            restart_at = None;
            if let Err(e) = z.spawn() {
                tracing::error!("{e}");
                restart_at = Some(Instant::now() + backoff);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("stopping: removing the VM rules, then ztunnel");
    let _ = std::fs::remove_file(&ready_path);
    let cleanup = ambit_redirect::vm::delete_all(rules);
    z.stop();
    let _ = std::fs::remove_file(&pid_path);
    cleanup?;
    Ok(())
}

fn start(
    cfg: &Config,
    bundle: &Bundle,
    rules: &dyn NetnsRunner,
    stop: &AtomicBool,
    z: &mut Ztunnel,
    pid_path: &Path,
) -> Result<(), UpError> {
    // A killed run's ready mark must not announce this one.
    let _ = std::fs::remove_file(cfg.run_dir.join(READY_FILE));
    std::fs::create_dir_all(&cfg.run_dir)
        .and_then(|()| std::fs::write(pid_path, format!("{}\n", std::process::id())))
        .map_err(|source| UpError::PidFile {
            path: pid_path.to_path_buf(),
            source,
        })?;
    z.spawn()?;
    let deadline = Instant::now() + cfg.ready_timeout;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(UpError::Stopped);
        }
        if let Some(status) = z.try_exit() {
            return Err(UpError::ExitedEarly(status));
        }
        if ready() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(UpError::NotReady(cfg.ready_timeout));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Some(config) = &bundle.redirect {
        let mut config = config.clone();
        config.ipv6 = config.ipv6 && kernel_has_ipv6();
        VmRules {
            backend: cfg.backend,
            config,
        }
        .apply(rules)?;
        tracing::info!(backend = ?cfg.backend, "VM rules written");
    } else {
        tracing::info!("ISTIO_CUSTOM_IP_TABLES=true: no rules written");
    }
    Ok(())
}

/// `GET /healthz/ready` on ztunnel's readiness port answered 200.
fn ready() -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], ports::ZTUNNEL_READINESS));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = s.set_write_timeout(Some(PROBE_TIMEOUT));
    if s.write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok()
        && head.starts_with(b"HTTP/1.")
        && head[8..].starts_with(b" 200")
}

/// The ztunnel child process.
struct Ztunnel {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Ztunnel {
    fn new(cfg: &Config, mut env: Vec<(String, String)>) -> Self {
        env.extend(cfg.extra_env.iter().cloned());
        Self {
            argv: cfg.ztunnel.clone(),
            env,
            child: None,
        }
    }

    fn spawn(&mut self) -> Result<(), UpError> {
        let program = self.argv.first().cloned().unwrap_or_default();
        let mut cmd = Command::new(&program);
        // ztunnel dies with `vm up`, even a SIGKILLed one (`vm up` spawns from one thread).
        ambit_netns::kill_with_parent(&mut cmd);
        let child = cmd
            .args(self.argv.iter().skip(1))
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| UpError::Spawn { program, source })?;
        tracing::info!(pid = child.id(), "ztunnel started");
        self.child = Some(child);
        Ok(())
    }

    /// The exit status once the process has exited (reaped).
    fn try_exit(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                Some(status)
            }
            _ => None,
        }
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        crate::signal::terminate(child.id());
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Ztunnel {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `ambit vm down`: stops a running `vm up` (its pid file in `run_dir`; it removes its rules
/// itself), then removes every VM rule left in the namespace and checks none is left.
pub fn down(run_dir: &Path, rules: &dyn NetnsRunner, wait: Duration) -> Result<(), UpError> {
    let pid_path = run_dir.join(PID_FILE);
    match std::fs::read_to_string(&pid_path) {
        Ok(text) => {
            if let Ok(pid) = text.trim().parse::<u32>()
                && crate::signal::terminate(pid)
            {
                let deadline = Instant::now() + wait;
                while crate::signal::alive(pid) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            let _ = std::fs::remove_file(&pid_path);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(UpError::PidFile {
                path: pid_path,
                source,
            });
        }
    }
    ambit_redirect::vm::delete_all(rules)?;
    if ambit_redirect::vm::any_present(rules)? {
        return Err(UpError::RulesLeft);
    }
    Ok(())
}
