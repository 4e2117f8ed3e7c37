//! `ambit cni-agent` on Windows: environment (upstream's names, every bad one reported) →
//! the Windows node agent (`ambit_agent::windows::agent`: pods from the Kubernetes API,
//! CRI → HNS → `L4WFPPROXY` policies → ZDS over the pipe → the annotation the hold reads).
//! The Linux agent's `--pods` directory source is the embedded mesh's and Linux's.

use std::process::ExitCode;

use ambit_agent::windows::config::WindowsAgentConfig;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> ExitCode {
    crate::init_logging();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cfg = match WindowsAgentConfig::from_vars(&env) {
        Ok(c) => c,
        Err(errors) => {
            eprint!("{errors}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(config = ?cfg, "running Windows node agent");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.send_replace(true);
            }
        });
        ambit_agent::windows::agent::run(cfg, &env, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent failed: {e}");
            ExitCode::FAILURE
        }
    }
}
