//! ztunnel configuration: the same environment variables and defaults as upstream
//! (`spec/ztunnel.md` §9), parsed in one place into a typed [`Config`].
//!
//! [`Config::from_vars`] takes the variables instead of reading the process environment, so
//! the library stays environment-free and every rule is unit-testable. The reading goes through
//! the node contract's one reader ([`ambit_contract::env::Env`]): all invalid variables are
//! collected and reported together ([`ConfigErrors`]), so an operator fixes a broken manifest in
//! one round trip instead of one variable per restart. Booleans are Go's `ParseBool`, durations
//! Go's `ParseDuration` plus bare seconds ([`ambit_contract::values`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ambit_contract::env::Env;
use ambit_contract::values::parse_bool;
use serde::Serialize;

pub use ambit_contract::env::{EnvError as ConfigError, EnvErrors as ConfigErrors};

use ambit_contract::{marks, ports};

const DEFAULT_ROOT_CA: &str = "./var/run/secrets/istio/root-cert.pem";
const DEFAULT_TOKEN_PATH: &str = "./var/run/secrets/tokens/istio-token";

/// How the proxy serves workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProxyMode {
    /// One ztunnel per node; listeners opened inside each pod's netns via ZDS.
    Shared,
    /// One workload; listeners in the process's own netns (VMs, bare hosts).
    Dedicated,
}

/// The node's operating system, which changes a few defaults and refusals
/// (`spec/windows.md` §1.1, §1.5): on Windows ZDS is a named pipe, there are no socket marks
/// (ztunnel's own traffic is exempt by its user, `S-1-5-18`) and no `SO_REUSEPORT` hand-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeOs {
    /// Linux (and other Unix) nodes.
    Linux,
    /// Windows nodes.
    Windows,
}

impl NodeOs {
    /// The OS this binary was built for.
    pub const fn current() -> Self {
        if cfg!(windows) {
            NodeOs::Windows
        } else {
            NodeOs::Linux
        }
    }
}

/// `namespace/name/serviceAccount` from `PROXY_WORKLOAD_INFO`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyWorkloadInfo {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
}

/// Where a root certificate comes from (`XDS_ROOT_CA`, `CA_ROOT_CA`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RootCert {
    File(PathBuf),
    /// Literal PEM in the variable itself.
    Pem(String),
    /// The operating system's trust store.
    System,
}

/// Bearer token source (`AUTH_TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AuthToken {
    /// Re-read at every call so a rotated projected token is picked up.
    File(PathBuf),
    #[serde(serialize_with = "redacted")]
    Literal(String),
}

fn redacted<S: serde::Serializer>(_: &String, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("<redacted>")
}

/// Local workload configuration (`LOCAL_XDS_PATH` or `LOCAL_XDS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LocalXds {
    Path(PathBuf),
    Inline(String),
}

/// Access-log and log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LogFormat {
    Plain,
    Json,
}

/// HTTP/2 tuning shared by the HBONE client and server (§3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Http2Config {
    pub stream_window_size: u32,
    pub connection_window_size: u32,
    pub frame_size: u32,
}

/// HBONE connection pool limits (§3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolConfig {
    pub max_streams_per_connection: u16,
    #[serde(with = "duration_str")]
    pub unused_release_timeout: Duration,
}

/// TCP keepalive and user-timeout settings for proxied sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeepaliveConfig {
    pub enabled: bool,
    #[serde(with = "duration_str")]
    pub time: Duration,
    #[serde(with = "duration_str")]
    pub interval: Duration,
    pub retries: u32,
    pub user_timeout_enabled: bool,
}

/// The effective ztunnel configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    pub proxy_mode: ProxyMode,
    pub proxy_workload_info: Option<ProxyWorkloadInfo>,
    pub inpod_uds: PathBuf,
    pub inpod_port_reuse: bool,
    pub packet_mark: Option<u32>,

    /// `None` disables xDS (`XDS_ADDRESS=""`).
    pub xds_address: Option<String>,
    pub xds_root_cert: RootCert,
    pub alt_xds_hostname: Option<String>,
    pub xds_headers: BTreeMap<String, String>,
    pub xds_on_demand: bool,
    pub ca_address: Option<String>,
    pub ca_root_cert: RootCert,
    pub alt_ca_hostname: Option<String>,
    pub ca_headers: BTreeMap<String, String>,
    pub auth_token: Option<AuthToken>,
    pub local_xds: Option<LocalXds>,
    #[serde(with = "duration_str")]
    pub secret_ttl: Duration,

    pub cluster_id: String,
    pub cluster_domain: String,
    pub trust_domain: Option<String>,
    pub network: String,
    pub node_name: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub service_account: Option<String>,
    pub instance_ip: IpAddr,
    pub prefered_service_namespace: Option<String>,
    /// `ISTIO_META_*` with the prefix stripped (xDS node metadata).
    pub proxy_metadata: BTreeMap<String, String>,
    /// `ISTIO_METAJSON_*` with the prefix stripped, each a JSON value (xDS node metadata as
    /// structured values, like upstream: `ISTIO_METAJSON_LABELS` becomes `LABELS`).
    pub proxy_metadata_json: BTreeMap<String, serde_json::Value>,
    /// Version reported in `istio_build{tag}`.
    pub istio_version: String,

    pub dns_proxy: bool,
    pub dns_proxy_addr: SocketAddr,
    /// Where unanswered DNS queries go: the nameservers of this file (`/etc/resolv.conf`;
    /// ambit extension `AMBIT_DNS_RESOLV_CONF` overrides the path).
    pub dns_resolv_conf: PathBuf,
    pub socks5: bool,
    pub ipv6_enabled: bool,
    /// `None` = try IP_TRANSPARENT and fall back; `Some(true)` = required.
    pub enable_orig_src: Option<bool>,
    pub localhost_app_tunnel: bool,
    pub enable_response_baggage: bool,
    pub tls12_enabled: bool,

    pub http2: Http2Config,
    pub pool: PoolConfig,
    pub keepalive: KeepaliveConfig,
    #[serde(with = "duration_str")]
    pub connection_termination_deadline: Duration,
    pub worker_threads: usize,
    /// Bytes of a client's first flight an outbound HBONE CONNECT carries before its
    /// response arrives (ambit extension `AMBIT_HBONE_EARLY_DATA_BYTES`, 0 = wait for the
    /// 200 as upstream does). Waypoint-bound CONNECTs never carry any.
    pub hbone_early_data: usize,

    pub admin_addr: SocketAddr,
    pub stats_addr: SocketAddr,
    pub readiness_addr: SocketAddr,

    pub authz_policy_info_logging: bool,
    pub log_format: LogFormat,
    pub rust_log: String,
}

mod duration_str {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{d:?}"))
    }
}

/// Default of [`Config::hbone_early_data`]: a request or a TLS ClientHello fits.
pub const DEFAULT_HBONE_EARLY_DATA: usize = 16 * 1024;
/// Upper bound of `AMBIT_HBONE_EARLY_DATA_BYTES`: held per connection until its CONNECT is
/// answered, and below the smallest initial stream window a peer may announce in practice.
pub const MAX_HBONE_EARLY_DATA: usize = 64 * 1024;

fn parse_root_cert(v: &str) -> Result<RootCert, String> {
    if v == "SYSTEM" {
        Ok(RootCert::System)
    } else if v.contains("-----BEGIN") {
        Ok(RootCert::Pem(v.to_string()))
    } else {
        Ok(RootCert::File(PathBuf::from(v)))
    }
}

fn parse_address(v: &str) -> Result<String, String> {
    // A scheme-less value gets https:// like upstream; plain http is refused (fail closed).
    let url = if v.contains("://") {
        v.to_string()
    } else {
        format!("https://{v}")
    };
    let rest = url
        .strip_prefix("https://")
        .ok_or("only https:// addresses are supported")?;
    let host_port = rest.split('/').next().unwrap_or_default();
    if host_port.is_empty() {
        return Err("missing host".into());
    }
    Ok(url)
}

fn parse_workload_info(v: &str) -> Result<ProxyWorkloadInfo, String> {
    let parts: Vec<&str> = v.split('/').collect();
    match parts.as_slice() {
        [ns, name, sa] if !ns.is_empty() && !name.is_empty() && !sa.is_empty() => {
            Ok(ProxyWorkloadInfo {
                namespace: ns.to_string(),
                name: name.to_string(),
                service_account: sa.to_string(),
            })
        }
        _ => Err("expected namespace/name/serviceAccount".into()),
    }
}

/// `N`, `N%` of the cores, or `0` for all cores.
fn parse_worker_threads(v: &str, cpus: usize) -> Result<usize, String> {
    let v = v.trim();
    let n = if let Some(pct) = v.strip_suffix('%') {
        let pct: usize = pct.parse().map_err(|_| "expected N or N%".to_string())?;
        if pct == 0 || pct > 100 {
            return Err("percentage must be 1..=100".into());
        }
        (cpus * pct).div_ceil(100)
    } else {
        let n: usize = v.parse().map_err(|_| "expected N or N%".to_string())?;
        if n == 0 { cpus } else { n }
    };
    if n > 1024 {
        return Err("more than 1024 worker threads".into());
    }
    Ok(n.max(1))
}

/// Kubernetes CPU quantity (`2`, `500m`, `1.5`), rounded up to whole cores.
fn parse_cpu_quantity(v: &str) -> Result<usize, String> {
    let cores = if let Some(m) = v.strip_suffix('m') {
        let milli: u64 = m
            .parse()
            .map_err(|_| "expected a CPU quantity like 2 or 500m")?;
        milli.div_ceil(1000) as usize
    } else {
        let f: f64 = v
            .parse()
            .map_err(|_| "expected a CPU quantity like 2 or 500m")?;
        if !f.is_finite() || f < 0.0 {
            return Err("expected a positive CPU quantity".into());
        }
        f.ceil() as usize
    };
    Ok(cores.max(1))
}

fn window(v: &str) -> Result<u32, String> {
    let n: u32 = v.trim().parse().map_err(|e| format!("{e}"))?;
    // h2 caps windows at 2^31-1.
    if n == 0 || n > i32::MAX as u32 {
        return Err("must be between 1 and 2147483647".into());
    }
    Ok(n)
}

fn frame_size(v: &str) -> Result<u32, String> {
    let n: u32 = v.trim().parse().map_err(|e| format!("{e}"))?;
    // RFC 9113 §6.5.2: 16 KiB ..= 16 MiB - 1.
    if !(16_384..=16_777_215).contains(&n) {
        return Err("must be between 16384 and 16777215".into());
    }
    Ok(n)
}

fn socket_addr_or_localhost(v: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Some(port) = v.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| "bad port")?;
        return Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
    }
    Err("expected IP:port or localhost:port".into())
}

impl Config {
    /// Builds the configuration from variables. `vars` lists every variable (for the
    /// `ISTIO_META_*`, `XDS_HEADER_*`, `CA_HEADER_*` families); `cpus` is the core count used
    /// for worker-thread defaults. `path_exists` decides the token-file default.
    pub fn from_vars(
        vars: &[(String, String)],
        cpus: usize,
        path_exists: &dyn Fn(&std::path::Path) -> bool,
    ) -> Result<Config, ConfigErrors> {
        Self::from_vars_for(NodeOs::current(), vars, cpus, path_exists)
    }

    /// [`Config::from_vars`] for a node of `os` (tests read Windows' rules on Linux).
    pub fn from_vars_for(
        os: NodeOs,
        vars: &[(String, String)],
        cpus: usize,
        path_exists: &dyn Fn(&std::path::Path) -> bool,
    ) -> Result<Config, ConfigErrors> {
        let mut r = Env::new(vars);

        let proxy_mode = r.parse("PROXY_MODE", ProxyMode::Shared, |v| match v {
            "shared" => Ok(ProxyMode::Shared),
            "dedicated" => Ok(ProxyMode::Dedicated),
            _ => Err("expected shared or dedicated"),
        });
        let proxy_workload_info = match r.get("PROXY_WORKLOAD_INFO").map(str::to_owned) {
            None => None,
            Some(v) => match parse_workload_info(&v) {
                Ok(i) => Some(i),
                Err(e) => {
                    r.fail("PROXY_WORKLOAD_INFO", &v, e);
                    None
                }
            },
        };
        if proxy_mode == ProxyMode::Dedicated
            && proxy_workload_info.is_none()
            && r.get("PROXY_WORKLOAD_INFO").is_none()
        {
            r.fail(
                "PROXY_WORKLOAD_INFO",
                "",
                "required when PROXY_MODE=dedicated",
            );
        }

        let in_k8s = r.get("KUBERNETES_SERVICE_HOST").is_some();
        let default_cp = if in_k8s {
            "https://istiod.istio-system.svc:15012"
        } else {
            "https://localhost:15012"
        };
        // XDS_ADDRESS="" (set but empty) disables xDS; unset uses the default.
        let xds_address = match r.raw("XDS_ADDRESS") {
            Some("") => None,
            Some(v) => match parse_address(v) {
                Ok(a) => Some(a),
                Err(e) => {
                    r.fail("XDS_ADDRESS", v, e);
                    None
                }
            },
            None => Some(default_cp.to_string()),
        };
        let ca_address = match r.raw("CA_ADDRESS") {
            Some("") => None,
            Some(v) => match parse_address(v) {
                Ok(a) => Some(a),
                Err(e) => {
                    r.fail("CA_ADDRESS", v, e);
                    None
                }
            },
            None => Some(default_cp.to_string()),
        };
        if r.bool("FAKE_CA", false) {
            r.fail(
                "FAKE_CA",
                "true",
                "not supported: run a real CA (for example `ambit control`) and set CA_ADDRESS",
            );
        }
        // Upstream checks peer certificates against this CRL; ignoring it would accept
        // revoked peers (fail open), so a set path stops the start instead.
        if let Some(v) = r.get("CRL_PATH") {
            r.fail(
                "CRL_PATH",
                v,
                "not supported: certificate revocation lists are not checked; unset it \
                 (and peerCaCrl in the chart) or revoke by rotating the CA",
            );
        }
        let default_root = RootCert::File(PathBuf::from(DEFAULT_ROOT_CA));
        let xds_root_cert = r.parse("XDS_ROOT_CA", default_root.clone(), parse_root_cert);
        let ca_root_cert = r.parse("CA_ROOT_CA", default_root, parse_root_cert);
        let alt_xds_hostname = r.get("ALT_XDS_HOSTNAME").map(str::to_owned);
        let alt_ca_hostname = r.get("ALT_CA_HOSTNAME").map(str::to_owned);

        let auth_token = match r.get("AUTH_TOKEN").map(str::to_owned) {
            Some(v) if path_exists(std::path::Path::new(&v)) => Some(AuthToken::File(v.into())),
            Some(v) if v.starts_with('/') || v.starts_with("./") => {
                // Looks like a path that does not exist (yet): keep it as a file so a token
                // mounted later is read, rather than sending the path as a bearer token.
                Some(AuthToken::File(v.into()))
            }
            Some(v) => Some(AuthToken::Literal(v)),
            None if path_exists(std::path::Path::new(DEFAULT_TOKEN_PATH)) => {
                Some(AuthToken::File(DEFAULT_TOKEN_PATH.into()))
            }
            None => None,
        };

        let local_xds = match (
            r.get("LOCAL_XDS_PATH").map(str::to_owned),
            r.get("LOCAL_XDS").map(str::to_owned),
        ) {
            (Some(p), None) => Some(LocalXds::Path(p.into())),
            (None, Some(y)) => Some(LocalXds::Inline(y)),
            (None, None) => None,
            (Some(p), Some(_)) => {
                r.fail(
                    "LOCAL_XDS",
                    &p,
                    "LOCAL_XDS_PATH and LOCAL_XDS are mutually exclusive",
                );
                None
            }
        };
        let xds_on_demand = r.bool("XDS_ON_DEMAND", false);
        let secret_ttl = r.duration("SECRET_TTL", Duration::from_secs(86400));
        // Short lifetimes are legitimate in tests of rotation; below a second the half-life
        // refresh would spin.
        if secret_ttl < Duration::from_secs(1) && r.get("SECRET_TTL").is_some() {
            r.fail(
                "SECRET_TTL",
                &format!("{secret_ttl:?}"),
                "must be at least 1s",
            );
        }

        let proxy_metadata = r.prefixed("ISTIO_META_");
        let mut proxy_metadata_json = BTreeMap::new();
        for (key, text) in r.prefixed("ISTIO_METAJSON_") {
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(v) => {
                    proxy_metadata_json.insert(key, v);
                }
                Err(e) => r.fail(
                    &format!("ISTIO_METAJSON_{key}"),
                    &text,
                    format!("a JSON value ({e})"),
                ),
            }
        }
        let cluster_id = r
            .get("CLUSTER_ID")
            .map(str::to_owned)
            .or_else(|| proxy_metadata.get("CLUSTER_ID").cloned())
            .unwrap_or_else(|| "Kubernetes".into());
        let cluster_domain = r
            .get("CLUSTER_DOMAIN")
            .map(str::to_owned)
            .unwrap_or_else(|| "cluster.local".into());
        let trust_domain = r.get("TRUST_DOMAIN").map(str::to_owned);
        if let Some(td) = &trust_domain
            && (td.contains('/') || td.chars().any(char::is_whitespace))
        {
            r.fail("TRUST_DOMAIN", td, "must not contain '/' or whitespace");
        }
        let network = r.get("NETWORK").map(str::to_owned).unwrap_or_default();
        let instance_ip = r.parse("INSTANCE_IP", IpAddr::V4(Ipv4Addr::new(1, 1, 1, 1)), |v| {
            v.parse().map_err(|_| "expected an IP address".to_string())
        });

        let packet_mark_default = match (os, proxy_mode) {
            (NodeOs::Linux, ProxyMode::Shared) => Some(marks::INPOD_MARK),
            _ => None,
        };
        let packet_mark = r.parse("PACKET_MARK", packet_mark_default, |v| match os {
            NodeOs::Windows => Err(
                "Windows has no socket marks; ztunnel's own connections are exempt from capture by its user (S-1-5-18)"
                    .to_string(),
            ),
            NodeOs::Linux => v
                .parse::<u32>()
                .map(Some)
                .map_err(|_| "expected a 32-bit mark".to_string()),
        });
        let inpod_port_reuse = r.bool("INPOD_PORT_REUSE", true);
        if os == NodeOs::Windows && proxy_mode == ProxyMode::Shared && inpod_port_reuse {
            let value = r.raw("INPOD_PORT_REUSE").unwrap_or_default();
            r.fail(
                "INPOD_PORT_REUSE",
                value,
                "SO_REUSEPORT hand-off is not available on Windows (set INPOD_PORT_REUSE=false, as upstream requires there)",
            );
        }
        let inpod_uds_default = match os {
            NodeOs::Linux => "/var/run/ztunnel/ztunnel.sock",
            NodeOs::Windows => ambit_contract::windows::ZDS_PIPE,
        };

        let dns_capture = proxy_metadata
            .get("DNS_CAPTURE")
            .map(|v| v == "true")
            .unwrap_or(true);
        let dns_proxy_addr = match proxy_metadata.get("DNS_PROXY_ADDR") {
            None => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), ports::DNS_PROXY),
            Some(v) => match socket_addr_or_localhost(v) {
                Ok(a) => a,
                Err(e) => {
                    r.fail("ISTIO_META_DNS_PROXY_ADDR", v, e);
                    SocketAddr::new(Ipv4Addr::LOCALHOST.into(), ports::DNS_PROXY)
                }
            },
        };
        if dns_capture && xds_on_demand {
            r.fail(
                "XDS_ON_DEMAND",
                "true",
                "cannot be combined with the DNS proxy",
            );
        }

        let enable_orig_src = match r.get("ENABLE_ORIG_SRC").map(str::to_owned) {
            None => None,
            Some(v) => match parse_bool(&v) {
                Ok(b) => Some(b),
                Err(e) => {
                    r.fail("ENABLE_ORIG_SRC", &v, e);
                    None
                }
            },
        };

        let http2 = Http2Config {
            stream_window_size: r.parse("HTTP2_STREAM_WINDOW_SIZE", 4 * 1024 * 1024, window),
            connection_window_size: r.parse(
                "HTTP2_CONNECTION_WINDOW_SIZE",
                16 * 1024 * 1024,
                window,
            ),
            frame_size: r.parse("HTTP2_FRAME_SIZE", 1024 * 1024, frame_size),
        };
        let pool =
            PoolConfig {
                max_streams_per_connection: r.parse("POOL_MAX_STREAMS_PER_CONNECTION", 100, |v| {
                    match v.trim().parse::<u16>() {
                        Ok(0) | Err(_) => Err("must be between 1 and 65535".to_string()),
                        Ok(n) => Ok(n),
                    }
                }),
                unused_release_timeout: r
                    .duration("POOL_UNUSED_RELEASE_TIMEOUT", Duration::from_secs(300)),
            };
        let keepalive = KeepaliveConfig {
            enabled: r.bool("KEEPALIVE_ENABLED", true),
            time: r.duration("KEEPALIVE_TIME", Duration::from_secs(180)),
            interval: r.duration("KEEPALIVE_INTERVAL", Duration::from_secs(180)),
            retries: r.number("KEEPALIVE_RETRIES", 9u32),
            user_timeout_enabled: r.bool("USER_TIMEOUT_ENABLED", false),
        };

        let connection_termination_deadline =
            match r.get("CONNECTION_TERMINATION_DEADLINE").map(str::to_owned) {
                Some(_) => r.duration("CONNECTION_TERMINATION_DEADLINE", Duration::from_secs(5)),
                None => match r.get("TERMINATION_GRACE_PERIOD_SECONDS").map(str::to_owned) {
                    None => Duration::from_secs(5),
                    Some(v) => match v.parse::<u64>() {
                        // Leave the kubelet time to SIGKILL after our own forced close.
                        Ok(g) if g <= 10 => Duration::from_secs(g.saturating_sub(1)),
                        Ok(g) => Duration::from_secs(g - 5),
                        Err(_) => {
                            r.fail("TERMINATION_GRACE_PERIOD_SECONDS", &v, "expected seconds");
                            Duration::from_secs(5)
                        }
                    },
                },
            };

        // Worker threads: explicit setting, else CPU limit, else max(2, ceil(cpus/4), request).
        let cpu_request = r.parse("ZTUNNEL_RESOURCE_CPU_REQUEST", 0, parse_cpu_quantity);
        let default_workers = 2.max(cpus.div_ceil(4)).max(cpu_request);
        let worker_threads = if r.get("ZTUNNEL_WORKER_THREADS").is_some() {
            r.parse("ZTUNNEL_WORKER_THREADS", default_workers, |v| {
                parse_worker_threads(v, cpus)
            })
        } else if r.get("ZTUNNEL_CPU_LIMIT").is_some() {
            r.parse("ZTUNNEL_CPU_LIMIT", default_workers, parse_cpu_quantity)
        } else {
            r.parse(
                "ZTUNNEL_RESOURCE_CPU_LIMIT",
                default_workers,
                parse_cpu_quantity,
            )
        };

        let hbone_early_data = r.parse(
            "AMBIT_HBONE_EARLY_DATA_BYTES",
            DEFAULT_HBONE_EARLY_DATA,
            |v| match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_HBONE_EARLY_DATA => Ok(n),
                _ => Err(format!(
                    "expected bytes between 0 and {MAX_HBONE_EARLY_DATA}"
                )),
            },
        );

        let ipv6_enabled = r.bool("IPV6_ENABLED", true);
        let log_format = r.parse("LOG_FORMAT", LogFormat::Plain, |v| match v {
            "plain" | "text" => Ok(LogFormat::Plain),
            "json" => Ok(LogFormat::Json),
            _ => Err("expected plain or json"),
        });
        let rust_log = r
            .get("RUST_LOG")
            .map(str::to_owned)
            .unwrap_or_else(|| "info".into());

        let unspecified: IpAddr = if ipv6_enabled {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        } else {
            Ipv4Addr::UNSPECIFIED.into()
        };

        let cfg = Config {
            proxy_mode,
            proxy_workload_info,
            inpod_uds: r
                .get("INPOD_UDS")
                .map(str::to_owned)
                .unwrap_or_else(|| inpod_uds_default.into())
                .into(),
            inpod_port_reuse,
            packet_mark,
            xds_address,
            xds_root_cert,
            alt_xds_hostname,
            xds_headers: r.prefixed("XDS_HEADER_"),
            xds_on_demand,
            ca_address,
            ca_root_cert,
            alt_ca_hostname,
            ca_headers: r.prefixed("CA_HEADER_"),
            auth_token,
            local_xds,
            secret_ttl,
            cluster_id,
            cluster_domain,
            trust_domain,
            network,
            node_name: r.get("NODE_NAME").map(str::to_owned),
            pod_name: r.get("POD_NAME").map(str::to_owned),
            pod_namespace: r.get("POD_NAMESPACE").map(str::to_owned),
            service_account: r.get("SERVICE_ACCOUNT").map(str::to_owned),
            instance_ip,
            prefered_service_namespace: r.get("PREFERED_SERVICE_NAMESPACE").map(str::to_owned),
            istio_version: proxy_metadata
                .get("ISTIO_VERSION")
                .cloned()
                .unwrap_or_else(|| "unknown".into()),
            proxy_metadata,
            proxy_metadata_json,
            dns_proxy: dns_capture,
            dns_proxy_addr,
            dns_resolv_conf: r
                .get("AMBIT_DNS_RESOLV_CONF")
                .map(str::to_owned)
                .unwrap_or_else(|| "/etc/resolv.conf".into())
                .into(),
            socks5: r.bool("UNSTABLE_ENABLE_SOCKS5", false),
            ipv6_enabled,
            enable_orig_src,
            localhost_app_tunnel: r.bool("LOCALHOST_APP_TUNNEL", true),
            enable_response_baggage: r.bool("ENABLE_RESPONSE_BAGGAGE", true),
            tls12_enabled: r.bool("TLS12_ENABLED", false),
            http2,
            pool,
            keepalive,
            connection_termination_deadline,
            worker_threads,
            hbone_early_data,
            admin_addr: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), ports::ZTUNNEL_ADMIN),
            stats_addr: SocketAddr::new(unspecified, ports::ZTUNNEL_STATS),
            readiness_addr: SocketAddr::new(unspecified, ports::ZTUNNEL_READINESS),
            authz_policy_info_logging: r.bool("AUTHZ_POLICY_INFO_LOGGING", false),
            log_format,
            rust_log,
        };
        r.finish("ztunnel", cfg)
    }

    /// The configuration as JSON, for the "running with config" start-up log and
    /// `/config_dump`. Secrets are redacted.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// Ports that traffic must never be proxied to (§1.2 "illegal ports").
    pub fn illegal_ports(&self) -> Vec<u16> {
        let mut p = ports::INPOD_LISTENERS.to_vec();
        if self.socks5 {
            p.push(ports::SOCKS5);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn load(pairs: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        Config::from_vars(&vars(pairs), 8, &|_| false)
    }

    fn load_windows(pairs: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
        Config::from_vars_for(NodeOs::Windows, &vars(pairs), 8, &|_| false)
    }

    /// `spec/windows.md` §1.1, §1.5: the pipe by default, no marks, no SO_REUSEPORT.
    #[test]
    fn windows_nodes_have_their_own_rules() {
        let off = [("INPOD_PORT_REUSE", "false")];
        let c = load_windows(&off).unwrap();
        assert_eq!(c.inpod_uds, std::path::PathBuf::from(r"\\.\pipe\istio-zds"));
        assert_eq!(c.packet_mark, None);
        assert!(!c.inpod_port_reuse);
        // (variables, the variable refused)
        let refused: [(&[(&str, &str)], &str); 3] = [
            (&[], "INPOD_PORT_REUSE"),
            (&[("INPOD_PORT_REUSE", "true")], "INPOD_PORT_REUSE"),
            (
                &[("INPOD_PORT_REUSE", "false"), ("PACKET_MARK", "1337")],
                "PACKET_MARK",
            ),
        ];
        for (pairs, var) in refused {
            let errs = load_windows(pairs).unwrap_err();
            assert!(errs.iter().any(|e| e.var == var), "{pairs:?}: {errs}");
        }
        // Dedicated mode has no pod hand-off: the default is fine there.
        let dedicated = load_windows(&[
            ("PROXY_MODE", "dedicated"),
            ("PROXY_WORKLOAD_INFO", "ns1/pod1/sa1"),
        ]);
        assert!(
            dedicated.is_ok(),
            "{:?}",
            dedicated.err().map(|e| e.to_string())
        );
        // Linux keeps its defaults.
        let linux = load(&[]).unwrap();
        assert_eq!(
            linux.inpod_uds,
            std::path::PathBuf::from("/var/run/ztunnel/ztunnel.sock")
        );
        assert_eq!(linux.packet_mark, Some(marks::INPOD_MARK));
    }

    #[test]
    fn defaults_match_upstream() {
        let c = load(&[]).unwrap();
        assert_eq!(c.proxy_mode, ProxyMode::Shared);
        assert_eq!(c.inpod_uds, PathBuf::from("/var/run/ztunnel/ztunnel.sock"));
        assert_eq!(c.packet_mark, Some(1337));
        assert_eq!(c.xds_address.as_deref(), Some("https://localhost:15012"));
        assert_eq!(c.ca_address.as_deref(), Some("https://localhost:15012"));
        assert_eq!(c.secret_ttl, Duration::from_secs(86400));
        assert_eq!(c.cluster_id, "Kubernetes");
        assert_eq!(c.cluster_domain, "cluster.local");
        assert_eq!(c.http2.stream_window_size, 4 << 20);
        assert_eq!(c.http2.connection_window_size, 16 << 20);
        assert_eq!(c.http2.frame_size, 1 << 20);
        assert_eq!(c.pool.max_streams_per_connection, 100);
        assert_eq!(c.pool.unused_release_timeout, Duration::from_secs(300));
        assert_eq!(c.connection_termination_deadline, Duration::from_secs(5));
        assert_eq!(c.worker_threads, 2);
        assert!(c.ipv6_enabled && c.dns_proxy && c.inpod_port_reuse);
        assert_eq!(c.enable_orig_src, None);
        assert_eq!(c.instance_ip, IpAddr::V4(Ipv4Addr::new(1, 1, 1, 1)));
        assert_eq!(c.readiness_addr.port(), 15021);
        assert!(c.admin_addr.ip().is_loopback());
        assert_eq!(c.illegal_ports(), vec![15001, 15006, 15008]);
    }

    #[test]
    fn kubernetes_default_address() {
        let c = load(&[("KUBERNETES_SERVICE_HOST", "10.0.0.1")]).unwrap();
        assert_eq!(
            c.xds_address.as_deref(),
            Some("https://istiod.istio-system.svc:15012")
        );
    }

    #[test]
    fn explicit_values() {
        let c = load(&[
            ("PROXY_MODE", "dedicated"),
            ("PROXY_WORKLOAD_INFO", "ns1/pod1/sa1"),
            ("XDS_ADDRESS", ""),
            ("CA_ADDRESS", "10.99.0.1:15012"),
            ("CA_ROOT_CA", "SYSTEM"),
            ("SECRET_TTL", "12h"),
            ("ZTUNNEL_WORKER_THREADS", "50%"),
            ("ISTIO_META_DNS_CAPTURE", "false"),
            ("ISTIO_META_CLUSTER_ID", "c1"),
            ("XDS_HEADER_x-foo", "bar"),
            ("TERMINATION_GRACE_PERIOD_SECONDS", "30"),
            ("LOG_FORMAT", "json"),
            ("ENABLE_ORIG_SRC", "true"),
            ("AUTH_TOKEN", "literal-token"),
        ])
        .unwrap();
        assert_eq!(c.proxy_mode, ProxyMode::Dedicated);
        assert_eq!(c.packet_mark, None);
        assert_eq!(
            c.proxy_workload_info,
            Some(ProxyWorkloadInfo {
                namespace: "ns1".into(),
                name: "pod1".into(),
                service_account: "sa1".into()
            })
        );
        assert_eq!(c.xds_address, None);
        assert_eq!(c.ca_address.as_deref(), Some("https://10.99.0.1:15012"));
        assert_eq!(c.ca_root_cert, RootCert::System);
        assert_eq!(c.secret_ttl, Duration::from_secs(43200));
        assert_eq!(c.worker_threads, 4);
        assert!(!c.dns_proxy);
        assert_eq!(c.cluster_id, "c1");
        assert_eq!(c.xds_headers.get("x-foo").map(String::as_str), Some("bar"));
        assert_eq!(c.connection_termination_deadline, Duration::from_secs(25));
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.enable_orig_src, Some(true));
        assert_eq!(
            c.auth_token,
            Some(AuthToken::Literal("literal-token".into()))
        );
        assert!(
            !c.to_json().to_string().contains("literal-token"),
            "token must be redacted"
        );
    }

    #[test]
    fn early_data_bound_forms() {
        assert_eq!(
            load(&[]).unwrap().hbone_early_data,
            DEFAULT_HBONE_EARLY_DATA
        );
        // Set but empty is unset, as for every variable.
        let cases = [
            ("0", 0),
            ("1", 1),
            (" 65536 ", MAX_HBONE_EARLY_DATA),
            ("", DEFAULT_HBONE_EARLY_DATA),
        ];
        for (v, want) in cases {
            let c = load(&[("AMBIT_HBONE_EARLY_DATA_BYTES", v)]).unwrap();
            assert_eq!(c.hbone_early_data, want, "{v:?}");
        }
        for v in ["-1", "16KiB", "65537"] {
            let errs = load(&[("AMBIT_HBONE_EARLY_DATA_BYTES", v)]).unwrap_err();
            assert!(
                errs.to_string().contains("AMBIT_HBONE_EARLY_DATA_BYTES"),
                "{v:?}: {errs}"
            );
        }
    }

    #[test]
    fn worker_thread_forms() {
        let cases = [("0", 8), ("3", 3), ("100%", 8), ("1%", 1), ("25%", 2)];
        for (v, want) in cases {
            let c = load(&[("ZTUNNEL_WORKER_THREADS", v)]).unwrap();
            assert_eq!(c.worker_threads, want, "{v}");
        }
        let c = load(&[("ZTUNNEL_RESOURCE_CPU_LIMIT", "500m")]).unwrap();
        assert_eq!(c.worker_threads, 1);
    }

    #[test]
    fn every_bad_variable_is_reported_at_once() {
        let bad = [
            ("PROXY_MODE", "sidecar"),
            ("SECRET_TTL", "forever"),
            ("PACKET_MARK", "-1"),
            ("IPV6_ENABLED", "yes"),
            ("ENABLE_ORIG_SRC", "maybe"),
            ("HTTP2_STREAM_WINDOW_SIZE", "0"),
            ("HTTP2_CONNECTION_WINDOW_SIZE", "99999999999"),
            ("HTTP2_FRAME_SIZE", "100"),
            ("POOL_MAX_STREAMS_PER_CONNECTION", "0"),
            // A bare number is whole seconds (upstream accepts it); a unit must be one Go knows.
            ("POOL_UNUSED_RELEASE_TIMEOUT", "5d"),
            ("CONNECTION_TERMINATION_DEADLINE", "soon"),
            ("ZTUNNEL_WORKER_THREADS", "many"),
            ("AMBIT_HBONE_EARLY_DATA_BYTES", "65537"),
            ("LOG_FORMAT", "xml"),
            ("XDS_ADDRESS", "http://insecure:15010"),
            ("PROXY_WORKLOAD_INFO", "only/two"),
            ("INSTANCE_IP", "not-an-ip"),
            ("FAKE_CA", "true"),
            ("CRL_PATH", "/var/run/secrets/istio/crl/ca-crl.pem"),
        ];
        let errs = load(&bad).unwrap_err();
        let named: Vec<&str> = errs.iter().map(|e| e.var.as_str()).collect();
        for (var, _) in bad {
            assert!(named.contains(&var), "{var} not reported; got {named:?}");
        }
        let text = errs.to_string();
        assert!(text.contains("SECRET_TTL=\"forever\""), "{text}");
        // Set but empty is unset, as upstream's chart leaves it without `peerCaCrl`.
        assert!(load(&[("CRL_PATH", "")]).is_ok());
    }

    #[test]
    fn conflicting_settings_are_refused() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("LOCAL_XDS_PATH", "/a"), ("LOCAL_XDS", "workloads: []")],
                "LOCAL_XDS",
            ),
            (&[("PROXY_MODE", "dedicated")], "PROXY_WORKLOAD_INFO"),
            (&[("XDS_ON_DEMAND", "true")], "XDS_ON_DEMAND"),
            (
                &[("ISTIO_METAJSON_LABELS", "{\"app\":")],
                "ISTIO_METAJSON_LABELS",
            ),
        ];
        for (pairs, var) in cases {
            let errs = load(pairs).unwrap_err();
            assert!(errs.iter().any(|e| e.var == *var), "{pairs:?}: {errs}");
        }
    }

    #[test]
    fn token_file_default_used_when_present() {
        let c =
            Config::from_vars(&[], 2, &|p| p == std::path::Path::new(DEFAULT_TOKEN_PATH)).unwrap();
        assert_eq!(
            c.auth_token,
            Some(AuthToken::File(DEFAULT_TOKEN_PATH.into()))
        );
        let c = load(&[("AUTH_TOKEN", "/var/run/token")]).unwrap();
        assert_eq!(c.auth_token, Some(AuthToken::File("/var/run/token".into())));
    }
}
