//! Operating a running embedded mesh: `ambit apply`/`delete`, `ambit logs`, `ambit
//! ztunnel-config`, `ambit completions` (and `ambit restart`). Flags in, text out; the work is in [`ambit_mesh`].

use std::process::ExitCode;

use ambit_mesh::RunDir;
use ambit_mesh::ztunnel_config::Section;

use crate::up::RunDirArgs;

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    run: RunDirArgs,
    /// `control`, `agent-NODE`, `ztunnel-NODE`, or a pod (`NAME` or `NAMESPACE/NAME`).
    component: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ConfigSection {
    Workloads,
    Services,
    Policies,
    Certificates,
    Connections,
    /// Every section (`-o json|yaml`: the whole `/config_dump`).
    All,
    /// The log levels (admin `/logging`), changed with `--level` or `--reset`.
    Log,
}

impl ConfigSection {
    /// The sections shown, in order.
    fn sections(self) -> Vec<Section> {
        match self {
            ConfigSection::Workloads => vec![Section::Workloads],
            ConfigSection::Services => vec![Section::Services],
            ConfigSection::Policies => vec![Section::Policies],
            ConfigSection::Certificates => vec![Section::Certificates],
            ConfigSection::Connections => vec![Section::Connections],
            ConfigSection::All => vec![
                Section::Workloads,
                Section::Services,
                Section::Policies,
                Section::Certificates,
                Section::Connections,
            ],
            ConfigSection::Log => Vec::new(),
        }
    }
}

/// `ambit ztunnel-config -o` (`short` is istioctl's name for the table).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ConfigOutput {
    #[value(alias = "short")]
    Table,
    Json,
    Yaml,
}

#[derive(Debug, clap::Args)]
pub struct ZtunnelConfigArgs {
    #[command(flatten)]
    run: RunDirArgs,
    /// What to show.
    #[arg(value_enum)]
    section: ConfigSection,
    /// A ztunnel pod on a cluster, `NAME[.NAMESPACE]` (implies --kubernetes).
    #[arg(value_name = "POD[.NAMESPACE]")]
    pod: Option<String>,
    /// Only this node's ztunnel (default: every node's).
    #[arg(long, conflicts_with = "pod")]
    node: Option<String>,
    /// Ask a cluster's ztunnels through the API server's pod proxy (KUBECONFIG, else
    /// in-cluster, else ~/.kube/config) instead of the embedded mesh in --run-dir.
    #[arg(long)]
    kubernetes: bool,
    /// Namespace of the ztunnel pods on the cluster.
    #[arg(long, default_value = "istio-system")]
    ztunnel_namespace: String,
    /// A saved /config_dump (JSON) instead of a live ztunnel.
    #[arg(long, conflicts_with_all = ["pod", "node", "kubernetes"])]
    file: Option<std::path::PathBuf>,
    /// Only workloads, services, policies, certificates and pods of this namespace.
    #[arg(long)]
    workload_namespace: Option<String>,
    /// Only the workload or service with this address.
    #[arg(long)]
    address: Option<String>,
    /// Connections: only this direction.
    #[arg(long, value_enum)]
    direction: Option<crate::config_dumps::Direction>,
    /// Output format. `json`/`yaml`: the section of `/config_dump` as the ztunnel serves it
    /// (the shape `istioctl ztunnel-config` reads); with `--node` that ztunnel's alone, else
    /// keyed by node.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: ConfigOutput,
    /// `log`: set levels, `LEVEL` or `SCOPE:LEVEL,...` (trace, debug, info, warning, error,
    /// critical, off).
    #[arg(long, conflicts_with = "reset")]
    level: Option<String>,
    /// `log`: back to the start-up level.
    #[arg(short = 'r', long)]
    reset: bool,
}

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    run: RunDirArgs,
    /// Manifest file (multi-document YAML), or `-` for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    file: std::path::PathBuf,
}

/// `ambit apply -f` / `ambit delete -f`: the running orchestrator does the work.
pub fn apply(args: ApplyArgs, op: ambit_mesh::api::Op) -> ExitCode {
    use std::io::Read;
    let name = args.file.display().to_string();
    let text = if name == "-" {
        let mut t = String::new();
        std::io::stdin().read_to_string(&mut t).map(|_| t)
    } else {
        std::fs::read_to_string(&args.file)
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            eprintln!("reading {name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let run = RunDir::new(&args.run.run_dir);
    let mut req = ambit_mesh::api::Request::new(op);
    req.file = if name == "-" { "<stdin>".into() } else { name };
    req.text = text;
    match ambit_mesh::api::request(&run, &req) {
        Ok(resp) => answered(&resp, "error"),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the orchestrator's answer; its exit code.
fn answered(resp: &ambit_mesh::api::Response, prefix: &str) -> ExitCode {
    for line in &resp.lines {
        say(line);
    }
    if resp.ok {
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "{prefix}: {}",
        resp.error
            .as_deref()
            .unwrap_or("the orchestrator refused the request")
    );
    ExitCode::FAILURE
}

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to generate completions for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

use crate::out::say;

fn table(rows: &[Vec<String>]) {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; n];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        say(line.join("  ").trim_end());
    }
}

pub fn logs(args: LogsArgs) -> ExitCode {
    let run = RunDir::new(&args.run.run_dir);
    let file = match ambit_mesh::logs::find(&run, &args.component) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("ambit logs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut f = match std::fs::File::open(&file.path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("ambit logs: {}: {e}", file.path.display());
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    match std::io::copy(&mut f, &mut out) {
        Ok(_) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ambit logs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `error: cause: cause …`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The cluster client, the ztunnels `args` select on it, and a runtime to ask them with.
fn cluster(
    args: &ZtunnelConfigArgs,
) -> Result<
    (
        ambit_kubeapi::Client,
        crate::config_dumps::Target,
        tokio::runtime::Runtime,
    ),
    String,
> {
    use crate::config_dumps::Target;
    let target = match (&args.pod, &args.node) {
        (Some(p), _) => Target::pod(p, &args.ztunnel_namespace),
        (None, Some(n)) => Target::Node(n.clone()),
        (None, None) => Target::All,
    };
    let config = crate::kube_config()
        .map_err(|e| format!("Kubernetes API configuration: {}", error_chain(&e)))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    // The client's transport starts its worker on this runtime.
    let client = {
        let _runtime = rt.enter();
        ambit_kubeapi::Client::new(config).map_err(|e| error_chain(&e))?
    };
    Ok((client, target, rt))
}

/// The dumps `args` select: a file, a cluster's ztunnels, or the embedded mesh's.
fn config_dumps(args: &ZtunnelConfigArgs) -> Result<Vec<(String, serde_json::Value)>, String> {
    use crate::config_dumps::{from_cluster, from_file};
    if let Some(file) = &args.file {
        return from_file(file).map_err(|e| error_chain(&e));
    }
    if args.kubernetes || args.pod.is_some() {
        let (client, target, rt) = cluster(args)?;
        return rt
            .block_on(from_cluster(&client, &target, &args.ztunnel_namespace))
            .map_err(|e| error_chain(&e));
    }
    let run = RunDir::new(&args.run.run_dir);
    ambit_mesh::ztunnel_config::dumps(&run, args.node.as_deref()).map_err(|e| e.to_string())
}

/// `ztunnel-config log`: POST `/logging` on the selected ztunnels.
fn ztunnel_log(args: &ZtunnelConfigArgs) -> Result<String, String> {
    use crate::ztunnel_log::{logging_query, query_string, render};
    if args.file.is_some() {
        return Err("log: --file is not applicable (a saved dump has no log levels)".into());
    }
    if !matches!(args.output, ConfigOutput::Table) {
        return Err("log: --output is not applicable".into());
    }
    let query = logging_query(args.level.as_deref(), args.reset).map_err(|e| e.to_string())?;
    let answers = if args.kubernetes || args.pod.is_some() {
        let (client, target, rt) = cluster(args)?;
        rt.block_on(crate::config_dumps::logging_on_cluster(
            &client,
            &target,
            &args.ztunnel_namespace,
            &query,
        ))
        .map_err(|e| error_chain(&e))?
    } else {
        let run = RunDir::new(&args.run.run_dir);
        ambit_mesh::ztunnel_config::logging(&run, args.node.as_deref(), &query_string(&query))
            .map_err(|e| e.to_string())?
    };
    Ok(render(&answers))
}

pub fn ztunnel_config(args: ZtunnelConfigArgs) -> ExitCode {
    if !matches!(args.section, ConfigSection::Log) && (args.level.is_some() || args.reset) {
        eprintln!("ambit ztunnel-config: --level and --reset belong to the log view");
        return ExitCode::FAILURE;
    }
    if matches!(args.section, ConfigSection::Log) {
        return match ztunnel_log(&args) {
            Ok(text) => {
                say(text.trim_end());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ambit ztunnel-config: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut dumps = match config_dumps(&args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ambit ztunnel-config: {e}");
            return ExitCode::FAILURE;
        }
    };
    let filter = crate::config_dumps::Filter {
        workload_namespace: args.workload_namespace.clone(),
        address: args.address.clone(),
        direction: args.direction,
    };
    for (_, dump) in &mut dumps {
        filter.apply(dump);
    }
    let single = args.node.is_some() || args.pod.is_some() || args.file.is_some();
    let sections = args.section.sections();
    // The part of one dump that is shown: one section's value, or the whole dump.
    let view = |dump: &serde_json::Value| match args.section {
        ConfigSection::All => dump.clone(),
        _ => dump
            .get(sections[0].key())
            .cloned()
            .unwrap_or(serde_json::Value::Null),
    };
    let structured = || {
        if single && let [(_, dump)] = dumps.as_slice() {
            return view(dump);
        }
        let mut out = serde_json::Map::new();
        for (node, dump) in &dumps {
            out.insert(node.clone(), view(dump));
        }
        serde_json::Value::Object(out)
    };
    let printed = match args.output {
        ConfigOutput::Json => {
            serde_json::to_string_pretty(&structured()).map_err(|e| e.to_string())
        }
        ConfigOutput::Yaml => serde_norway::to_string(&structured()).map_err(|e| e.to_string()),
        ConfigOutput::Table => {
            for (i, section) in sections.iter().enumerate() {
                if i > 0 {
                    say("");
                }
                print_table(*section, &dumps);
            }
            return ExitCode::SUCCESS;
        }
    };
    match printed {
        Ok(text) => {
            say(text.trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ambit ztunnel-config: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One section of every dump as one table with a ZTUNNEL column.
fn print_table(section: Section, dumps: &[(String, serde_json::Value)]) {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (node, dump) in dumps {
        let mut t = ambit_mesh::ztunnel_config::table(section, dump);
        if rows.is_empty() {
            if let Some(h) = t.first_mut() {
                h.insert(0, "ZTUNNEL".into());
            }
        } else if !t.is_empty() {
            t.remove(0);
        }
        let first = rows.is_empty();
        for (i, mut r) in t.into_iter().enumerate() {
            if !(first && i == 0) {
                r.insert(0, node.clone());
            }
            rows.push(r);
        }
    }
    table(&rows);
}

pub fn completions(args: CompletionsArgs, mut cmd: clap::Command) -> ExitCode {
    let name = cmd.get_name().to_owned();
    // Into memory first: `generate` panics on a write error (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, name, &mut script);
    crate::out::bytes(&script);
    ExitCode::SUCCESS
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum RestartComponent {
    Ztunnel,
    Agent,
    /// A pod's sandbox (its network namespace), as a kubelet re-creates a lost one.
    Pod,
}

#[derive(Debug, clap::Args)]
pub struct RestartArgs {
    #[command(flatten)]
    run: RunDirArgs,
    /// Which node component.
    #[arg(value_enum)]
    component: RestartComponent,
    /// The node (for `pod`: the pod, NAME or NAMESPACE/NAME).
    node: String,
    /// How long the new process may take to become ready.
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    timeout: u64,
}

pub fn restart(args: RestartArgs) -> ExitCode {
    use ambit_mesh::restart::Component;
    let run = RunDir::new(&args.run.run_dir);
    let component = match args.component {
        RestartComponent::Ztunnel => Component::Ztunnel,
        RestartComponent::Agent => Component::Agent,
        RestartComponent::Pod => {
            // Only the orchestrator owns the namespaces.
            let mut req = ambit_mesh::api::Request::new(ambit_mesh::api::Op::RestartPod);
            req.pod = Some(args.node.clone());
            return match ambit_mesh::api::request(&run, &req) {
                Ok(resp) => answered(&resp, "ambit restart"),
                Err(e) => {
                    eprintln!("ambit restart: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    };
    // A running orchestrator does it: it replaces a ztunnel with an overlap (it owns the
    // namespaces), and its supervisor must not take the old process's exit for a crash.
    let (op, what) = match component {
        Component::Ztunnel => (ambit_mesh::api::Op::RestartZtunnel, "ztunnel"),
        Component::Agent => (ambit_mesh::api::Op::RestartAgent, "agent"),
    };
    let mut req = ambit_mesh::api::Request::new(op);
    req.node = Some(args.node.clone());
    match ambit_mesh::api::request(&run, &req) {
        Ok(resp) => return answered(&resp, "ambit restart"),
        Err(ambit_mesh::api::ApiError::Connect { .. }) => {
            say(&format!(
                "no orchestrator answers: stopping the old {what} before starting the new one"
            ));
        }
        Err(e) => {
            eprintln!("ambit restart: {e}");
            return ExitCode::FAILURE;
        }
    }
    match ambit_mesh::restart::restart(
        &run,
        component,
        &args.node,
        std::time::Duration::from_secs(args.timeout),
    ) {
        Ok(r) => {
            say(&format!(
                "{} restarted: pid {} → {} (ready)",
                r.role,
                r.old_pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.new_pid
            ));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ambit restart: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StopComponent {
    Control,
    Agent,
    Ztunnel,
}

#[derive(Debug, clap::Args)]
pub struct StopArgs {
    #[command(flatten)]
    run: RunDirArgs,
    /// Which component.
    #[arg(value_enum)]
    component: StopComponent,
    /// The node (for `agent` and `ztunnel`).
    node: Option<String>,
    /// How long it stays stopped before `ambit up` starts it again (at most a day).
    #[arg(long = "for", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(..=86_400))]
    seconds: u64,
}

/// `ambit stop`: the orchestrator stops the component and its supervisor starts it again.
pub fn stop(args: StopArgs) -> ExitCode {
    let component = match args.component {
        StopComponent::Control => "control",
        StopComponent::Agent => "agent",
        StopComponent::Ztunnel => "ztunnel",
    };
    if matches!(args.component, StopComponent::Control) != args.node.is_none() {
        eprintln!("ambit stop: `control` takes no node; `agent` and `ztunnel` need one");
        return ExitCode::FAILURE;
    }
    let mut req = ambit_mesh::api::Request::new(ambit_mesh::api::Op::Stop);
    req.component = Some(component.to_owned());
    req.node = args.node;
    req.seconds = Some(args.seconds);
    match ambit_mesh::api::request(&RunDir::new(&args.run.run_dir), &req) {
        Ok(resp) => answered(&resp, "ambit stop"),
        Err(e) => {
            eprintln!("ambit stop: {e}");
            ExitCode::FAILURE
        }
    }
}
