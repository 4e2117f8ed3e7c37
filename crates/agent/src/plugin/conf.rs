//! The plugin's network configuration (`spec/cni.md` §5.2), its `prevResult`, and the
//! `/cmdadd` request body (§5.3) shared with the agent's server.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{CniError, SUPPORTED_VERSIONS, codes};

fn default_run_dir() -> String {
    "/var/run/istio-cni".to_owned()
}

/// The keys of the istio-cni config entry that the plugin uses (others are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct PluginConf {
    /// Spec version of the config (and of the result we print).
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// `name`.
    #[serde(default)]
    pub name: String,
    /// `type` (`istio-cni`).
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    /// `plugin_log_level`.
    #[serde(default)]
    pub plugin_log_level: String,
    /// Directory of the agent's sockets.
    #[serde(default = "default_run_dir")]
    pub cni_agent_run_dir: String,
    /// Whether the ambient logic runs at all.
    #[serde(default)]
    pub ambient_enabled: bool,
    /// Namespaces whose pods are never enrolled.
    #[serde(default)]
    pub exclude_namespaces: Vec<String>,
    /// Namespace of the agent's own pods (self-pod shortcut).
    #[serde(default)]
    pub pod_namespace: Option<String>,
    /// The previous plugin's result.
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<Value>,
}

/// Parses stdin; the config must be a JSON object with a supported `cniVersion`.
pub fn parse(stdin: &[u8]) -> Result<PluginConf, CniError> {
    let mut conf: PluginConf = serde_json::from_slice(stdin).map_err(|e| CniError {
        code: codes::DECODE,
        msg: "decoding network configuration".into(),
        details: e.to_string(),
    })?;
    if conf.cni_version.is_empty() {
        // libcni treats a missing version as the first spec version.
        conf.cni_version = "0.1.0".into();
    }
    if !SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
        return Err(CniError {
            code: codes::INCOMPATIBLE_VERSION,
            msg: "incompatible CNI version".into(),
            details: format!(
                "config version {:?}; plugin supports {SUPPORTED_VERSIONS:?}",
                conf.cni_version
            ),
        });
    }
    if conf.prev_result.as_ref().is_some_and(|p| !p.is_object()) {
        return Err(CniError {
            code: codes::INVALID_CONFIG,
            msg: "prevResult is not an object".into(),
            details: String::new(),
        });
    }
    Ok(conf)
}

/// One address of the pod as Go encodes `net.IPNet`: `IP` text and `Mask` as base64 of the
/// raw mask bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmdAddIpNet {
    /// Address text.
    #[serde(rename = "IP")]
    pub ip: String,
    /// Base64 of the mask bytes (4 for IPv4, 16 for IPv6).
    #[serde(rename = "Mask")]
    pub mask: String,
}

/// One entry of `IPs` (Go `current.IPConfig` with default field names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmdAddIp {
    /// Index into the result's interfaces (may be null).
    #[serde(rename = "Interface")]
    pub interface: Option<i64>,
    /// The address.
    #[serde(rename = "Address")]
    pub address: CmdAddIpNet,
    /// Gateway text (`""` when none, as Go prints a nil `net.IP`).
    #[serde(rename = "Gateway", default)]
    pub gateway: String,
}

/// The `/cmdadd` body (§5.3, exact Go field names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmdAddRequest {
    /// `CNI_NETNS` as the runtime passed it.
    #[serde(rename = "Netns")]
    pub netns: String,
    /// `K8S_POD_NAME`.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// `K8S_POD_NAMESPACE`.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// The pod's addresses from `prevResult`.
    #[serde(rename = "IPs", default)]
    pub ips: Vec<CmdAddIp>,
}

impl PluginConf {
    /// The addresses of `prevResult` in `/cmdadd` form (0.3+ `ips` or 0.2 `ip4`/`ip6`).
    pub fn prev_ips(&self) -> Vec<CmdAddIp> {
        let Some(prev) = self.prev_result.as_ref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Some(ips) = prev.get("ips").and_then(Value::as_array) {
            for ip in ips {
                if let Some(address) = ip.get("address").and_then(Value::as_str).and_then(ipnet) {
                    out.push(CmdAddIp {
                        interface: ip.get("interface").and_then(Value::as_i64),
                        address,
                        gateway: str_of(ip, "gateway"),
                    });
                }
            }
        }
        for key in ["ip4", "ip6"] {
            if let Some(cfg) = prev.get(key)
                && let Some(address) = cfg.get("ip").and_then(Value::as_str).and_then(ipnet)
            {
                out.push(CmdAddIp {
                    interface: None,
                    address,
                    gateway: str_of(cfg, "gateway"),
                });
            }
        }
        out
    }

    /// What ADD prints: `prevResult` converted to the config's `cniVersion`, or an empty
    /// result when there is none.
    pub fn result_output(&self) -> Result<Vec<u8>, CniError> {
        let v = self.cni_version.as_str();
        let result = match &self.prev_result {
            None => json!({"cniVersion": v, "dns": {}}),
            Some(prev) => convert_result(prev, v),
        };
        serde_json::to_vec(&result).map_err(|e| CniError {
            code: codes::INTERNAL,
            msg: "encoding result".into(),
            details: e.to_string(),
        })
    }
}

fn str_of(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn is_legacy(version: &str) -> bool {
    matches!(version, "0.1.0" | "0.2.0")
}

/// Re-expresses a result in `version`: the 0.1/0.2 shape (`ip4`, `ip6`) or the 0.3+ shape
/// (`interfaces`, `ips`, `routes`), where `ips[].version` exists only before 1.0.
fn convert_result(prev: &Value, version: &str) -> Value {
    let mut prev = prev.as_object().cloned().unwrap_or_default();
    let mut ips: Vec<Value> = prev
        .remove("ips")
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    // Bring a legacy result into the 0.3+ shape first.
    for (key, fam) in [("ip4", "4"), ("ip6", "6")] {
        if let Some(cfg) = prev.remove(key) {
            let mut ip = Map::new();
            ip.insert("version".into(), fam.into());
            if let Some(a) = cfg.get("ip") {
                ip.insert("address".into(), a.clone());
            }
            if let Some(g) = cfg.get("gateway") {
                ip.insert("gateway".into(), g.clone());
            }
            ips.push(Value::Object(ip));
            if let Some(routes) = cfg.get("routes").and_then(Value::as_array) {
                let all = prev
                    .entry("routes")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Some(all) = all.as_array_mut() {
                    all.extend(routes.iter().cloned());
                }
            }
        }
    }
    let mut out = Map::new();
    out.insert("cniVersion".into(), version.into());
    if is_legacy(version) {
        for ip in &ips {
            let addr = ip.get("address").and_then(Value::as_str).unwrap_or("");
            let key = if addr.contains(':') { "ip6" } else { "ip4" };
            if out.contains_key(key) {
                continue;
            }
            let mut cfg = Map::new();
            cfg.insert("ip".into(), addr.into());
            if let Some(g) = ip.get("gateway") {
                cfg.insert("gateway".into(), g.clone());
            }
            out.insert(key.into(), Value::Object(cfg));
        }
        if let Some(dns) = prev.remove("dns") {
            out.insert("dns".into(), dns);
        }
        return Value::Object(out);
    }
    for ip in &mut ips {
        if let Some(obj) = ip.as_object_mut() {
            if version.starts_with("0.") {
                let fam = if obj
                    .get("address")
                    .and_then(Value::as_str)
                    .is_some_and(|a| a.contains(':'))
                {
                    "6"
                } else {
                    "4"
                };
                obj.entry("version").or_insert_with(|| fam.into());
            } else {
                obj.remove("version");
            }
        }
    }
    for (k, v) in prev {
        if k != "cniVersion" {
            out.insert(k, v);
        }
    }
    if !ips.is_empty() {
        out.insert("ips".into(), Value::Array(ips));
    }
    out.entry("dns").or_insert_with(|| json!({}));
    Value::Object(out)
}

/// `"10.0.0.5/24"` → Go's `net.IPNet` JSON.
fn ipnet(cidr: &str) -> Option<CmdAddIpNet> {
    let (ip, len) = cidr.split_once('/')?;
    let ip: std::net::IpAddr = ip.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    let bytes = if ip.is_ipv4() { 4 } else { 16 };
    if len > bytes * 8 {
        return None;
    }
    let mask: Vec<u8> = (0..bytes)
        .map(|i| {
            let bits = len.saturating_sub(i * 8).min(8);
            // `bits` is 0..=8, so the shift result fits a byte after the mask.
            (0xff00u16 >> bits) as u8
        })
        .collect();
    Some(CmdAddIpNet {
        ip: ip.to_string(),
        // Standard base64 with padding: what Go uses for `[]byte` in JSON.
        mask: base64::engine::general_purpose::STANDARD.encode(&mask),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        for (cidr, ip, mask) in [
            ("10.244.1.5/24", "10.244.1.5", "////AA=="),
            ("10.0.0.1/32", "10.0.0.1", "/////w=="),
            ("10.0.0.1/0", "10.0.0.1", "AAAAAA=="),
            ("10.0.0.1/20", "10.0.0.1", "///wAA=="),
            ("fd00::5/64", "fd00::5", "//////////8AAAAAAAAAAA=="),
        ] {
            assert_eq!(
                ipnet(cidr),
                Some(CmdAddIpNet {
                    ip: ip.into(),
                    mask: mask.into()
                }),
                "{cidr}"
            );
        }
        for bad in ["10.0.0.1", "10.0.0.1/33", "x/8", "fd00::/129"] {
            assert_eq!(ipnet(bad), None, "{bad}");
        }
    }
}
