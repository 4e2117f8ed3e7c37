//! The hidden subcommands the scenarios start as processes: the ambit roles built into this
//! binary (so one `cargo run -p ambit-bench` builds everything a run needs) and the idle
//! connection holder of the memory measurement.
//!
//! `ztunnel`, `cni-agent` and `cni-plugin` are the same library calls with the same
//! environment parsing as `ambit ztunnel`, `ambit cni-agent --pods DIR` and
//! `ambit cni-plugin` (crates/cli/src/{ztunnel,agent,plugin}.rs); `--ambit-bin` runs a
//! built `ambit` for all three instead.

use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

/// Same as `ambit ztunnel` (crates/cli/src/ztunnel.rs): environment → config → run.
pub fn ztunnel() -> ExitCode {
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let config = match ambit_ztunnel::Config::from_vars(&vars, cpus, &|p| p.exists()) {
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

/// Same as `ambit cni-plugin` (crates/cli/src/plugin.rs).
pub fn cni_plugin() -> ExitCode {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let mut stdin = Vec::new();
    let _ = std::io::stdin().take(1 << 20).read_to_end(&mut stdin);
    let (code, out) = ambit_agent::plugin_main(&env, &stdin);
    let _ = std::io::stdout().write_all(&out);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Same as `ambit cni-agent --pods DIR` (crates/cli/src/agent.rs).
pub fn cni_agent(pods: &Path) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cfg = match ambit_agent::AgentConfig::from_vars(&env) {
        Ok(c) => c,
        Err(errors) => {
            eprint!("{errors}");
            return ExitCode::from(2);
        }
    };
    // The embedded mesh's manifest-fed pod source, as `ambit cni-agent --pods` uses.
    let source = match ambit_mesh::pod_source::start(pods, &cfg.node_name, None) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pods: {e}");
            return ExitCode::from(2);
        }
    };
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
    match rt.block_on(ambit_agent::run_agent(cfg, source)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Opens `count` connections to `dst` (from the network namespace it was started in), each
/// proven end to end by a 1-byte echo, prints `open <count>` and holds them until stdin
/// closes. A separate process, so the bench process holds only the server ends and 10,000
/// connections fit in the open-files limit.
pub fn idle_conns(dst: SocketAddr, count: usize) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let conns = match rt.block_on(open(dst, count)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("idle connections: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    #[allow(clippy::print_stdout)]
    {
        println!("open {}", conns.len());
    }
    let _ = std::io::stdout().flush();
    // Until the parent closes stdin (or dies).
    let mut line = String::new();
    while std::io::stdin()
        .lock()
        .read_line(&mut line)
        .is_ok_and(|n| n > 0)
    {
        line.clear();
    }
    drop(conns);
    ExitCode::SUCCESS
}

async fn open(dst: SocketAddr, count: usize) -> anyhow::Result<Vec<tokio::net::TcpStream>> {
    use anyhow::Context;
    const PARALLEL: usize = 32;
    const STEP: Duration = Duration::from_secs(10);
    let one = move || async move {
        let step = async {
            let mut s = tokio::net::TcpStream::connect(dst).await?;
            s.set_nodelay(true)?;
            s.write_all(b"x").await?;
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await?;
            anyhow::Ok(s)
        };
        tokio::time::timeout(STEP, step)
            .await
            .with_context(|| format!("connect + echo to {dst} timed out"))?
    };
    let mut open = Vec::with_capacity(count);
    let mut pending = JoinSet::new();
    for _ in 0..count {
        if pending.len() >= PARALLEL
            && let Some(r) = pending.join_next().await
        {
            open.push(r??);
        }
        pending.spawn(one());
    }
    while let Some(r) = pending.join_next().await {
        open.push(r??);
    }
    Ok(open)
}
