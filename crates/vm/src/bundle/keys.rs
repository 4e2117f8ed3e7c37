//! What each `cluster.env` / proxyMetadata key means to ambit ([`KEYS`], the table
//! `docs/vm.md` shows), and turning the merged keys into settings.
//!
//! Unknown-key policy: `ISTIO_META_*` / `ISTIO_METAJSON_*` keys are node metadata and always
//! accepted; any other unknown `ISTIO_*` key is refused (upstream's interception and bootstrap
//! settings use that prefix, and a misspelt `ISTIO_LOCAL_EXCLUDE_PORT` must not silently
//! capture SSH); every other unknown key (istioctl copies the mesh's proxyMetadata verbatim)
//! is accepted with a warning.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ambit_redirect::vm::{Cidr, InboundCapture, OutboundCapture, VmRedirectConfig};

use super::{Identity, Origin, Problem, Warning};

/// How ambit treats a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// Read and acted on.
    Used,
    /// Read, checked and kept (in [`super::Bundle`]) without changing what ambit does.
    Informational,
    /// Upstream uses it for something ambit does not have; logged and ignored.
    Ignored(&'static str),
}

/// One known key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpec {
    /// The key.
    pub name: &'static str,
    /// How ambit treats it.
    pub kind: KeyKind,
}

const fn used(name: &'static str) -> KeySpec {
    KeySpec {
        name,
        kind: KeyKind::Used,
    }
}

const fn info(name: &'static str) -> KeySpec {
    KeySpec {
        name,
        kind: KeyKind::Informational,
    }
}

const fn ignored(name: &'static str, reason: &'static str) -> KeySpec {
    KeySpec {
        name,
        kind: KeyKind::Ignored(reason),
    }
}

/// Every key ambit knows, in the order `docs/vm.md` lists them.
pub const KEYS: &[KeySpec] = &[
    used("SERVICE_ACCOUNT"),
    used("POD_NAMESPACE"),
    used("ISTIO_NAMESPACE"),
    used("ISTIO_META_WORKLOAD_NAME"),
    used("TRUST_DOMAIN"),
    used("CA_ADDR"),
    used("PILOT_ADDRESS"),
    used("ISTIO_PILOT_PORT"),
    used("ISTIO_SYSTEM_NAMESPACE"),
    used("ISTIO_META_CLUSTER_ID"),
    used("ISTIO_META_NETWORK"),
    used("ISTIO_METAJSON_LABELS"),
    used("CANONICAL_SERVICE"),
    used("CANONICAL_REVISION"),
    used("ISTIO_SVC_IP"),
    used("ISTIO_INBOUND_PORTS"),
    used("ISTIO_LOCAL_EXCLUDE_PORTS"),
    used("ISTIO_SERVICE_CIDR"),
    used("ISTIO_SERVICE_EXCLUDE_CIDR"),
    used("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"),
    used("ISTIO_EXCLUDE_INTERFACES"),
    used("ISTIO_META_DNS_CAPTURE"),
    used("ISTIO_CUSTOM_IP_TABLES"),
    used("ISTIO_INBOUND_INTERCEPTION_MODE"),
    used("ISTIO_META_AUTO_REGISTER_GROUP"),
    info("ISTIO_SERVICE"),
    info("ISTIO_META_MESH_ID"),
    info("ISTIO_META_POD_PORTS"),
    ignored(
        "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION",
        "Envoy's probe rewriting; ztunnel does not rewrite probes",
    ),
    ignored("ISTIO_AGENT_FLAGS", "pilot-agent's command-line flags"),
    ignored(
        "ISTIO_CP_AUTH",
        "the control plane is always reached over TLS",
    ),
    ignored("ISTIO_BIN_BASE", "a path of upstream's start script"),
    ignored("ISTIO_LOG_DIR", "a path of upstream's start script"),
    ignored("ISTIO_SIDECAR_CONFIG", "a path of upstream's start script"),
    ignored("ISTIO_CLUSTER_CONFIG", "a path of upstream's start script"),
    ignored("PROXY_CONFIG", "Envoy's ProxyConfig"),
];

/// istioctl's `ISTIO_LOCAL_EXCLUDE_PORTS`: SSH, Envoy's Prometheus port, the agent's ports.
pub const DEFAULT_EXCLUDE_PORTS: [u16; 4] = [22, 15090, 15021, 15020];
/// Where upstream's start script points a VM when nothing names the control plane.
const DEFAULT_CA_PORT: u16 = 15012;

pub(crate) struct Settings {
    pub identity: Identity,
    pub workload_name: String,
    pub canonical_service: Option<String>,
    pub canonical_revision: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub service: Option<String>,
    pub instance_ip: Option<IpAddr>,
    pub ca_address: String,
    pub ca_address_key: String,
    pub cluster_id: String,
    pub network: String,
    pub mesh_id: String,
    pub auto_register_group: Option<String>,
    pub redirect: Option<VmRedirectConfig>,
    pub metadata: BTreeMap<String, String>,
}

pub(crate) struct Interpreted {
    pub value: Settings,
    pub errors: Vec<(String, Option<Origin>, Problem)>,
    pub warnings: Vec<Warning>,
}

struct Ctx<'a> {
    vars: &'a BTreeMap<String, (String, Origin)>,
    errors: Vec<(String, Option<Origin>, Problem)>,
}

impl<'a> Ctx<'a> {
    fn get(&self, key: &str) -> Option<&'a str> {
        self.vars.get(key).map(|(v, _)| v.as_str())
    }

    fn origin(&self, key: &str) -> Option<Origin> {
        self.vars.get(key).map(|(_, o)| *o)
    }

    fn fail(&mut self, key: &str, problem: Problem) {
        let origin = self.origin(key);
        self.errors.push((key.to_owned(), origin, problem));
    }

    fn bad(&mut self, key: &str, value: &str, expected: impl Into<String>) {
        self.fail(
            key,
            Problem::BadValue {
                value: value.to_owned(),
                expected: expected.into(),
            },
        );
    }

    /// A required key's non-empty value.
    fn required(&mut self, key: &str) -> String {
        match self.get(key) {
            Some(v) if !v.is_empty() => v.to_owned(),
            _ => {
                self.fail(key, Problem::Missing);
                String::new()
            }
        }
    }

    fn non_empty(&self, key: &str) -> Option<String> {
        self.get(key).filter(|v| !v.is_empty()).map(str::to_owned)
    }

    fn parse<T>(&mut self, key: &str, expected: &str, f: impl Fn(&str) -> Option<T>) -> Option<T> {
        let v = self.get(key)?;
        let out = f(v);
        if out.is_none() {
            self.bad(key, v, expected);
        }
        out
    }

    fn name(&mut self, key: &str, value: String) -> String {
        if !is_kube_name(&value) && !value.is_empty() {
            self.bad(
                key,
                &value,
                "a Kubernetes name (lowercase letters, digits, '-' and '.')",
            );
        }
        value
    }
}

pub(crate) fn interpret(
    vars: &BTreeMap<String, (String, Origin)>,
    discovery_address: Option<&str>,
) -> Interpreted {
    let mut c = Ctx {
        vars,
        errors: Vec::new(),
    };
    let mut warnings = Vec::new();

    for key in vars.keys() {
        match KEYS.iter().find(|k| k.name == key) {
            Some(KeySpec {
                kind: KeyKind::Ignored(reason),
                ..
            }) => warnings.push(Warning::Ignored {
                key: key.clone(),
                reason,
            }),
            Some(_) => {}
            None if key.starts_with("ISTIO_META_") || key.starts_with("ISTIO_METAJSON_") => {}
            None if key.starts_with("ISTIO_") => c.fail(key, Problem::UnknownIstioKey),
            None => warnings.push(Warning::Unknown { key: key.clone() }),
        }
    }

    // Identity.
    let sa = c.required("SERVICE_ACCOUNT");
    let service_account = c.name("SERVICE_ACCOUNT", sa);
    let namespace = match (c.non_empty("POD_NAMESPACE"), c.non_empty("ISTIO_NAMESPACE")) {
        (Some(a), Some(b)) if a != b => {
            c.fail(
                "ISTIO_NAMESPACE",
                Problem::Disagree {
                    other: "POD_NAMESPACE",
                },
            );
            a
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            c.fail("POD_NAMESPACE", Problem::Missing);
            String::new()
        }
    };
    let key = if c.non_empty("POD_NAMESPACE").is_some() {
        "POD_NAMESPACE"
    } else {
        "ISTIO_NAMESPACE"
    };
    let namespace = c.name(key, namespace);
    let wn = c.required("ISTIO_META_WORKLOAD_NAME");
    let workload_name = c.name("ISTIO_META_WORKLOAD_NAME", wn);
    let trust_domain = match c.non_empty("TRUST_DOMAIN") {
        None => "cluster.local".to_owned(),
        Some(td) if is_trust_domain(&td) => td,
        Some(td) => {
            c.bad(
                "TRUST_DOMAIN",
                &td,
                "a trust domain (letters, digits, '-', '.', '_')",
            );
            td
        }
    };

    let labels = c
        .parse(
            "ISTIO_METAJSON_LABELS",
            "a JSON object of string values, like {\"app\":\"foo\"}",
            |v| {
                if v.is_empty() {
                    Some(BTreeMap::new())
                } else {
                    serde_json::from_str::<BTreeMap<String, String>>(v).ok()
                }
            },
        )
        .unwrap_or_default();
    c.parse(
        "ISTIO_META_POD_PORTS",
        "a JSON list of ports, like [{\"name\":\"http\",\"containerPort\":8080}]",
        |v| {
            (v.is_empty() || matches!(serde_json::from_str(v), Ok(serde_json::Value::Array(_))))
                .then_some(())
        },
    );
    let instance_ip = c
        .parse("ISTIO_SVC_IP", "an IP address", |v| {
            if v.is_empty() {
                Some(None)
            } else {
                v.parse::<IpAddr>().ok().map(Some)
            }
        })
        .flatten();

    // The control plane.
    let system_ns = c
        .non_empty("ISTIO_SYSTEM_NAMESPACE")
        .unwrap_or_else(|| "istio-system".to_owned());
    let pilot_port = c.parse("ISTIO_PILOT_PORT", "a port number (1-65535)", |v| {
        v.parse::<u16>().ok().filter(|p| *p != 0)
    });
    let (ca_address, ca_address_key) = if let Some(a) = c.non_empty("CA_ADDR") {
        (check_address(&mut c, "CA_ADDR", a), "cluster.env CA_ADDR")
    } else if let Some(a) = c.non_empty("PILOT_ADDRESS") {
        (
            check_address(&mut c, "PILOT_ADDRESS", a),
            "cluster.env PILOT_ADDRESS",
        )
    } else if let Some(port) = pilot_port {
        (
            format!("istiod.{system_ns}.svc:{port}"),
            "cluster.env ISTIO_PILOT_PORT",
        )
    } else if let Some(a) = discovery_address {
        if split_address(a).is_none() {
            c.errors.push((
                "defaultConfig.discoveryAddress".to_owned(),
                Some(Origin::MeshYaml),
                Problem::BadValue {
                    value: a.to_owned(),
                    expected: "HOST:PORT".to_owned(),
                },
            ));
        }
        (a.to_owned(), "mesh.yaml defaultConfig.discoveryAddress")
    } else {
        (
            format!("istiod.{system_ns}.svc:{DEFAULT_CA_PORT}"),
            "the default control plane",
        )
    };
    let ca_address_key = ca_address_key.to_owned();

    // Redirection.
    let except = c
        .parse("ISTIO_LOCAL_EXCLUDE_PORTS", PORTS, ports)
        .unwrap_or_else(|| DEFAULT_EXCLUDE_PORTS.to_vec());
    let inbound = match c.get("ISTIO_INBOUND_PORTS") {
        None | Some("*") => InboundCapture::All { except },
        Some("") => InboundCapture::None,
        Some(_) => c
            .parse(
                "ISTIO_INBOUND_PORTS",
                "'*' or a list of ports, like 80,8080",
                ports,
            )
            .map_or(InboundCapture::None, InboundCapture::Ports),
    };
    let outbound = match c.get("ISTIO_SERVICE_CIDR") {
        None | Some("*") => OutboundCapture::All,
        Some("") => OutboundCapture::None,
        Some(_) => c
            .parse(
                "ISTIO_SERVICE_CIDR",
                "'*' or a list of networks, like 10.96.0.0/12,fd00::/108",
                cidrs,
            )
            .map_or(OutboundCapture::None, OutboundCapture::Cidrs),
    };
    let outbound_exclude_cidrs = c
        .parse("ISTIO_SERVICE_EXCLUDE_CIDR", "a list of networks", cidrs)
        .unwrap_or_default();
    let outbound_exclude_ports = c
        .parse("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", PORTS, ports)
        .unwrap_or_default();
    let exclude_interfaces = c
        .parse(
            "ISTIO_EXCLUDE_INTERFACES",
            "a list of interface names",
            |v| list(v).map(|s| s.parse().ok()).collect(),
        )
        .unwrap_or_default();
    let dns_capture = c
        .parse("ISTIO_META_DNS_CAPTURE", BOOL, |v| {
            ambit_contract::values::parse_bool(v).ok()
        })
        .unwrap_or(false);
    let custom = c
        .parse("ISTIO_CUSTOM_IP_TABLES", BOOL, |v| {
            ambit_contract::values::parse_bool(v).ok()
        })
        .unwrap_or(false);
    match c.get("ISTIO_INBOUND_INTERCEPTION_MODE") {
        None | Some("" | "REDIRECT") => {}
        Some("TPROXY") => c.fail(
            "ISTIO_INBOUND_INTERCEPTION_MODE",
            Problem::Unsupported("TPROXY; ambit redirects inbound traffic (REDIRECT)"),
        ),
        Some(v) => c.bad("ISTIO_INBOUND_INTERCEPTION_MODE", v, "REDIRECT"),
    }
    let redirect = (!custom).then_some(VmRedirectConfig {
        ipv6: true,
        inbound,
        outbound,
        outbound_exclude_cidrs,
        outbound_exclude_ports,
        dns_capture,
        exclude_interfaces,
    });

    let metadata = vars
        .iter()
        .filter(|(k, _)| k.starts_with("ISTIO_META_") || k.starts_with("ISTIO_METAJSON_"))
        .map(|(k, (v, _))| (k.clone(), v.clone()))
        .collect();
    let value = Settings {
        identity: Identity {
            trust_domain,
            namespace,
            service_account,
        },
        workload_name,
        canonical_service: c.non_empty("CANONICAL_SERVICE"),
        canonical_revision: c.non_empty("CANONICAL_REVISION"),
        labels,
        service: c.non_empty("ISTIO_SERVICE"),
        instance_ip,
        ca_address,
        ca_address_key,
        cluster_id: c
            .non_empty("ISTIO_META_CLUSTER_ID")
            .unwrap_or_else(|| "Kubernetes".to_owned()),
        network: c.get("ISTIO_META_NETWORK").unwrap_or_default().to_owned(),
        mesh_id: c.get("ISTIO_META_MESH_ID").unwrap_or_default().to_owned(),
        auto_register_group: c.non_empty("ISTIO_META_AUTO_REGISTER_GROUP"),
        redirect,
        metadata,
    };
    Interpreted {
        value,
        errors: c.errors,
        warnings,
    }
}

const PORTS: &str = "a comma-separated list of ports (1-65535), like 22,15090";
const BOOL: &str = "true or false";

fn list(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn ports(v: &str) -> Option<Vec<u16>> {
    if v.split(',').any(|p| p.trim().is_empty()) && !v.trim().is_empty() {
        return None;
    }
    list(v)
        .map(|p| p.parse::<u16>().ok().filter(|p| *p != 0))
        .collect()
}

fn cidrs(v: &str) -> Option<Vec<Cidr>> {
    list(v).map(|c| c.parse::<Cidr>().ok()).collect()
}

/// `host:port`, `[v6]:port`; `None` when it does not read.
pub(crate) fn split_address(a: &str) -> Option<(&str, u16)> {
    let (host, port) = a.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let host = match host.strip_prefix('[') {
        Some(h) => h.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    (!host.is_empty() && !host.contains(char::is_whitespace)).then_some((host, port))
}

fn check_address(c: &mut Ctx<'_>, key: &str, a: String) -> String {
    if split_address(&a).is_none() {
        c.bad(key, &a, "HOST:PORT, like istiod.istio-system.svc:15012");
    }
    a
}

fn is_kube_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn is_trust_domain(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let cases: &[(&str, Option<(&str, u16)>)] = &[
            (
                "istiod.istio-system.svc:15012",
                Some(("istiod.istio-system.svc", 15012)),
            ),
            ("10.0.0.1:15012", Some(("10.0.0.1", 15012))),
            ("[fd00::1]:15012", Some(("fd00::1", 15012))),
            ("fd00::1:15012", None),
            ("istiod", None),
            ("istiod:0", None),
            ("istiod:x", None),
            (":15012", None),
        ];
        for (a, want) in cases {
            assert_eq!(split_address(a), *want, "{a}");
        }
    }

    #[test]
    fn port_lists() {
        let cases: &[(&str, Option<&[u16]>)] = &[
            ("22,15090", Some(&[22, 15090])),
            (" 22 , 80 ", Some(&[22, 80])),
            ("", Some(&[])),
            ("22,,80", None),
            ("22,", None),
            ("0", None),
            ("65536", None),
            ("ssh", None),
            ("*", None),
        ];
        for (v, want) in cases {
            assert_eq!(ports(v).as_deref(), *want, "{v:?}");
        }
    }

    #[test]
    fn key_table_has_no_duplicates() {
        for (i, k) in KEYS.iter().enumerate() {
            assert!(
                !KEYS[..i].iter().any(|o| o.name == k.name),
                "{} twice",
                k.name
            );
        }
    }
}
