//! `ambit wait-enrolled`: the init container that holds a new pod until the node agent has
//! captured it (`ambit_agent::hold`; docs/windows.md). It only ever exits 0 once the pod's
//! downward-API annotations say `ambient.istio.io/redirection: enabled`; an unreadable or
//! half-written file is read again, and a timeout is a failure (kubelet restarts the init
//! container, so the pod stays held).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ambit_agent::hold::{self, Enrolment};

/// Arguments of `ambit wait-enrolled`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The downward-API file of the pod's annotations (`fieldRef: metadata.annotations`).
    #[arg(long, default_value = "/etc/podinfo/annotations")]
    annotations: PathBuf,
    /// How often to read it.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    poll: Duration,
    /// Give up (exit 1) after this long; 0 waits forever.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    timeout: Duration,
}

fn parse_duration(v: &str) -> Result<Duration, String> {
    ambit_contract::values::parse_duration(v).map_err(|e| e.to_string())
}

pub fn main(args: Args) -> ExitCode {
    crate::init_logging();
    let start = Instant::now();
    let mut last: Option<String> = None;
    loop {
        let state = match std::fs::read_to_string(&args.annotations) {
            Err(e) => format!("cannot read {}: {e}", args.annotations.display()),
            Ok(text) => match hold::parse_annotations(&text) {
                Err(e) => format!("{}: {e}", args.annotations.display()),
                Ok(annotations) => match hold::enrolment(&annotations) {
                    Enrolment::Enrolled => {
                        tracing::info!("pod enrolled in the mesh; starting the application");
                        return ExitCode::SUCCESS;
                    }
                    Enrolment::Partial => "partially enrolled: waiting for ztunnel".into(),
                    Enrolment::NotYet => "not enrolled yet".into(),
                },
            },
        };
        if last.as_deref() != Some(state.as_str()) {
            tracing::info!(state = %state, "holding the pod until it is captured");
            last = Some(state);
        }
        if !args.timeout.is_zero() && start.elapsed() >= args.timeout {
            tracing::error!(timeout = ?args.timeout, "the pod was not enrolled in time");
            return ExitCode::FAILURE;
        }
        std::thread::sleep(args.poll);
    }
}
