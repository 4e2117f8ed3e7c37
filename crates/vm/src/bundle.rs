//! The bundle `istioctl x workload entry configure` (or `ambit vm configure`) writes for a
//! VM, read into typed settings. `docs/vm.md` has the table of every key.
//!
//! - `cluster.env` (required): shell assignments ([`shell`]), one key per setting;
//! - `mesh.yaml` (optional): `defaultConfig.proxyMetadata` fills the keys cluster.env does not
//!   set (cluster.env wins on a conflict, with a warning), `defaultConfig.discoveryAddress` is
//!   the control plane when no key names one;
//! - `hosts` (optional): addresses for control-plane names;
//! - `root-cert.pem` (required): the mesh's root certificate(s);
//! - `istio-token` (required, non-empty): the bearer token the VM presents to the CA.
//!
//! Every problem of the bundle is reported at once, each naming its file, line and key.

mod files;
mod keys;
pub mod shell;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ambit_redirect::vm::VmRedirectConfig;

pub use self::files::{HostEntry, MeshFile, parse_hosts, parse_mesh};
pub(crate) use self::keys::split_address;
pub use self::keys::{KEYS, KeyKind, KeySpec};

/// The file names of a bundle.
pub const CLUSTER_ENV: &str = "cluster.env";
/// See [`CLUSTER_ENV`].
pub const MESH_YAML: &str = "mesh.yaml";
/// See [`CLUSTER_ENV`].
pub const HOSTS: &str = "hosts";
/// See [`CLUSTER_ENV`].
pub const ROOT_CERT: &str = "root-cert.pem";
/// See [`CLUSTER_ENV`].
pub const TOKEN: &str = "istio-token";

/// Bound on any bundle file: they are a few kilobytes; a larger one is not a bundle.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The workload identity the VM runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `TRUST_DOMAIN` (`cluster.local` when empty).
    pub trust_domain: String,
    /// `POD_NAMESPACE` / `ISTIO_NAMESPACE`.
    pub namespace: String,
    /// `SERVICE_ACCOUNT`.
    pub service_account: String,
}

impl Identity {
    /// `spiffe://TD/ns/NS/sa/SA`.
    pub fn spiffe_id(&self) -> String {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// A bundle, read and checked.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// The directory it was read from.
    pub dir: PathBuf,
    /// Who the VM is.
    pub identity: Identity,
    /// `ISTIO_META_WORKLOAD_NAME`: the workload (group) name.
    pub workload_name: String,
    /// `CANONICAL_SERVICE`.
    pub canonical_service: Option<String>,
    /// `CANONICAL_REVISION`.
    pub canonical_revision: Option<String>,
    /// `ISTIO_METAJSON_LABELS`: the workload's labels.
    pub labels: BTreeMap<String, String>,
    /// `ISTIO_SERVICE` (`name.namespace`), informational.
    pub service: Option<String>,
    /// `ISTIO_SVC_IP`: the VM's address in the mesh, when given.
    pub instance_ip: Option<IpAddr>,
    /// Where the CA and xDS server is (`host:port`): `CA_ADDR`, else `PILOT_ADDRESS`, else
    /// `istiod.ISTIO_SYSTEM_NAMESPACE.svc:ISTIO_PILOT_PORT`, else mesh.yaml's
    /// `discoveryAddress`, else `istiod.istio-system.svc:15012`.
    pub ca_address: String,
    /// What named [`Self::ca_address`] (`CA_ADDR`, …, `mesh.yaml defaultConfig.discoveryAddress`
    /// or `the default`), for error messages.
    pub ca_address_key: String,
    /// `ISTIO_META_CLUSTER_ID` (`Kubernetes` when empty).
    pub cluster_id: String,
    /// `ISTIO_META_NETWORK`.
    pub network: String,
    /// `ISTIO_META_MESH_ID`.
    pub mesh_id: String,
    /// `ISTIO_META_AUTO_REGISTER_GROUP`: the WorkloadGroup to register under.
    pub auto_register_group: Option<String>,
    /// The host-level rules to write; `None` with `ISTIO_CUSTOM_IP_TABLES=true` (the user
    /// manages redirection).
    pub redirect: Option<VmRedirectConfig>,
    /// Every `ISTIO_META_*` key with its value (node metadata upstream).
    pub metadata: BTreeMap<String, String>,
    /// `hosts`.
    pub hosts: Vec<HostEntry>,
    /// `root-cert.pem`, as read.
    pub root_cert_pem: String,
    /// The path of `istio-token` (read again by whoever presents it, as it may be rotated).
    pub token_path: PathBuf,
    /// What was read but not used, for the log.
    pub warnings: Vec<Warning>,
}

/// Something in the bundle ambit reads but does not act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// A key upstream uses for something ambit does not have.
    Ignored {
        /// The key.
        key: String,
        /// Why it has no effect.
        reason: &'static str,
    },
    /// A key neither upstream's VM tooling nor ambit defines (typically the user's own
    /// proxyMetadata).
    Unknown {
        /// The key.
        key: String,
    },
    /// mesh.yaml's proxyMetadata sets a key cluster.env also sets, to another value.
    Overridden {
        /// The key.
        key: String,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ignored { key, reason } => write!(f, "{key} is ignored: {reason}"),
            Self::Unknown { key } => write!(f, "{key} is not a key ambit knows; ignored"),
            Self::Overridden { key } => write!(
                f,
                "{key}: {CLUSTER_ENV} and {MESH_YAML}'s proxyMetadata disagree; {CLUSTER_ENV}'s value is used"
            ),
        }
    }
}

/// One problem of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct BundleError {
    /// The file.
    pub path: PathBuf,
    /// The line, when known.
    pub line: Option<usize>,
    /// The key (or YAML key path), when the problem is about one.
    pub key: Option<String>,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": {key}")?;
        }
        write!(f, ": {}", self.problem)
    }
}

/// What is wrong with a file or a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The file could not be read.
    Read(String),
    /// The file is larger than [`MAX_FILE_BYTES`].
    TooLarge,
    /// A line of cluster.env is not a plain assignment.
    Syntax(shell::Syntax),
    /// mesh.yaml is not YAML of the expected shape.
    Yaml(String),
    /// A proxyMetadata value is not a string.
    NotAString,
    /// A bad line of `hosts`.
    HostsLine(&'static str),
    /// root-cert.pem holds no readable certificate.
    RootCert(String),
    /// istio-token is empty.
    EmptyToken,
    /// A required key is neither in cluster.env nor in mesh.yaml's proxyMetadata.
    Missing,
    /// A value that does not read.
    BadValue {
        /// The value.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// Two keys that must agree do not.
    Disagree {
        /// The other key.
        other: &'static str,
    },
    /// A setting ambit does not support (rather than ignoring it).
    Unsupported(&'static str),
    /// An `ISTIO_*` key ambit does not know: these are upstream's interception and bootstrap
    /// settings, and a misspelt one would silently change what is captured.
    UnknownIstioKey,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read(e) => write!(f, "cannot read: {e}"),
            Self::TooLarge => write!(f, "larger than {MAX_FILE_BYTES} bytes"),
            Self::Syntax(s) => s.fmt(f),
            Self::Yaml(e) => write!(f, "not a mesh config: {e}"),
            Self::NotAString => f.write_str("expected a string (quote the value)"),
            Self::HostsLine(what) => write!(f, "expected \"ADDRESS NAME...\": {what}"),
            Self::RootCert(e) => write!(f, "no usable root certificate: {e}"),
            Self::EmptyToken => f.write_str("the token is empty"),
            Self::Missing => write!(
                f,
                "required, but set neither in {CLUSTER_ENV} nor in {MESH_YAML}'s proxyMetadata"
            ),
            Self::BadValue { value, expected } => write!(f, "{value:?}: expected {expected}"),
            Self::Disagree { other } => write!(f, "differs from {other}"),
            Self::Unsupported(what) => write!(f, "not supported by ambit: {what}"),
            Self::UnknownIstioKey => f.write_str(
                "unknown ISTIO_ key (ambit refuses unknown interception and bootstrap keys \
                 rather than ignore a misspelt one; see docs/vm.md)",
            ),
        }
    }
}

/// Every problem of a bundle, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct BundleErrors(pub Vec<BundleError>);

impl fmt::Display for BundleErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad VM bundle:")?;
        for e in &self.0 {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

/// Where a key's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    ClusterEnv { line: usize },
    MeshYaml,
}

impl Bundle {
    /// Reads and checks the bundle in `dir`.
    pub fn load(dir: &Path) -> Result<Self, BundleErrors> {
        let mut errors = Vec::new();
        let err = |errors: &mut Vec<BundleError>, file: &str, line, key, problem| {
            errors.push(BundleError {
                path: dir.join(file),
                line,
                key,
                problem,
            });
        };

        let env = read(dir, CLUSTER_ENV, true);
        let mesh = read(dir, MESH_YAML, false);
        let hosts = read(dir, HOSTS, false);
        let root = read(dir, ROOT_CERT, true);
        let token = read(dir, TOKEN, true);

        let mut vars: BTreeMap<String, (String, Origin)> = BTreeMap::new();
        match env {
            Ok(Some(text)) => {
                let (assignments, bad) = shell::parse(&text);
                for a in assignments {
                    vars.insert(a.key, (a.value, Origin::ClusterEnv { line: a.line }));
                }
                for e in bad {
                    err(
                        &mut errors,
                        CLUSTER_ENV,
                        Some(e.line),
                        None,
                        Problem::Syntax(e.problem),
                    );
                }
            }
            Ok(None) => {}
            Err(p) => err(&mut errors, CLUSTER_ENV, None, None, p),
        }

        let mut warnings = Vec::new();
        let mut mesh_file = MeshFile::default();
        match mesh {
            Ok(Some(text)) => match parse_mesh(&text) {
                Ok(m) => mesh_file = m,
                Err(es) => {
                    for (key, p) in es {
                        err(&mut errors, MESH_YAML, None, key, p);
                    }
                }
            },
            Ok(None) => {}
            Err(p) => err(&mut errors, MESH_YAML, None, None, p),
        }
        for (k, v) in &mesh_file.proxy_metadata {
            match vars.get(k) {
                Some((existing, _)) if existing != v => {
                    warnings.push(Warning::Overridden { key: k.clone() })
                }
                Some(_) => {}
                None => {
                    vars.insert(k.clone(), (v.clone(), Origin::MeshYaml));
                }
            }
        }

        let mut host_entries = Vec::new();
        match hosts {
            Ok(Some(text)) => match parse_hosts(&text) {
                Ok(h) => host_entries = h,
                Err(es) => {
                    for (line, p) in es {
                        err(&mut errors, HOSTS, Some(line), None, p);
                    }
                }
            },
            Ok(None) => {}
            Err(p) => err(&mut errors, HOSTS, None, None, p),
        }

        let mut root_cert_pem = String::new();
        match root {
            Ok(Some(text)) => match files::check_root_cert(&text) {
                Ok(()) => root_cert_pem = text,
                Err(p) => err(&mut errors, ROOT_CERT, None, None, p),
            },
            Ok(None) => {}
            Err(p) => err(&mut errors, ROOT_CERT, None, None, p),
        }
        match token {
            Ok(Some(text)) if text.trim().is_empty() => {
                err(&mut errors, TOKEN, None, None, Problem::EmptyToken)
            }
            Ok(_) => {}
            Err(p) => err(&mut errors, TOKEN, None, None, p),
        }

        let settings = keys::interpret(&vars, mesh_file.discovery_address.as_deref());
        for (key, origin, problem) in settings.errors {
            let (file, line) = match origin {
                Some(Origin::ClusterEnv { line }) => (CLUSTER_ENV, Some(line)),
                Some(Origin::MeshYaml) => (MESH_YAML, None),
                None => (CLUSTER_ENV, None),
            };
            let key = match origin {
                Some(Origin::MeshYaml) => format!("defaultConfig.proxyMetadata.{key}"),
                _ => key,
            };
            err(&mut errors, file, line, Some(key), problem);
        }
        warnings.extend(settings.warnings);

        if !errors.is_empty() {
            // By file, then line (a key without a line after the file's lines).
            errors.sort_by(|a, b| {
                (&a.path, a.line.unwrap_or(usize::MAX))
                    .cmp(&(&b.path, b.line.unwrap_or(usize::MAX)))
            });
            return Err(BundleErrors(errors));
        }
        let s = settings.value;
        Ok(Self {
            dir: dir.to_path_buf(),
            identity: s.identity,
            workload_name: s.workload_name,
            canonical_service: s.canonical_service,
            canonical_revision: s.canonical_revision,
            labels: s.labels,
            service: s.service,
            instance_ip: s.instance_ip,
            ca_address: s.ca_address,
            ca_address_key: s.ca_address_key,
            cluster_id: s.cluster_id,
            network: s.network,
            mesh_id: s.mesh_id,
            auto_register_group: s.auto_register_group,
            redirect: s.redirect,
            metadata: s.metadata,
            hosts: host_entries,
            root_cert_pem,
            token_path: dir.join(TOKEN),
            warnings,
        })
    }

    /// The address `hosts` gives for `name`, if any (first match, as `/etc/hosts`).
    pub fn host_address(&self, name: &str) -> Option<IpAddr> {
        self.hosts
            .iter()
            .find(|h| h.names.iter().any(|n| n.eq_ignore_ascii_case(name)))
            .map(|h| h.ip)
    }
}

/// Reads `dir/name`; `Ok(None)` when an optional file is absent.
fn read(dir: &Path, name: &str, required: bool) -> Result<Option<String>, Problem> {
    use std::io::Read;
    let path = dir.join(name);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(None),
        Err(e) => return Err(Problem::Read(e.to_string())),
    };
    let mut text = String::new();
    let n = file
        .take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| Problem::Read(e.to_string()))?;
    if n as u64 > MAX_FILE_BYTES {
        return Err(Problem::TooLarge);
    }
    Ok(Some(text))
}
