//! `install-cni` (a link to `ambit`) and `ambit install-cni`: the CNI node agent as upstream's
//! istio-cni chart runs it — upstream's defaults for the container layout and upstream's
//! command-line flags — so the chart's DaemonSet works with ambit's image unchanged.
//!
//! Defaults: the host filesystem is mounted at `/host` (`AMBIT_HOST_PREFIX`, unless set), so
//! the plugin goes to `/host/opt/cni/bin`, the CNI config to `MOUNTED_CNI_NET_DIR`
//! (`/host/etc/cni/net.d`), pod network namespaces are opened under `/host`, `/host/proc` is
//! scanned after a restart and `ALLOW_SWITCH_TO_HOST_NS=true` means `/host/proc/1/ns/net`.
//! (`ambit cni-agent` defaults to no prefix and writes nothing it was not told to.)
//!
//! Flags: every flag upstream's `install-cni` registers (`cni/pkg/cmd/root.go`), as
//! `--name=value`, `--name value` or a bare `--name` for booleans; like upstream (viper), a
//! flag given on the command line wins over the environment variable of the same name
//! (upper case, `-` → `_`), which wins over the default. Of upstream's logging flags,
//! `--log_output_level` and `--log_as_json` take effect; the other logging and ControlZ flags
//! are accepted and ignored (logged). Anything else is refused with the flag named.

use std::process::ExitCode;

/// Upstream's flags: name and whether it is a boolean (a bare `--name` means true).
const FLAGS: [(&str, bool); 29] = [
    ("cni-conf-name", false),
    ("chained-cni-plugin", true),
    ("cni-network-config", false),
    ("istio-owned-cni-config-filename", false),
    ("istio-owned-cni-config", true),
    ("log-level", false),
    ("mounted-cni-net-dir", false),
    ("cni-agent-run-dir", false),
    ("cni-network-config-file", false),
    ("kubeconfig-mode", false),
    ("cni-conf-group-read", true),
    ("kube-ca-file", false),
    ("skip-tls-verify", true),
    ("monitoring-port", false),
    ("ztunnel-uds-address", false),
    ("ambient-enabled", true),
    ("enable-ambient-detection-retry", true),
    ("repair-enabled", true),
    ("repair-delete-pods", true),
    ("repair-label-pods", true),
    ("repair-broken-pod-label-key", false),
    ("repair-broken-pod-label-value", false),
    ("repair-node-name", false),
    ("repair-sidecar-annotation", false),
    ("repair-init-container-name", false),
    ("repair-init-container-termination-message", false),
    ("repair-init-container-exit-code", false),
    ("repair-label-selectors", false),
    ("repair-field-selectors", false),
];

/// Upstream's logging and ControlZ flags that ambit accepts without acting on them.
const IGNORED: [(&str, bool); 9] = [
    ("log_caller", false),
    ("log_stacktrace_level", false),
    ("log_target", false),
    ("log_rotate", false),
    ("log_rotate_max_age", false),
    ("log_rotate_max_size", false),
    ("log_rotate_max_backups", false),
    ("ctrlz_port", false),
    ("ctrlz_address", false),
];

/// What the agent's tracing target is called in upstream's `--log_output_level` scopes.
const AGENT_SCOPE: &str = "cni-agent";
const PLUGIN_SCOPE: &str = "cni-plugin";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Upstream install-cni flags (`--mounted-cni-net-dir=…`, `--log_output_level=…`, …).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "FLAGS"
    )]
    flags: Vec<String>,
}

/// What the command line said.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// Environment-style assignments from flags, in order (they override the environment).
    pub vars: Vec<(String, String)>,
    /// The tracing filter from `--log_output_level` (`None`: not given).
    pub log_filter: Option<String>,
    /// `--log_as_json`.
    pub log_json: bool,
    /// Flags accepted but without effect, for the log.
    pub ignored: Vec<String>,
}

/// Parses upstream's flags; every bad one is reported.
pub fn parse_flags(args: &[String]) -> Result<Flags, Vec<String>> {
    let mut out = Flags::default();
    let mut errors = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(body) = arg.strip_prefix("--") else {
            errors.push(format!(
                "unexpected argument {arg:?} (install-cni takes only flags)"
            ));
            continue;
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let boolean = FLAGS
            .iter()
            .chain(IGNORED.iter())
            .chain([("log_output_level", false), ("log_as_json", true)].iter())
            .find(|(n, _)| *n == name)
            .map(|(_, b)| *b);
        let Some(boolean) = boolean else {
            errors.push(format!("unknown flag --{name}"));
            continue;
        };
        let value = match (inline, boolean) {
            (Some(v), true) => match ambit_contract::values::parse_bool(&v) {
                Ok(b) => b.to_string(),
                Err(_) => {
                    errors.push(format!("--{name}={v}: not a boolean"));
                    continue;
                }
            },
            (Some(v), false) => v,
            (None, true) => "true".to_string(),
            (None, false) => match args.get(i) {
                Some(v) => {
                    i += 1;
                    v.clone()
                }
                None => {
                    errors.push(format!("--{name} needs a value"));
                    continue;
                }
            },
        };
        match name {
            "log_output_level" => match log_filter(&value) {
                Ok((filter, plugin)) => {
                    out.log_filter = Some(filter);
                    if let Some(level) = plugin {
                        out.vars.push(("LOG_LEVEL".into(), level));
                    }
                }
                Err(e) => errors.push(format!("--log_output_level={value}: {e}")),
            },
            "log_as_json" => out.log_json = value == "true",
            _ if IGNORED.iter().any(|(n, _)| *n == name) => out.ignored.push(format!("--{name}")),
            _ => out
                .vars
                .push((name.to_uppercase().replace('-', "_"), value)),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Upstream's `--log_output_level` (`LEVEL` or `scope:level,…`; levels none, error, warn,
/// info, debug) → a tracing filter for the agent, and the `cni-plugin` scope's level (which
/// upstream writes into the plugin's config).
fn log_filter(spec: &str) -> Result<(String, Option<String>), String> {
    let level = |l: &str| -> Result<&'static str, String> {
        Ok(match l {
            "none" => "off",
            "fatal" | "error" => "error",
            "warn" => "warn",
            "info" => "info",
            "debug" => "debug",
            other => return Err(format!("unknown level {other:?}")),
        })
    };
    let mut default = "info";
    let mut directives = Vec::new();
    let mut plugin = None;
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once(':') {
            None => default = level(part)?,
            Some(("default", l)) => default = level(l)?,
            Some((AGENT_SCOPE, l)) => directives.push(format!("ambit_agent={}", level(l)?)),
            Some((PLUGIN_SCOPE, l)) => {
                level(l)?;
                plugin = Some(l.to_string());
            }
            // Upstream scopes with no ambit twin (ctrlz, repair, …): nothing to filter.
            Some((_, l)) => {
                level(l)?;
            }
        }
    }
    let mut filter = default.to_string();
    for d in directives {
        filter.push(',');
        filter.push_str(&d);
    }
    Ok((filter, plugin))
}

/// The agent's variables: upstream's layout defaults, then the environment, then the flags
/// (later assignments win).
pub fn agent_vars(env: &[(String, String)], flags: &Flags) -> Vec<(String, String)> {
    let mut vars = vec![("AMBIT_HOST_PREFIX".to_string(), "/host".to_string())];
    vars.extend(env.iter().cloned());
    vars.extend(flags.vars.iter().cloned());
    vars
}

pub fn main(args: Args) -> ExitCode {
    let flags = match parse_flags(&args.flags) {
        Ok(f) => f,
        Err(errors) => {
            eprintln!("install-cni: invalid flags ({} problems):", errors.len());
            for e in errors {
                eprintln!("  - {e}");
            }
            return ExitCode::from(2);
        }
    };
    let filter = flags
        .log_filter
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok().filter(|f| !f.is_empty()))
        .unwrap_or_else(|| "info".into());
    crate::init_logging_with(&filter, flags.log_json);
    for f in &flags.ignored {
        tracing::info!(flag = %f, "upstream flag accepted and ignored");
    }
    let env: Vec<(String, String)> = std::env::vars().collect();
    crate::agent::run(None, None, agent_vars(&env, &flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn upstream_flags() {
        let f = parse_flags(&s(&[
            "--log_output_level=default:warn,cni-agent:debug,cni-plugin:info",
            "--log_as_json",
            "--mounted-cni-net-dir",
            "/n/net.d",
            "--chained-cni-plugin=false",
            "--ambient-enabled",
            "--ctrlz_port=9876",
        ]))
        .expect("valid");
        assert_eq!(f.log_filter.as_deref(), Some("warn,ambit_agent=debug"));
        assert!(f.log_json);
        assert_eq!(
            f.vars,
            vec![
                ("LOG_LEVEL".to_string(), "info".to_string()),
                ("MOUNTED_CNI_NET_DIR".into(), "/n/net.d".into()),
                ("CHAINED_CNI_PLUGIN".into(), "false".into()),
                ("AMBIENT_ENABLED".into(), "true".into()),
            ]
        );
        assert_eq!(f.ignored, vec!["--ctrlz_port"]);
        assert_eq!(parse_flags(&[]), Ok(Flags::default()));
    }

    #[test]
    fn bad_flags_are_all_named() {
        let errs = parse_flags(&s(&[
            "--no-such-flag=1",
            "positional",
            "--skip-tls-verify=maybe",
            "--log_output_level=cni-agent:loud",
            "--cni-conf-name",
        ]))
        .expect_err("refused");
        assert_eq!(errs.len(), 5, "{errs:?}");
        for (err, needle) in errs.iter().zip([
            "--no-such-flag",
            "positional",
            "maybe",
            "loud",
            "--cni-conf-name needs a value",
        ]) {
            assert!(err.contains(needle), "{err:?} should name {needle}");
        }
    }

    #[test]
    fn precedence_defaults_env_flags() {
        let env = vec![
            ("AMBIT_HOST_PREFIX".to_string(), "/custom".to_string()),
            ("MOUNTED_CNI_NET_DIR".into(), "/from/env".into()),
        ];
        let flags = parse_flags(&s(&["--mounted-cni-net-dir=/from/flag"])).expect("valid");
        let vars = agent_vars(&env, &flags);
        let last = |k: &str| {
            vars.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(last("AMBIT_HOST_PREFIX"), Some("/custom"));
        assert_eq!(last("MOUNTED_CNI_NET_DIR"), Some("/from/flag"));
        let cfg = ambit_agent::AgentConfig::from_vars(&agent_vars(&[], &Flags::default()))
            .expect("defaults are valid");
        assert_eq!(
            cfg.install.conf_dir.as_deref(),
            Some(std::path::Path::new("/host/etc/cni/net.d"))
        );
        assert_eq!(
            cfg.install.bin_dir.as_deref(),
            Some(std::path::Path::new("/host/opt/cni/bin"))
        );
    }
}
