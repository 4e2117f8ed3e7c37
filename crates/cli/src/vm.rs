//! `ambit vm up DIR` / `ambit vm down`: flags → [`ambit_vm::up`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ambit_redirect::{Backend, CurrentNetns};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Join this host to the mesh from an istioctl bundle (cluster.env, mesh.yaml, hosts,
    /// root-cert.pem, istio-token): ztunnel in dedicated mode as that workload, then the
    /// host-level redirection. Stays in the foreground; SIGTERM or Ctrl-C removes every rule.
    #[command(after_help = "Example:\n  sudo ambit vm up /etc/ambit/vm")]
    Up(UpArgs),
    /// Stop a running `ambit vm up` and remove every VM rule from this host (also after
    /// `vm up` was killed).
    #[command(after_help = "Example:\n  sudo ambit vm down")]
    Down(DownArgs),
    /// Write a VM's bundle for a WorkloadGroup (like `istioctl x workload entry configure`),
    /// with a new token for the group's service account.
    #[command(
        after_help = "Example:\n  ambit vm configure -f workloadgroup.yaml -o vm-bundle \\\n    --ca-address istiod.istio-system.svc:15012 --ingress-ip 10.0.0.5 \\\n    --root-cert /var/lib/ambit/control/root-cert.pem --tokens tokens.yaml"
    )]
    Configure(ConfigureArgs),
}

#[derive(Debug, clap::Args)]
struct ConfigureArgs {
    /// The WorkloadGroup manifest.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// The bundle directory to write.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// The control plane as the VM reaches it (HOST:PORT).
    #[arg(long, default_value = "istiod.istio-system.svc:15012")]
    ca_address: String,
    /// The mesh's root certificate (`ambit control`'s state directory has it).
    #[arg(long, default_value = "/var/lib/ambit/control/root-cert.pem")]
    root_cert: PathBuf,
    /// The address the VM reaches the control plane's host name at (written to `hosts`).
    #[arg(long = "ingress-ip", alias = "ingressIP")]
    ingress_ip: Option<std::net::IpAddr>,
    /// The VM's own address (`ISTIO_SVC_IP`).
    #[arg(long = "internal-ip", alias = "internalIP")]
    internal_ip: Option<std::net::IpAddr>,
    #[arg(long = "cluster-id", alias = "clusterID", default_value = "Kubernetes")]
    cluster_id: String,
    /// The trust domain (empty: the mesh config's `trustDomain`, else the mesh's default).
    #[arg(long, default_value = "")]
    trust_domain: String,
    /// Istio's mesh config (the `mesh` key of the `istio` ConfigMap), as istioctl reads it:
    /// its `defaultConfig.proxyMetadata` goes into mesh.yaml under the generated keys, its
    /// `trustDomain` is used when --trust-domain is empty.
    #[arg(long)]
    mesh_config: Option<PathBuf>,
    /// Capture the VM's DNS into ztunnel's DNS proxy.
    #[arg(long = "capture-dns", default_value_t = true, action = clap::ArgAction::Set)]
    capture_dns: bool,
    /// Ask the control plane to register the VM as a WorkloadEntry of the group.
    #[arg(long)]
    autoregister: bool,
    /// `ambit control`'s token file: the new token is added to it as the group's identity
    /// (the control plane reads the file at start). Without it, the entry to add is printed.
    #[arg(long)]
    tokens: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// The bundle directory.
    dir: PathBuf,
    /// Rule backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Iptables)]
    backend: BackendArg,
    /// Seconds ztunnel has to become ready before the start fails (nothing is left behind).
    #[arg(long, default_value_t = 60)]
    ready_timeout: u64,
    /// Where the pid file `vm down` uses is kept.
    #[arg(long, default_value = "/run/ambit-vm")]
    run_dir: PathBuf,
}

#[derive(Debug, clap::Args)]
struct DownArgs {
    /// The run directory of `vm up`.
    #[arg(long, default_value = "/run/ambit-vm")]
    run_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BackendArg {
    Iptables,
    Nftables,
}

pub fn main(args: Args) -> ExitCode {
    crate::init_logging();
    match args.command {
        Command::Up(a) => up(a),
        Command::Configure(a) => match configure(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("vm configure: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Down(a) => {
            match ambit_vm::up::down(&a.run_dir, &CurrentNetns, Duration::from_secs(20)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("vm down: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn up(a: UpArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(p) => p.display().to_string(),
        Err(e) => {
            eprintln!("vm up: cannot find the ambit binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let extra_env = ["PATH", "RUST_LOG", "LOG_FORMAT", "ZTUNNEL_WORKER_THREADS"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
        .collect();
    let cfg = ambit_vm::up::Config {
        bundle_dir: a.dir,
        ztunnel: vec![exe, "ztunnel".into()],
        backend: match a.backend {
            BackendArg::Iptables => Backend::Iptables,
            BackendArg::Nftables => Backend::Nftables,
        },
        ready_timeout: Duration::from_secs(a.ready_timeout),
        run_dir: a.run_dir,
        extra_env,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // SIGTERM / SIGINT set the flag; `run` polls it and cleans up.
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        flag.store(true, Ordering::Relaxed);
    });
    match ambit_vm::up::run(&cfg, &CurrentNetns, &stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vm up: {e}");
            ExitCode::FAILURE
        }
    }
}

fn configure(a: ConfigureArgs) -> anyhow::Result<()> {
    use ambit_vm::configure::{Options, add_token, new_token, parse_group, render};
    use anyhow::Context;
    let path = a.file.display().to_string();
    let text = std::fs::read_to_string(&a.file).with_context(|| path.clone())?;
    let group = parse_group(&path, &text)?;
    let root_cert_pem = std::fs::read_to_string(&a.root_cert)
        .with_context(|| format!("{}: the root certificate", a.root_cert.display()))?;
    let mut a = a;
    let mut proxy_metadata = Default::default();
    if let Some(file) = &a.mesh_config {
        let origin = format!("mesh config {}", file.display());
        let text = std::fs::read_to_string(file).with_context(|| origin.clone())?;
        let mesh = ambit_control::mesh_config::MeshConfig::parse(&origin, &text)?;
        if a.trust_domain.is_empty() {
            a.trust_domain = mesh.trust_domain.unwrap_or_default();
        }
        proxy_metadata = mesh.proxy_metadata;
    }
    let token = new_token().context("a new token")?;
    let sa = match group.spec.template.service_account.as_str() {
        "" => "default",
        sa => sa,
    };
    let td = if a.trust_domain.is_empty() {
        "cluster.local"
    } else {
        &a.trust_domain
    };
    let identity = format!("spiffe://{td}/ns/{}/sa/{sa}", group.metadata.namespace);
    let files = render(
        &group,
        &Options {
            ca_address: a.ca_address,
            ingress_ip: a.ingress_ip,
            internal_ip: a.internal_ip,
            cluster_id: a.cluster_id,
            trust_domain: a.trust_domain,
            capture_dns: a.capture_dns,
            auto_register: a.autoregister,
            root_cert_pem,
            token: token.clone(),
            proxy_metadata,
        },
    );
    // Checked the way `vm up` will read it before anything is written.
    let check = tempfile_dir(&a.output)?;
    files.write(&check)?;
    let loaded = ambit_vm::Bundle::load(&check);
    let _ = std::fs::remove_dir_all(&check);
    loaded?;
    files.write(&a.output)?;
    match a.tokens {
        Some(t) => {
            let old = match std::fs::read_to_string(&t) {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(e).with_context(|| t.display().to_string()),
            };
            let new = add_token(&old, &token, &identity)
                .map_err(|e| anyhow::anyhow!("{}: {e}", t.display()))?;
            std::fs::write(&t, new).with_context(|| t.display().to_string())?;
            eprintln!(
                "token for {identity} added to {} (restart ambit control to accept it)",
                t.display()
            );
        }
        None => eprintln!(
            "add to ambit control's token file:\n- token: {token}\n  identity: {identity}"
        ),
    }
    eprintln!("bundle written to {}", a.output.display());
    Ok(())
}

/// A scratch directory beside `out` for checking the bundle before writing it.
fn tempfile_dir(out: &std::path::Path) -> anyhow::Result<PathBuf> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let dir = parent.join(format!(".ambit-vm-configure-{}", std::process::id()));
    Ok(dir)
}
