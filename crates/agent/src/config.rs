//! [`AgentConfig`]: the node agent's typed configuration, built from upstream's environment
//! variable names (`spec/cni.md` §6.4) by [`AgentConfig::from_vars`], which reports every
//! bad variable at once. The library never reads the environment itself.
//!
//! ambit additions (no upstream twin): `AMBIT_HOST_PREFIX` (where the host filesystem is
//! mounted; upstream hard-codes `/host`, ours defaults to none so the agent also runs
//! directly on a host), `AMBIT_HOST_NETNS` (explicit host netns path),
//! `AMBIT_HEALTH_ADDR`, `AMBIT_METRICS_ADDR` (override `MONITORING_PORT`),
//! `AMBIT_VERIFY_INTERVAL` (verification period, e.g. `10s`, `500ms`; `0` disables the
//! timer), `AMBIT_KUBELET_UID` (the nft host rule's `skuid`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ambit_redirect::consts::{DEFAULT_PROBE_SNAT_V4, DEFAULT_PROBE_SNAT_V6};

use crate::enrol::{Enablement, parse_selectors};
use crate::zds::ZdsConfig;

/// One bad variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {reason}")]
pub struct ConfigError {
    /// Variable name.
    pub var: String,
    /// Its value.
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

/// Everything the agent needs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Enrolment predicate (`AMBIENT_ENABLEMENT_SELECTOR`, `EXCLUDE_NAMESPACES`,
    /// `SYSTEM_NAMESPACE`).
    pub enablement: Enablement,
    /// `AMBIENT_DNS_CAPTURE` (default false).
    pub dns_capture: bool,
    /// `AMBIENT_IPV6` (default false).
    pub ipv6: bool,
    /// `AMBIENT_RECONCILE_POD_RULES_ON_STARTUP` (default false); also enables the iptables
    /// reconcile-on-delta behaviour.
    pub reconcile: bool,
    /// `NATIVE_NFTABLES` (default false).
    pub native_nftables: bool,
    /// `AMBIENT_DISABLE_SAFE_UPGRADE` (default false): always clean up on shutdown (§1.10).
    pub disable_safe_upgrade: bool,
    /// `NODE_NAME`: pods of other nodes are ignored (empty = accept all).
    pub node_name: String,
    /// `POD_NAMESPACE`.
    pub pod_namespace: String,
    /// `HOST_PROBE_SNAT_IP`.
    pub probe_snat_v4: Ipv4Addr,
    /// `HOST_PROBE_SNAT_IPV6`.
    pub probe_snat_v6: Ipv6Addr,
    /// `ZTUNNEL_UDS_ADDRESS`.
    pub zds_socket: PathBuf,
    /// `CNI_AGENT_RUN_DIR` (holds `pluginevent.sock`).
    pub run_dir: PathBuf,
    /// `MOUNTED_CNI_NET_DIR`.
    pub cni_net_dir: PathBuf,
    /// `AMBIT_HOST_PREFIX`: prefix for netns paths from the plugin (upstream: `/host`).
    pub host_prefix: PathBuf,
    /// Host netns for host rules and the probe set (`None`: the agent's own netns).
    pub host_netns: Option<PathBuf>,
    /// Health server (`/healthz`, `/readyz`).
    pub health_addr: SocketAddr,
    /// Metrics server (`/metrics`).
    pub metrics_addr: SocketAddr,
    /// Verification period (`None`: only on ztunnel (re)connects).
    pub verify_interval: Option<Duration>,
    /// Kubelet UID for the nft host rule.
    pub kubelet_uid: u32,
    /// ZDS timeouts and limits.
    pub zds: ZdsConfig,
}

/// Go `strconv.ParseBool`.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// `10s`, `500ms`, `1m`, or plain seconds.
fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

struct Vars<'a> {
    vars: &'a [(String, String)],
    errors: Vec<ConfigError>,
}

impl Vars<'_> {
    fn raw(&self, name: &str) -> Option<&str> {
        // Last assignment wins, as in a process environment built by appending.
        self.vars
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    fn string(&self, name: &str, default: &str) -> String {
        self.raw(name).unwrap_or(default).to_owned()
    }

    fn parsed<T>(&mut self, name: &str, default: T, parse: impl Fn(&str) -> Option<T>) -> T {
        match self.raw(name) {
            None => default,
            Some(v) => match parse(v) {
                Some(t) => t,
                None => {
                    self.errors.push(ConfigError {
                        var: name.into(),
                        value: v.into(),
                        reason: "invalid value".into(),
                    });
                    default
                }
            },
        }
    }

    fn bool(&mut self, name: &str, default: bool) -> bool {
        self.parsed(name, default, parse_bool)
    }
}

impl AgentConfig {
    /// Builds the config from `KEY=VALUE` pairs (normally the process environment).
    pub fn from_vars(vars: &[(String, String)]) -> Result<Self, Vec<ConfigError>> {
        let mut v = Vars {
            vars,
            errors: Vec::new(),
        };
        let selectors_text = v.string("AMBIENT_ENABLEMENT_SELECTOR", "");
        let selectors = match parse_selectors(&selectors_text) {
            Ok(s) => s,
            Err(reason) => {
                v.errors.push(ConfigError {
                    var: "AMBIENT_ENABLEMENT_SELECTOR".into(),
                    value: selectors_text,
                    reason,
                });
                Vec::new()
            }
        };
        let exclude_namespaces = v
            .string("EXCLUDE_NAMESPACES", "")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let host_prefix = PathBuf::from(v.string("AMBIT_HOST_PREFIX", ""));
        let switch_to_host = v.bool("ALLOW_SWITCH_TO_HOST_NS", false);
        let host_netns = match v.raw("AMBIT_HOST_NETNS") {
            Some(p) => Some(PathBuf::from(p)),
            None if switch_to_host => Some(join_prefix(&host_prefix, "/proc/1/ns/net")),
            None => None,
        };
        let monitoring_port = v.parsed("MONITORING_PORT", 15014u16, |s| s.parse().ok());
        let metrics_default = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), monitoring_port);
        let cfg = Self {
            enablement: Enablement {
                selectors,
                exclude_namespaces,
                system_namespace: v.string("SYSTEM_NAMESPACE", "istio-system"),
            },
            dns_capture: v.bool("AMBIENT_DNS_CAPTURE", false),
            ipv6: v.bool("AMBIENT_IPV6", false),
            reconcile: v.bool("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", false),
            native_nftables: v.bool("NATIVE_NFTABLES", false),
            disable_safe_upgrade: v.bool("AMBIENT_DISABLE_SAFE_UPGRADE", false),
            node_name: v.string("NODE_NAME", ""),
            pod_namespace: v.string("POD_NAMESPACE", "istio-system"),
            probe_snat_v4: v.parsed("HOST_PROBE_SNAT_IP", DEFAULT_PROBE_SNAT_V4, |s| {
                s.parse().ok()
            }),
            probe_snat_v6: v.parsed("HOST_PROBE_SNAT_IPV6", DEFAULT_PROBE_SNAT_V6, |s| {
                s.parse().ok()
            }),
            zds_socket: v
                .string("ZTUNNEL_UDS_ADDRESS", "/var/run/ztunnel/ztunnel.sock")
                .into(),
            run_dir: v.string("CNI_AGENT_RUN_DIR", "/var/run/istio-cni").into(),
            cni_net_dir: v
                .string("MOUNTED_CNI_NET_DIR", "/host/etc/cni/net.d")
                .into(),
            host_prefix,
            host_netns,
            health_addr: v.parsed(
                "AMBIT_HEALTH_ADDR",
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 8000),
                |s| s.parse().ok(),
            ),
            metrics_addr: v.parsed("AMBIT_METRICS_ADDR", metrics_default, |s| s.parse().ok()),
            verify_interval: v.parsed(
                "AMBIT_VERIFY_INTERVAL",
                Some(Duration::from_secs(10)),
                |s| parse_duration(s).map(|d| (!d.is_zero()).then_some(d)),
            ),
            kubelet_uid: v.parsed("AMBIT_KUBELET_UID", 0u32, |s| s.parse().ok()),
            zds: ZdsConfig::default(),
        };
        if v.errors.is_empty() {
            Ok(cfg)
        } else {
            Err(v.errors)
        }
    }

    /// The netns path to open for a plugin-reported `Netns` (prefix applied).
    pub fn netns_path(&self, netns: &str) -> PathBuf {
        join_prefix(&self.host_prefix, netns)
    }
}

fn join_prefix(prefix: &std::path::Path, path: &str) -> PathBuf {
    if prefix.as_os_str().is_empty() {
        PathBuf::from(path)
    } else {
        prefix.join(path.trim_start_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults() {
        let c = AgentConfig::from_vars(&[]).unwrap();
        assert_eq!(c.zds_socket, PathBuf::from("/var/run/ztunnel/ztunnel.sock"));
        assert_eq!(c.run_dir, PathBuf::from("/var/run/istio-cni"));
        assert_eq!(c.metrics_addr.port(), 15014);
        assert_eq!(c.health_addr.port(), 8000);
        assert_eq!(c.enablement.system_namespace, "istio-system");
        assert_eq!(c.enablement.selectors.len(), 2);
        assert!(!c.dns_capture && !c.ipv6 && !c.native_nftables);
        assert_eq!(c.host_netns, None);
        assert_eq!(c.verify_interval, Some(Duration::from_secs(10)));
        assert_eq!(
            c.netns_path("/var/run/netns/x"),
            PathBuf::from("/var/run/netns/x")
        );
    }

    #[test]
    fn values() {
        let c = AgentConfig::from_vars(&vars(&[
            ("AMBIENT_DNS_CAPTURE", "True"),
            ("AMBIENT_IPV6", "1"),
            ("EXCLUDE_NAMESPACES", "kube-system, other"),
            ("ALLOW_SWITCH_TO_HOST_NS", "true"),
            ("AMBIT_HOST_PREFIX", "/host"),
            ("MONITORING_PORT", "9000"),
            ("AMBIT_VERIFY_INTERVAL", "250ms"),
        ]))
        .unwrap();
        assert!(c.dns_capture && c.ipv6);
        assert_eq!(
            c.enablement.exclude_namespaces,
            vec!["kube-system", "other"]
        );
        assert_eq!(c.host_netns, Some(PathBuf::from("/host/proc/1/ns/net")));
        assert_eq!(c.metrics_addr.port(), 9000);
        assert_eq!(c.verify_interval, Some(Duration::from_millis(250)));
        assert_eq!(
            c.netns_path("/var/run/netns/x"),
            PathBuf::from("/host/var/run/netns/x")
        );
    }

    #[test]
    fn every_error_reported() {
        let errs = AgentConfig::from_vars(&vars(&[
            ("AMBIENT_IPV6", "yes"),
            ("HOST_PROBE_SNAT_IP", "nope"),
            ("MONITORING_PORT", "70000"),
            (
                "AMBIENT_ENABLEMENT_SELECTOR",
                "- podSelector: {matchLabels: 3}",
            ),
            ("AMBIT_VERIFY_INTERVAL", "10 parsecs"),
        ]))
        .unwrap_err();
        let mut names: Vec<&str> = errs.iter().map(|e| e.var.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            vec![
                "AMBIENT_ENABLEMENT_SELECTOR",
                "AMBIENT_IPV6",
                "AMBIT_VERIFY_INTERVAL",
                "HOST_PROBE_SNAT_IP",
                "MONITORING_PORT",
            ]
        );
    }
}
