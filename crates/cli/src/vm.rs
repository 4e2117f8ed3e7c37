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
