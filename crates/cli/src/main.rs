//! The `ambit` binary: argument and environment parsing only, then calls the libraries.
//!
//! Each role reads its environment here, in one place, reports every bad variable at once and
//! hands a typed configuration to its library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod ztunnel;

#[derive(Debug, Parser)]
#[command(name = "ambit", version, about = "Istio ambient-mode node data plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node L4 proxy (drop-in for upstream ztunnel; configured by the same environment
    /// variables).
    #[command(
        after_help = "Examples:\n  PROXY_MODE=dedicated PROXY_WORKLOAD_INFO=default/web/web \\\n    CA_ADDRESS=https://10.0.0.1:15012 LOCAL_XDS_PATH=./local.yaml ambit ztunnel"
    )]
    Ztunnel,
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Ztunnel => ztunnel::main(),
        Command::Version => {
            #[allow(clippy::print_stdout)]
            {
                println!("ambit {}", env!("CARGO_PKG_VERSION"));
            }
            ExitCode::SUCCESS
        }
    }
}
