//! `ambit ztunnel`: environment → [`ambit_ztunnel::Config`] → run.

use std::process::ExitCode;

use ambit_ztunnel::Config;

/// Reads the environment once, reports every invalid variable together, then runs the proxy.
pub fn main() -> ExitCode {
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let config = match Config::from_vars(&vars, cpus, &|p| p.exists()) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    match ambit_ztunnel::app::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ztunnel failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
