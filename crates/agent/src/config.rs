//! [`AgentConfig`]: the node agent's typed configuration, built from upstream's environment
//! variable names (`spec/cni.md` §6.4) by [`AgentConfig::from_vars`] through the node
//! contract's one reader ([`ambit_contract::env::Env`]), which reports every bad variable at
//! once, naming its value and what was expected. Booleans are Go's `ParseBool`, durations Go's
//! `ParseDuration` plus bare seconds. The library never reads the environment itself.
//!
//! ambit additions (no upstream twin): `AMBIT_HOST_PREFIX` (where the host filesystem is
//! mounted; upstream hard-codes `/host`, ours defaults to none so the agent also runs
//! directly on a host), `AMBIT_HOST_NETNS` (explicit host netns path),
//! `AMBIT_HEALTH_ADDR`, `AMBIT_METRICS_ADDR` (override `MONITORING_PORT`),
//! `AMBIT_VERIFY_INTERVAL` (verification period, e.g. `10s`, `500ms`; `0` disables the
//! timer), `AMBIT_WATCH_RULES` (true: re-verify a pod as soon as its nf_tables ruleset
//! changes; false leaves only the period), `AMBIT_RULE_GUARD` (true: every enrolled pod gets
//! the fail-closed guard table, `ambit_redirect::Guard`), `AMBIT_KUBELET_UID` (the nft host
//! rule's `skuid`).
//!
//! Installer ([`crate::installer`]; upstream names unless `AMBIT_`): `MOUNTED_CNI_NET_DIR`
//! (default `<AMBIT_HOST_PREFIX>/etc/cni/net.d`, none without a prefix: step skipped),
//! `CNI_CONF_NAME`, `CHAINED_CNI_PLUGIN` (true), `ISTIO_OWNED_CNI_CONFIG` (false, only with
//! chained), `ISTIO_OWNED_CNI_CONFIG_FILENAME` (`02-istio-cni.conflist`),
//! `CNI_CONF_GROUP_READ` (false), `KUBECONFIG_MODE` (0600, Go integer syntax),
//! `KUBE_CA_FILE`, `SKIP_TLS_VERIFY`, `KUBERNETES_SERVICE_HOST` / `_PORT` / `_PROTOCOL`
//! (kubeconfig only when the host is set), `LOG_LEVEL` (the plugin's level, `warn`),
//! `AMBIENT_ENABLED` (true: ambit's agent is ambient-only), `ENABLE_AMBIENT_DETECTION_RETRY`,
//! `AMBIT_CNI_BIN_DIR` (default `<AMBIT_HOST_PREFIX>/opt/cni/bin`, none without a prefix:
//! step skipped), `AMBIT_INSTALL_CHECK_INTERVAL` (1 s).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_contract::env::Env;
use ambit_contract::ports;
use ambit_contract::values::parse_duration;
use ambit_redirect::consts::{DEFAULT_PROBE_SNAT_V4, DEFAULT_PROBE_SNAT_V6};

use crate::enrol::{Enablement, parse_selectors};
use crate::installer::conflist::{ConfMode, ISTIO_OWNED_CONF_NAME};
use crate::installer::{InstallConfig, KubeApi, SERVICE_ACCOUNT_DIR};
use crate::zds::ZdsConfig;

pub use ambit_contract::env::{EnvError as ConfigError, EnvErrors as ConfigErrors};

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
    /// `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE` (default true): host rules for AWS VPC CNI
    /// branch-ENI pods when the host has `net.ipv4.tcp_early_demux=0` (§3.11).
    pub aws_branch_eni_probe: bool,
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
    /// The CNI installer: conf dir (`MOUNTED_CNI_NET_DIR`), bin dir, kubeconfig, modes.
    pub install: InstallConfig,
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
    /// Re-verify a pod when its namespace's nf_tables ruleset changes (netlink
    /// notifications), not only at the next period.
    pub watch_rules: bool,
    /// Install the fail-closed guard in every enrolled pod (`ambit_redirect::Guard`): TCP
    /// that would leave the pod around ztunnel is dropped even with the rules flushed.
    pub rule_guard: bool,
    /// Kubelet UID for the nft host rule.
    pub kubelet_uid: u32,
    /// ZDS timeouts and limits.
    pub zds: ZdsConfig,
    /// Bounds of the health, metrics, plugin-event and plugin-log servers (ztunnel's
    /// local-endpoint settings; not configurable from the environment).
    pub http: ambit_http::Limits,
}

/// A file name inside a directory (no `/`, not `.`/`..`).
fn file_name(env: &mut Env<'_>, name: &str) -> Option<String> {
    env.parse_opt(name, |v| {
        if v.contains('/') || v == "." || v == ".." {
            Err("must be a file name, not a path")
        } else {
            Ok(v.to_owned())
        }
    })
}

/// Records `expected` against the variable's current value.
fn invalid(env: &mut Env<'_>, name: &str, expected: &str) {
    let value = env.get(name).unwrap_or("");
    env.fail(name, value, expected);
}

/// Go `strconv.ParseInt(s, 0, 0)`: `0x` hex, `0o` or leading `0` octal, else decimal.
fn parse_go_int(s: &str) -> Option<u32> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u32::from_str_radix(h, 16).ok()
    } else if let Some(o) = s.strip_prefix("0o").or_else(|| s.strip_prefix("0O")) {
        u32::from_str_radix(o, 8).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        u32::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

/// The installer's settings (see the module docs for names and defaults).
fn install_config(v: &mut Env<'_>, run_dir: &Path, host_prefix: &Path) -> InstallConfig {
    let under_prefix = |var: Option<&str>, path: &str| match var {
        Some(p) => Some(PathBuf::from(p)),
        None if host_prefix.as_os_str().is_empty() => None,
        None => Some(join_prefix(host_prefix, path)),
    };
    let conf_dir = under_prefix(v.get("MOUNTED_CNI_NET_DIR"), "/etc/cni/net.d");
    let bin_dir = under_prefix(v.get("AMBIT_CNI_BIN_DIR"), "/opt/cni/bin");
    let conf_name = file_name(v, "CNI_CONF_NAME");
    let chained = v.bool("CHAINED_CNI_PLUGIN", true);
    let owned = v.bool("ISTIO_OWNED_CNI_CONFIG", false);
    let owned_name = file_name(v, "ISTIO_OWNED_CNI_CONFIG_FILENAME")
        .unwrap_or_else(|| ISTIO_OWNED_CONF_NAME.to_owned());
    if !owned_name.ends_with(".conflist") {
        invalid(
            v,
            "ISTIO_OWNED_CNI_CONFIG_FILENAME",
            "must end in .conflist",
        );
    }
    let group_read = v.bool("CNI_CONF_GROUP_READ", false);
    // Upstream: the Istio-owned file only exists in chained mode.
    let mode = match (chained, owned) {
        (false, _) => ConfMode::Standalone,
        (true, false) => ConfMode::Chained,
        (true, true) => ConfMode::IstioOwned {
            file_name: owned_name,
            group_read,
        },
    };
    let kubeconfig_mode = v.parse("KUBECONFIG_MODE", 0o600, |s| {
        parse_go_int(s)
            .filter(|m| *m <= 0o7777)
            .ok_or("expected a file mode up to 07777 (Go integer syntax: 0600, 0o600, 384, 0x180)")
    });
    let skip_tls_verify = v.bool("SKIP_TLS_VERIFY", false);
    let kube_api = match v.get("KUBERNETES_SERVICE_HOST") {
        None => None,
        Some(host) => {
            let host = host.to_owned();
            let port = v.string("KUBERNETES_SERVICE_PORT", "");
            if port.is_empty() {
                v.fail(
                    "KUBERNETES_SERVICE_PORT",
                    "",
                    "required when KUBERNETES_SERVICE_HOST is set",
                );
            }
            Some(KubeApi {
                protocol: v.string("KUBERNETES_SERVICE_PROTOCOL", "https"),
                host,
                port,
                service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
                ca_file: v.get("KUBE_CA_FILE").map(PathBuf::from),
                skip_tls_verify,
            })
        }
    };
    let check_interval = v.parse(
        "AMBIT_INSTALL_CHECK_INTERVAL",
        crate::installer::DEFAULT_CHECK_INTERVAL,
        |s| match parse_duration(s) {
            Ok(d) if d.is_zero() => Err("must be longer than zero".to_owned()),
            Ok(d) => Ok(d),
            Err(e) => Err(e.to_string()),
        },
    );
    InstallConfig {
        conf_dir,
        conf_name,
        mode,
        bin_dir,
        binary_source: PathBuf::from("/proc/self/exe"),
        run_dir: run_dir.to_owned(),
        kube_api,
        kubeconfig_mode,
        ambient_enabled: v.bool("AMBIENT_ENABLED", true),
        plugin_log_level: v.string("LOG_LEVEL", "warn"),
        ambient_detection_retry: v.bool("ENABLE_AMBIENT_DETECTION_RETRY", false),
        check_interval,
    }
}

impl AgentConfig {
    /// Builds the config from `KEY=VALUE` pairs (normally the process environment).
    pub fn from_vars(vars: &[(String, String)]) -> Result<Self, ConfigErrors> {
        let mut v = Env::new(vars);
        let selectors_text = v.string("AMBIENT_ENABLEMENT_SELECTOR", "");
        let selectors = match parse_selectors(&selectors_text) {
            Ok(s) => s,
            Err(reason) => {
                v.fail("AMBIENT_ENABLEMENT_SELECTOR", &selectors_text, reason);
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
        let host_netns = match v.get("AMBIT_HOST_NETNS") {
            Some(p) => Some(PathBuf::from(p)),
            None if switch_to_host => Some(join_prefix(&host_prefix, "/proc/1/ns/net")),
            None => None,
        };
        let run_dir = PathBuf::from(v.string("CNI_AGENT_RUN_DIR", "/var/run/istio-cni"));
        let install = install_config(&mut v, &run_dir, &host_prefix);
        let monitoring_port = v.parse("MONITORING_PORT", ports::AGENT_METRICS, port);
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
            aws_branch_eni_probe: v.bool("AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE", true),
            node_name: v.string("NODE_NAME", ""),
            pod_namespace: v.string("POD_NAMESPACE", "istio-system"),
            probe_snat_v4: v.parse("HOST_PROBE_SNAT_IP", DEFAULT_PROBE_SNAT_V4, |s| {
                s.parse().map_err(|_| "expected an IPv4 address")
            }),
            probe_snat_v6: v.parse("HOST_PROBE_SNAT_IPV6", DEFAULT_PROBE_SNAT_V6, |s| {
                s.parse().map_err(|_| "expected an IPv6 address")
            }),
            zds_socket: v
                .string("ZTUNNEL_UDS_ADDRESS", "/var/run/ztunnel/ztunnel.sock")
                .into(),
            run_dir,
            install,
            host_prefix,
            host_netns,
            health_addr: v.parse(
                "AMBIT_HEALTH_ADDR",
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), ports::AGENT_HEALTH),
                socket_addr,
            ),
            metrics_addr: v.parse("AMBIT_METRICS_ADDR", metrics_default, socket_addr),
            verify_interval: v.parse(
                "AMBIT_VERIFY_INTERVAL",
                Some(Duration::from_secs(10)),
                |s| parse_duration(s).map(|d| (!d.is_zero()).then_some(d)),
            ),
            watch_rules: v.bool("AMBIT_WATCH_RULES", true),
            rule_guard: v.bool("AMBIT_RULE_GUARD", true),
            kubelet_uid: v.parse("AMBIT_KUBELET_UID", 0u32, |s| {
                s.parse::<u32>().map_err(|_| "expected a numeric uid")
            }),
            zds: ZdsConfig::default(),
            http: ambit_http::Limits::default(),
        };
        v.finish("agent", cfg)
    }

    /// The netns path to open for a plugin-reported `Netns` (prefix applied).
    pub fn netns_path(&self, netns: &str) -> PathBuf {
        join_prefix(&self.host_prefix, netns)
    }
}

fn port(s: &str) -> Result<u16, &'static str> {
    s.parse().map_err(|_| "expected a port number (0-65535)")
}

fn socket_addr(s: &str) -> Result<SocketAddr, &'static str> {
    s.parse().map_err(|_| "expected IP:port")
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
    fn installer_settings() {
        use crate::installer::conflist::ConfMode;
        struct Case {
            name: &'static str,
            vars: Vec<(&'static str, &'static str)>,
            conf_dir: Option<&'static str>,
            bin_dir: Option<&'static str>,
            mode: ConfMode,
            kubeconfig_mode: u32,
        }
        let owned = |group_read| ConfMode::IstioOwned {
            file_name: "02-istio-cni.conflist".into(),
            group_read,
        };
        let cases = [
            Case {
                name: "defaults: nothing configured, nothing written",
                vars: vec![],
                conf_dir: None,
                bin_dir: None,
                mode: ConfMode::Chained,
                kubeconfig_mode: 0o600,
            },
            Case {
                name: "host prefix gives upstream's mounted paths",
                vars: vec![("AMBIT_HOST_PREFIX", "/host")],
                conf_dir: Some("/host/etc/cni/net.d"),
                bin_dir: Some("/host/opt/cni/bin"),
                mode: ConfMode::Chained,
                kubeconfig_mode: 0o600,
            },
            Case {
                name: "explicit dirs win; octal mode",
                vars: vec![
                    ("AMBIT_HOST_PREFIX", "/host"),
                    ("MOUNTED_CNI_NET_DIR", "/n/net.d"),
                    ("AMBIT_CNI_BIN_DIR", "/n/bin"),
                    ("KUBECONFIG_MODE", "0640"),
                ],
                conf_dir: Some("/n/net.d"),
                bin_dir: Some("/n/bin"),
                mode: ConfMode::Chained,
                kubeconfig_mode: 0o640,
            },
            Case {
                name: "istio-owned, decimal mode",
                vars: vec![
                    ("ISTIO_OWNED_CNI_CONFIG", "true"),
                    ("KUBECONFIG_MODE", "416"),
                ],
                conf_dir: None,
                bin_dir: None,
                mode: owned(false),
                kubeconfig_mode: 0o640,
            },
            Case {
                name: "istio-owned, group read",
                vars: vec![
                    ("ISTIO_OWNED_CNI_CONFIG", "true"),
                    ("CNI_CONF_GROUP_READ", "true"),
                ],
                conf_dir: None,
                bin_dir: None,
                mode: owned(true),
                kubeconfig_mode: 0o600,
            },
            Case {
                name: "standalone ignores istio-owned (upstream)",
                vars: vec![
                    ("CHAINED_CNI_PLUGIN", "false"),
                    ("ISTIO_OWNED_CNI_CONFIG", "true"),
                ],
                conf_dir: None,
                bin_dir: None,
                mode: ConfMode::Standalone,
                kubeconfig_mode: 0o600,
            },
        ];
        for c in cases {
            let i = AgentConfig::from_vars(&vars(&c.vars)).unwrap().install;
            assert_eq!(i.conf_dir, c.conf_dir.map(PathBuf::from), "{}", c.name);
            assert_eq!(i.bin_dir, c.bin_dir.map(PathBuf::from), "{}", c.name);
            assert_eq!(i.mode, c.mode, "{}", c.name);
            assert_eq!(i.kubeconfig_mode, c.kubeconfig_mode, "{}", c.name);
        }

        let d = AgentConfig::from_vars(&vars(&[("CNI_AGENT_RUN_DIR", "/r")]))
            .unwrap()
            .install;
        assert_eq!(
            d.kubeconfig_path(),
            PathBuf::from("/r/istio-cni-kubeconfig")
        );
        assert_eq!(d.kube_api, None);
        assert!(d.ambient_enabled);
        assert_eq!(d.plugin_log_level, "warn");
        assert_eq!(d.check_interval, Duration::from_secs(1));

        let k = AgentConfig::from_vars(&vars(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("SKIP_TLS_VERIFY", "true"),
            ("AMBIT_INSTALL_CHECK_INTERVAL", "200ms"),
        ]))
        .unwrap()
        .install;
        let api = k.kube_api.unwrap();
        assert_eq!(
            (api.protocol.as_str(), api.host.as_str(), api.port.as_str()),
            ("https", "10.96.0.1", "443")
        );
        assert!(api.skip_tls_verify);
        assert_eq!(k.check_interval, Duration::from_millis(200));
    }

    #[test]
    fn installer_errors_reported() {
        let errs = AgentConfig::from_vars(&vars(&[
            ("KUBECONFIG_MODE", "rw-------"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("CNI_CONF_NAME", "../etc/passwd"),
            ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "02-istio.conf"),
            ("CHAINED_CNI_PLUGIN", "maybe"),
            ("AMBIT_INSTALL_CHECK_INTERVAL", "0"),
        ]))
        .unwrap_err();
        let mut names: Vec<&str> = errs.iter().map(|e| e.var.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            vec![
                "AMBIT_INSTALL_CHECK_INTERVAL",
                "CHAINED_CNI_PLUGIN",
                "CNI_CONF_NAME",
                "ISTIO_OWNED_CNI_CONFIG_FILENAME",
                "KUBECONFIG_MODE",
                "KUBERNETES_SERVICE_PORT",
            ]
        );
        let port = errs
            .iter()
            .find(|e| e.var == "KUBERNETES_SERVICE_PORT")
            .unwrap();
        assert!(
            port.to_string()
                .contains("required when KUBERNETES_SERVICE_HOST")
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
