//! The bundle's other files: `mesh.yaml` (its `defaultConfig`), `hosts`, `root-cert.pem`
//! and `istio-token`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

use super::Problem;

/// What ambit reads of `mesh.yaml`: `defaultConfig.discoveryAddress` and
/// `defaultConfig.proxyMetadata`. Every other key of the mesh config (readiness probe,
/// tracing, …) is about Envoy or istiod and is left alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshFile {
    /// `defaultConfig.discoveryAddress`.
    pub discovery_address: Option<String>,
    /// `defaultConfig.proxyMetadata`, in key order.
    pub proxy_metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMesh {
    #[serde(default)]
    default_config: Option<RawProxyConfig>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawProxyConfig {
    #[serde(default)]
    discovery_address: Option<String>,
    #[serde(default)]
    proxy_metadata: Option<BTreeMap<String, serde_norway::Value>>,
}

/// Reads `mesh.yaml`. A proxyMetadata value that is not a string (`true` unquoted) is
/// refused, naming its key: the field is a map of strings, and upstream refuses it too.
pub fn parse_mesh(text: &str) -> Result<MeshFile, Vec<(Option<String>, Problem)>> {
    if text.trim().is_empty() {
        return Ok(MeshFile::default());
    }
    let raw: RawMesh =
        serde_norway::from_str(text).map_err(|e| vec![(None, Problem::Yaml(e.to_string()))])?;
    let Some(dc) = raw.default_config else {
        return Ok(MeshFile::default());
    };
    let mut errors = Vec::new();
    let mut proxy_metadata = BTreeMap::new();
    for (k, v) in dc.proxy_metadata.unwrap_or_default() {
        match v {
            serde_norway::Value::String(s) => {
                proxy_metadata.insert(k, s);
            }
            _ => errors.push((
                Some(format!("defaultConfig.proxyMetadata.{k}")),
                Problem::NotAString,
            )),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(MeshFile {
        discovery_address: dc.discovery_address.filter(|a| !a.is_empty()),
        proxy_metadata,
    })
}

/// One line of the bundle's `hosts` file (`/etc/hosts` syntax): the address the VM reaches
/// a control-plane name at (istioctl writes the east-west gateway's address for istiod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// The address.
    pub ip: IpAddr,
    /// The names that resolve to it.
    pub names: Vec<String>,
}

/// Reads `hosts`; every bad line is reported with its number.
pub fn parse_hosts(text: &str) -> Result<Vec<HostEntry>, Vec<(usize, Problem)>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        let Some(addr) = words.next() else { continue };
        let names: Vec<String> = words.map(str::to_owned).collect();
        match addr.parse::<IpAddr>() {
            Ok(ip) if !names.is_empty() => out.push(HostEntry { ip, names }),
            Ok(_) => errors.push((i + 1, Problem::HostsLine("an address without a name"))),
            Err(_) => errors.push((i + 1, Problem::HostsLine("not an IP address"))),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Checks that `root-cert.pem` holds at least one certificate and that every PEM block in it
/// reads.
pub fn check_root_cert(text: &str) -> Result<(), Problem> {
    ambit_tls::cert::parse_certs_pem(text)
        .map(|_| ())
        .map_err(|e| Problem::RootCert(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh() {
        let m = parse_mesh(
            "defaultConfig:\n  discoveryAddress: istiod.x.svc:15012\n  proxyMetadata:\n    A: \"true\"\n    B: ''\n  readinessProbe:\n    httpGet:\n      port: 8080\n",
        )
        .expect("good");
        assert_eq!(m.discovery_address.as_deref(), Some("istiod.x.svc:15012"));
        assert_eq!(m.proxy_metadata.get("A").map(String::as_str), Some("true"));
        assert_eq!(m.proxy_metadata.get("B").map(String::as_str), Some(""));
        assert_eq!(parse_mesh("").expect("empty"), MeshFile::default());
        assert_eq!(
            parse_mesh("{}\n").expect("no defaultConfig"),
            MeshFile::default()
        );
        let errs = parse_mesh("defaultConfig:\n  proxyMetadata:\n    A: true\n").expect_err("bool");
        assert_eq!(errs[0].0.as_deref(), Some("defaultConfig.proxyMetadata.A"));
        assert!(parse_mesh("defaultConfig: [").is_err());
    }

    #[test]
    fn hosts() {
        let h =
            parse_hosts("# comment\n10.0.0.1 istiod.istio-system.svc istiod # tail\n\nfd00::1 a\n")
                .expect("good");
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].names, vec!["istiod.istio-system.svc", "istiod"]);
        let errs = parse_hosts("10.0.0.1\nnot-an-ip name\n").expect_err("bad");
        let lines: Vec<usize> = errs.iter().map(|e| e.0).collect();
        assert_eq!(lines, vec![1, 2]);
    }
}
