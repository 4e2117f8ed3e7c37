//! The Windows node agent's configuration from upstream's environment names where they
//! exist (`spec/cni.md` §6.4, `spec/windows.md` §1.1, §2.1), every bad variable reported at
//! once. Platform-neutral, so the rules are tested on Linux; the CLI hands it the process
//! environment (the library never reads it).
//!
//! The health and metrics servers are the Linux agent's (`crate::config`):
//! `AMBIT_HEALTH_ADDR` (default `0.0.0.0:8000`), `AMBIT_METRICS_ADDR` (default
//! `0.0.0.0:<MONITORING_PORT>`, `MONITORING_PORT` default 15014). All interfaces, as on
//! Linux: kubelet probes a host-network pod at the node's IP, and Prometheus scrapes it there.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_contract::ports;
use ambit_contract::values::parse_duration;
use ambit_contract::windows::{CRI_PIPE, ZDS_PIPE};
use ambit_redirect::hns::WfpPolicyConfig;

use crate::enrol::{Enablement, parse_selectors};

/// The verification period when `AMBIT_VERIFY_INTERVAL` is unset (the Linux agent's).
pub const DEFAULT_VERIFY_INTERVAL: Duration = Duration::from_secs(10);

/// Where a HostProcess container's projected service-account files are, under its sandbox
/// mount point (`CONTAINER_SANDBOX_MOUNT_POINT`, `spec/windows.md` §1.1).
pub const SERVICE_ACCOUNT_SUBDIR: &str = "var/run/secrets/kubernetes.io/serviceaccount";

/// The Windows agent's settings.
#[derive(Debug, Clone)]
pub struct WindowsAgentConfig {
    /// `NODE_NAME`: whose pods are watched (required).
    pub node_name: String,
    /// `ZTUNNEL_UDS_ADDRESS`: the ZDS pipe (default `\\.\pipe\istio-zds`).
    pub zds_pipe: PathBuf,
    /// `AMBIT_CRI_ENDPOINT`: the runtime's CRI pipe (default containerd's), with or without
    /// upstream's `npipe://` prefix.
    pub cri_endpoint: PathBuf,
    /// `HOST_PROBE_SNAT_IP` and ztunnel's user: the policies' exemptions.
    pub policy: WfpPolicyConfig,
    /// `AMBIENT_ENABLEMENT_SELECTOR`, `EXCLUDE_NAMESPACES`, `SYSTEM_NAMESPACE`.
    pub enablement: Enablement,
    /// The in-cluster service-account directory (under `CONTAINER_SANDBOX_MOUNT_POINT` in a
    /// HostProcess container).
    pub service_account_dir: PathBuf,
    /// `AMBIT_VERIFY_INTERVAL` (as on Linux: Go duration or bare seconds, default 10 s, `0`
    /// = `None`, no verification passes): how often every enrolled pod's endpoints and
    /// policies are re-checked and repaired.
    pub verify_interval: Option<Duration>,
    /// `AMBIT_HEALTH_ADDR`: `/healthz`, `/readyz`.
    pub health_addr: SocketAddr,
    /// `AMBIT_METRICS_ADDR` (or all interfaces on `MONITORING_PORT`): `/metrics`.
    pub metrics_addr: SocketAddr,
}

/// One bad variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {reason}")]
pub struct BadVar {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Every bad variable, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(|e| format!("{e}\n")).collect::<String>())]
pub struct WindowsConfigError(pub Vec<BadVar>);

impl WindowsAgentConfig {
    /// From `vars` (the last assignment of a name wins).
    pub fn from_vars(vars: &[(String, String)]) -> Result<Self, WindowsConfigError> {
        let get = |name: &str| {
            vars.iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut bad = Vec::new();
        let mut fail = |var: &'static str, value: &str, reason: String| {
            bad.push(BadVar {
                var,
                value: value.to_owned(),
                reason,
            })
        };
        let node_name = get("NODE_NAME").unwrap_or_default();
        if node_name.is_empty() {
            fail(
                "NODE_NAME",
                "",
                "must be set: the agent watches this node's pods".into(),
            );
        }
        let mut policy = WfpPolicyConfig::default();
        if let Some(v) = get("HOST_PROBE_SNAT_IP") {
            match v.parse::<Ipv4Addr>() {
                Ok(ip) => policy.probe_snat_v4 = ip,
                Err(e) => fail(
                    "HOST_PROBE_SNAT_IP",
                    &v,
                    format!("not an IPv4 address: {e}"),
                ),
            }
        }
        let selectors_text = get("AMBIENT_ENABLEMENT_SELECTOR").unwrap_or_default();
        let selectors = parse_selectors(&selectors_text).unwrap_or_else(|reason| {
            fail("AMBIENT_ENABLEMENT_SELECTOR", &selectors_text, reason);
            Vec::new()
        });
        let exclude_namespaces = (get("EXCLUDE_NAMESPACES").unwrap_or_default())
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let cri = get("AMBIT_CRI_ENDPOINT").unwrap_or_else(|| CRI_PIPE.to_owned());
        let cri_endpoint = match cri.strip_prefix("npipe://") {
            // Upstream's form: npipe://./pipe/NAME.
            Some(rest) => PathBuf::from(format!(r"\\{}", rest.replace('/', r"\"))),
            None => PathBuf::from(&cri),
        };
        if !cri_endpoint.to_string_lossy().starts_with(r"\\.\pipe\") {
            fail(
                "AMBIT_CRI_ENDPOINT",
                &cri,
                r"not a local named pipe (\\.\pipe\NAME or npipe://./pipe/NAME)".into(),
            );
        }
        let service_account_dir = match get("CONTAINER_SANDBOX_MOUNT_POINT") {
            Some(root) => Path::new(&root).join(SERVICE_ACCOUNT_SUBDIR),
            None => PathBuf::from(ambit_kubeapi::SERVICE_ACCOUNT_DIR),
        };
        let verify_interval = match get("AMBIT_VERIFY_INTERVAL") {
            None => Some(DEFAULT_VERIFY_INTERVAL),
            Some(v) => match parse_duration(&v) {
                Ok(d) => (!d.is_zero()).then_some(d),
                Err(e) => {
                    fail("AMBIT_VERIFY_INTERVAL", &v, e.to_string());
                    None
                }
            },
        };
        let all = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
        let mut parsed = |var: &'static str, default: SocketAddr, port_only: bool| {
            let Some(v) = get(var) else {
                return default;
            };
            let value = if port_only {
                v.parse()
                    .map(all)
                    .map_err(|_| "expected a port number (0-65535)")
            } else {
                v.parse().map_err(|_| "expected IP:port")
            };
            value.unwrap_or_else(|reason| {
                fail(var, &v, reason.into());
                default
            })
        };
        let health_addr = parsed("AMBIT_HEALTH_ADDR", all(ports::AGENT_HEALTH), false);
        let monitoring = parsed("MONITORING_PORT", all(ports::AGENT_METRICS), true);
        let metrics_addr = parsed("AMBIT_METRICS_ADDR", monitoring, false);
        let cfg = Self {
            node_name,
            zds_pipe: PathBuf::from(get("ZTUNNEL_UDS_ADDRESS").unwrap_or_else(|| ZDS_PIPE.into())),
            cri_endpoint,
            policy,
            enablement: Enablement {
                selectors,
                exclude_namespaces,
                system_namespace: get("SYSTEM_NAMESPACE").unwrap_or_else(|| "istio-system".into()),
            },
            service_account_dir,
            verify_interval,
            health_addr,
            metrics_addr,
        };
        if bad.is_empty() {
            Ok(cfg)
        } else {
            Err(WindowsConfigError(bad))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_upstreams_pipes_and_the_sandbox_service_account() {
        let cfg = WindowsAgentConfig::from_vars(&vars(&[
            ("NODE_NAME", "win-1"),
            ("CONTAINER_SANDBOX_MOUNT_POINT", r"C:\C\abc"),
        ]))
        .unwrap();
        assert_eq!(cfg.node_name, "win-1");
        assert_eq!(cfg.zds_pipe, Path::new(ZDS_PIPE));
        assert_eq!(cfg.cri_endpoint, Path::new(CRI_PIPE));
        assert_eq!(cfg.policy, WfpPolicyConfig::default());
        assert_eq!(cfg.enablement.system_namespace, "istio-system");
        assert!(!cfg.enablement.selectors.is_empty());
        assert_eq!(cfg.verify_interval, Some(Duration::from_secs(10)));
        assert_eq!(cfg.health_addr, "0.0.0.0:8000".parse().unwrap());
        assert_eq!(cfg.metrics_addr, "0.0.0.0:15014".parse().unwrap());
        assert_eq!(
            cfg.service_account_dir,
            Path::new(r"C:\C\abc").join(SERVICE_ACCOUNT_SUBDIR)
        );
    }

    #[test]
    fn settings_are_read_and_the_npipe_form_is_accepted() {
        let cfg = WindowsAgentConfig::from_vars(&vars(&[
            ("NODE_NAME", "win-1"),
            ("ZTUNNEL_UDS_ADDRESS", r"\\.\pipe\other-zds"),
            ("AMBIT_CRI_ENDPOINT", "npipe://./pipe/containerd-containerd"),
            ("HOST_PROBE_SNAT_IP", "169.254.7.1"),
            ("EXCLUDE_NAMESPACES", "kube-system, other ,"),
            ("SYSTEM_NAMESPACE", "mesh"),
        ]))
        .unwrap();
        assert_eq!(cfg.zds_pipe, Path::new(r"\\.\pipe\other-zds"));
        assert_eq!(cfg.cri_endpoint, Path::new(CRI_PIPE));
        assert_eq!(cfg.policy.probe_snat_v4, Ipv4Addr::new(169, 254, 7, 1));
        assert_eq!(cfg.enablement.exclude_namespaces, ["kube-system", "other"]);
        assert_eq!(cfg.enablement.system_namespace, "mesh");
        assert_eq!(
            cfg.service_account_dir,
            Path::new(ambit_kubeapi::SERVICE_ACCOUNT_DIR)
        );
    }

    #[test]
    fn the_verification_period_is_the_linux_agents_variable() {
        let cases = [
            ("250ms", Some(Duration::from_millis(250))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("7", Some(Duration::from_secs(7))),
            ("0", None),
            ("0s", None),
        ];
        for (value, want) in cases {
            let cfg = WindowsAgentConfig::from_vars(&vars(&[
                ("NODE_NAME", "win-1"),
                ("AMBIT_VERIFY_INTERVAL", value),
            ]))
            .unwrap();
            assert_eq!(cfg.verify_interval, want, "{value}");
        }
    }

    #[test]
    fn the_health_and_metrics_addresses_are_the_linux_agents_variables() {
        // (variables set, health address, metrics address)
        type Case = (
            &'static [(&'static str, &'static str)],
            &'static str,
            &'static str,
        );
        let cases: [Case; 4] = [
            (&[], "0.0.0.0:8000", "0.0.0.0:15014"),
            (
                &[("MONITORING_PORT", "9090")],
                "0.0.0.0:8000",
                "0.0.0.0:9090",
            ),
            (
                &[
                    ("AMBIT_HEALTH_ADDR", "127.0.0.1:18000"),
                    ("AMBIT_METRICS_ADDR", "[::1]:0"),
                    ("MONITORING_PORT", "9090"),
                ],
                "127.0.0.1:18000",
                "[::1]:0",
            ),
            (
                &[("AMBIT_METRICS_ADDR", "10.0.0.1:15014")],
                "0.0.0.0:8000",
                "10.0.0.1:15014",
            ),
        ];
        for (set, health, metrics) in cases {
            let mut v = vec![("NODE_NAME", "win-1")];
            v.extend_from_slice(set);
            let cfg = WindowsAgentConfig::from_vars(&vars(&v)).unwrap();
            assert_eq!(cfg.health_addr, health.parse().unwrap(), "{set:?}");
            assert_eq!(cfg.metrics_addr, metrics.parse().unwrap(), "{set:?}");
        }
    }

    #[test]
    fn every_bad_variable_is_reported_at_once() {
        let err = WindowsAgentConfig::from_vars(&vars(&[
            ("HOST_PROBE_SNAT_IP", "fe80::1"),
            ("AMBIENT_ENABLEMENT_SELECTOR", "[{podSelector: 3}]"),
            ("AMBIT_CRI_ENDPOINT", "/run/containerd/containerd.sock"),
            ("AMBIT_VERIFY_INTERVAL", "10 parsecs"),
            ("AMBIT_HEALTH_ADDR", "localhost"),
            ("MONITORING_PORT", "70000"),
            ("AMBIT_METRICS_ADDR", ":15014"),
        ]))
        .unwrap_err();
        let vars: Vec<&str> = err.0.iter().map(|b| b.var).collect();
        assert_eq!(
            vars,
            [
                "NODE_NAME",
                "HOST_PROBE_SNAT_IP",
                "AMBIENT_ENABLEMENT_SELECTOR",
                "AMBIT_CRI_ENDPOINT",
                "AMBIT_VERIFY_INTERVAL",
                "AMBIT_HEALTH_ADDR",
                "MONITORING_PORT",
                "AMBIT_METRICS_ADDR",
            ]
        );
        assert_eq!(err.to_string().lines().count(), 8, "{err}");
    }
}
