//! Reading a VM bundle: every cluster.env key's effect, mesh.yaml's proxyMetadata, and bad
//! bundles (each error names its file, line and key).

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use ambit_redirect::vm::{InboundCapture, OutboundCapture};
use ambit_vm::bundle::{self, Bundle, KEYS, KeyKind, Warning};

/// The cluster.env istioctl writes for WorkloadGroup `foo` in `bar` (issue 16's example).
const CLUSTER_ENV: &[(&str, &str)] = &[
    ("CANONICAL_REVISION", "latest"),
    ("CANONICAL_SERVICE", "foo"),
    ("CA_ADDR", "istiod-rev-1.istio-system.svc:15012"),
    ("ISTIO_INBOUND_PORTS", "*"),
    ("ISTIO_LOCAL_EXCLUDE_PORTS", "22,15090,15021,15020"),
    (
        "ISTIO_METAJSON_LABELS",
        r#"{"service.istio.io/canonical-name":"foo","service.istio.io/canonical-revision":"latest"}"#,
    ),
    ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
    ("ISTIO_META_DNS_CAPTURE", "true"),
    ("ISTIO_META_MESH_ID", ""),
    ("ISTIO_META_NETWORK", ""),
    ("ISTIO_META_WORKLOAD_NAME", "foo"),
    ("ISTIO_NAMESPACE", "bar"),
    ("ISTIO_SERVICE", "foo.bar"),
    ("ISTIO_SERVICE_CIDR", "*"),
    ("ISTIO_SVC_IP", "10.10.10.10"),
    ("POD_NAMESPACE", "bar"),
    ("SERVICE_ACCOUNT", "vm-serviceaccount"),
    ("TRUST_DOMAIN", ""),
];

const MESH_YAML: &str = "defaultConfig:
  discoveryAddress: istiod-rev-1.istio-system.svc:15012
  proxyMetadata:
    CANONICAL_SERVICE: foo
    ISTIO_META_DNS_CAPTURE: \"true\"
    SERVICE_ACCOUNT: vm-serviceaccount
  readinessProbe:
    httpGet:
      port: 8080
";

/// istioctl's quoting (`shellescape.Quote`): single quotes, `'` as `'"'"'`.
fn quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r#"'"'"'"#))
}

struct Files {
    env: BTreeMap<String, String>,
    mesh: Option<String>,
    hosts: Option<String>,
    root: Option<String>,
    token: Option<String>,
    /// Written as cluster.env verbatim instead of `env`.
    raw_env: Option<String>,
    /// No cluster.env at all.
    no_env: bool,
}

fn root_pem() -> String {
    ambit_tls::LocalCa::generate("cluster.local")
        .unwrap()
        .root_pem()
        .to_owned()
}

impl Files {
    fn good() -> Self {
        Self {
            env: CLUSTER_ENV
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            mesh: Some(MESH_YAML.to_owned()),
            hosts: Some("10.10.10.11 istiod-rev-1.istio-system.svc\n".to_owned()),
            root: Some(root_pem()),
            token: Some("eyJhbGciOi.token\n".to_owned()),
            raw_env: None,
            no_env: false,
        }
    }

    fn write(&self, dir: &Path) {
        let env = self.raw_env.clone().unwrap_or_else(|| {
            self.env
                .iter()
                .map(|(k, v)| format!("{k}={}\n", quote(v)))
                .collect()
        });
        if !self.no_env {
            std::fs::write(dir.join("cluster.env"), env).unwrap();
        }
        for (name, content) in [
            ("mesh.yaml", &self.mesh),
            ("hosts", &self.hosts),
            ("root-cert.pem", &self.root),
            ("istio-token", &self.token),
        ] {
            if let Some(c) = content {
                std::fs::write(dir.join(name), c).unwrap();
            }
        }
    }

    fn load(&self) -> (tempfile::TempDir, Result<Bundle, bundle::BundleErrors>) {
        let dir = tempfile::tempdir().unwrap();
        self.write(dir.path());
        let b = Bundle::load(dir.path());
        (dir, b)
    }
}

type Edit = fn(&mut Files);

fn set(f: &mut Files, k: &str, v: &str) {
    f.env.insert(k.to_owned(), v.to_owned());
}

fn unset(f: &mut Files, k: &str) {
    f.env.remove(k);
}

#[test]
fn istioctl_bundle_reads() {
    let (_d, b) = Files::good().load();
    let b = b.unwrap();
    assert_eq!(
        b.identity.spiffe_id(),
        "spiffe://cluster.local/ns/bar/sa/vm-serviceaccount"
    );
    assert_eq!(b.workload_name, "foo");
    assert_eq!(b.ca_address, "istiod-rev-1.istio-system.svc:15012");
    assert_eq!(b.cluster_id, "Kubernetes");
    assert_eq!(b.instance_ip, Some("10.10.10.10".parse().unwrap()));
    assert_eq!(
        b.labels
            .get("service.istio.io/canonical-name")
            .map(String::as_str),
        Some("foo")
    );
    assert_eq!(
        b.host_address("istiod-rev-1.istio-system.svc"),
        Some("10.10.10.11".parse::<IpAddr>().unwrap())
    );
    let r = b.redirect.unwrap();
    assert_eq!(
        r.inbound,
        InboundCapture::All {
            except: vec![22, 15090, 15021, 15020]
        }
    );
    assert_eq!(r.outbound, OutboundCapture::All);
    assert!(r.dns_capture);
    assert!(b.warnings.is_empty(), "{:?}", b.warnings);
}

/// One case per key: the key set (or removed) on top of the istioctl bundle, and what the
/// bundle then says.
#[test]
fn every_key_has_its_effect() {
    type Check = fn(&Bundle);
    let cases: &[(&str, Edit, Check)] = &[
        (
            "SERVICE_ACCOUNT",
            |f| set(f, "SERVICE_ACCOUNT", "other-sa"),
            |b| assert_eq!(b.identity.service_account, "other-sa"),
        ),
        (
            "POD_NAMESPACE only",
            |f| unset(f, "ISTIO_NAMESPACE"),
            |b| assert_eq!(b.identity.namespace, "bar"),
        ),
        (
            "ISTIO_NAMESPACE only",
            |f| unset(f, "POD_NAMESPACE"),
            |b| assert_eq!(b.identity.namespace, "bar"),
        ),
        (
            "ISTIO_META_WORKLOAD_NAME",
            |f| set(f, "ISTIO_META_WORKLOAD_NAME", "vm-1"),
            |b| assert_eq!(b.workload_name, "vm-1"),
        ),
        (
            "TRUST_DOMAIN",
            |f| set(f, "TRUST_DOMAIN", "example.org"),
            |b| {
                assert_eq!(
                    b.identity.spiffe_id(),
                    "spiffe://example.org/ns/bar/sa/vm-serviceaccount"
                )
            },
        ),
        (
            "CA_ADDR",
            |f| set(f, "CA_ADDR", "10.0.0.9:15012"),
            |b| assert_eq!(b.ca_address, "10.0.0.9:15012"),
        ),
        (
            "PILOT_ADDRESS without CA_ADDR",
            |f| {
                unset(f, "CA_ADDR");
                set(f, "PILOT_ADDRESS", "cp.example:443");
            },
            |b| assert_eq!(b.ca_address, "cp.example:443"),
        ),
        (
            "ISTIO_PILOT_PORT and ISTIO_SYSTEM_NAMESPACE",
            |f| {
                unset(f, "CA_ADDR");
                set(f, "ISTIO_PILOT_PORT", "15010");
                set(f, "ISTIO_SYSTEM_NAMESPACE", "mesh");
            },
            |b| assert_eq!(b.ca_address, "istiod.mesh.svc:15010"),
        ),
        (
            "mesh.yaml discoveryAddress without CA_ADDR",
            |f| {
                unset(f, "CA_ADDR");
                f.mesh = Some("defaultConfig:\n  discoveryAddress: cp.mesh:15012\n".into());
            },
            |b| assert_eq!(b.ca_address, "cp.mesh:15012"),
        ),
        (
            "no control-plane key at all",
            |f| {
                unset(f, "CA_ADDR");
                f.mesh = None;
            },
            |b| assert_eq!(b.ca_address, "istiod.istio-system.svc:15012"),
        ),
        (
            "ISTIO_META_CLUSTER_ID",
            |f| set(f, "ISTIO_META_CLUSTER_ID", "east"),
            |b| assert_eq!(b.cluster_id, "east"),
        ),
        (
            "ISTIO_META_CLUSTER_ID empty",
            |f| set(f, "ISTIO_META_CLUSTER_ID", ""),
            |b| assert_eq!(b.cluster_id, "Kubernetes"),
        ),
        (
            "ISTIO_META_NETWORK",
            |f| set(f, "ISTIO_META_NETWORK", "vm-net"),
            |b| assert_eq!(b.network, "vm-net"),
        ),
        (
            "ISTIO_META_MESH_ID",
            |f| set(f, "ISTIO_META_MESH_ID", "m1"),
            |b| assert_eq!(b.mesh_id, "m1"),
        ),
        (
            "ISTIO_METAJSON_LABELS",
            |f| set(f, "ISTIO_METAJSON_LABELS", r#"{"app":"db","version":"v2"}"#),
            |b| {
                assert_eq!(b.labels.len(), 2);
                assert_eq!(b.labels["app"], "db");
            },
        ),
        (
            "ISTIO_METAJSON_LABELS absent",
            |f| unset(f, "ISTIO_METAJSON_LABELS"),
            |b| assert!(b.labels.is_empty()),
        ),
        (
            "CANONICAL_SERVICE",
            |f| set(f, "CANONICAL_SERVICE", "svc"),
            |b| assert_eq!(b.canonical_service.as_deref(), Some("svc")),
        ),
        (
            "CANONICAL_REVISION",
            |f| set(f, "CANONICAL_REVISION", "v9"),
            |b| assert_eq!(b.canonical_revision.as_deref(), Some("v9")),
        ),
        (
            "ISTIO_SERVICE",
            |f| set(f, "ISTIO_SERVICE", "x.bar"),
            |b| assert_eq!(b.service.as_deref(), Some("x.bar")),
        ),
        (
            "ISTIO_SVC_IP v6",
            |f| set(f, "ISTIO_SVC_IP", "fd00::7"),
            |b| assert_eq!(b.instance_ip, Some("fd00::7".parse().unwrap())),
        ),
        (
            "ISTIO_SVC_IP empty",
            |f| set(f, "ISTIO_SVC_IP", ""),
            |b| assert_eq!(b.instance_ip, None),
        ),
        (
            "ISTIO_INBOUND_PORTS listed",
            |f| set(f, "ISTIO_INBOUND_PORTS", "80,8080"),
            |b| {
                assert_eq!(
                    b.redirect.as_ref().unwrap().inbound,
                    InboundCapture::Ports(vec![80, 8080])
                )
            },
        ),
        (
            "ISTIO_INBOUND_PORTS empty",
            |f| set(f, "ISTIO_INBOUND_PORTS", ""),
            |b| assert_eq!(b.redirect.as_ref().unwrap().inbound, InboundCapture::None),
        ),
        (
            "ISTIO_LOCAL_EXCLUDE_PORTS",
            |f| set(f, "ISTIO_LOCAL_EXCLUDE_PORTS", "22,2222"),
            |b| {
                assert_eq!(
                    b.redirect.as_ref().unwrap().inbound,
                    InboundCapture::All {
                        except: vec![22, 2222]
                    }
                )
            },
        ),
        (
            "ISTIO_LOCAL_EXCLUDE_PORTS absent keeps SSH out",
            |f| unset(f, "ISTIO_LOCAL_EXCLUDE_PORTS"),
            |b| {
                assert_eq!(
                    b.redirect.as_ref().unwrap().inbound,
                    InboundCapture::All {
                        except: vec![22, 15090, 15021, 15020]
                    }
                )
            },
        ),
        (
            "ISTIO_SERVICE_CIDR listed",
            |f| set(f, "ISTIO_SERVICE_CIDR", "10.96.0.0/12, fd00::/108"),
            |b| {
                let OutboundCapture::Cidrs(c) = &b.redirect.as_ref().unwrap().outbound else {
                    panic!("not cidrs")
                };
                let c: Vec<String> = c.iter().map(ToString::to_string).collect();
                assert_eq!(c, vec!["10.96.0.0/12", "fd00::/108"]);
            },
        ),
        (
            "ISTIO_SERVICE_CIDR empty",
            |f| set(f, "ISTIO_SERVICE_CIDR", ""),
            |b| assert_eq!(b.redirect.as_ref().unwrap().outbound, OutboundCapture::None),
        ),
        (
            "ISTIO_SERVICE_EXCLUDE_CIDR",
            |f| set(f, "ISTIO_SERVICE_EXCLUDE_CIDR", "169.254.169.254/32"),
            |b| {
                let r = b.redirect.as_ref().unwrap();
                assert_eq!(r.outbound_exclude_cidrs.len(), 1);
                assert_eq!(
                    r.outbound_exclude_cidrs[0].to_string(),
                    "169.254.169.254/32"
                );
            },
        ),
        (
            "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",
            |f| set(f, "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", "5432,6379"),
            |b| {
                assert_eq!(
                    b.redirect.as_ref().unwrap().outbound_exclude_ports,
                    vec![5432, 6379]
                )
            },
        ),
        (
            "ISTIO_EXCLUDE_INTERFACES",
            |f| set(f, "ISTIO_EXCLUDE_INTERFACES", "eth1,wg0"),
            |b| {
                let names: Vec<String> = b
                    .redirect
                    .as_ref()
                    .unwrap()
                    .exclude_interfaces
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                assert_eq!(names, vec!["eth1", "wg0"]);
            },
        ),
        (
            "ISTIO_META_DNS_CAPTURE false",
            |f| set(f, "ISTIO_META_DNS_CAPTURE", "false"),
            |b| assert!(!b.redirect.as_ref().unwrap().dns_capture),
        ),
        (
            "ISTIO_META_DNS_CAPTURE absent (istioctl --capture-dns=false)",
            |f| {
                unset(f, "ISTIO_META_DNS_CAPTURE");
                f.mesh = None;
            },
            |b| assert!(!b.redirect.as_ref().unwrap().dns_capture),
        ),
        (
            "ISTIO_CUSTOM_IP_TABLES",
            |f| set(f, "ISTIO_CUSTOM_IP_TABLES", "true"),
            |b| assert!(b.redirect.is_none()),
        ),
        (
            "ISTIO_INBOUND_INTERCEPTION_MODE REDIRECT",
            |f| set(f, "ISTIO_INBOUND_INTERCEPTION_MODE", "REDIRECT"),
            |b| assert!(b.redirect.is_some()),
        ),
        (
            "ISTIO_META_AUTO_REGISTER_GROUP",
            |f| set(f, "ISTIO_META_AUTO_REGISTER_GROUP", "foo"),
            |b| assert_eq!(b.auto_register_group.as_deref(), Some("foo")),
        ),
        (
            "ISTIO_META_POD_PORTS",
            |f| {
                set(
                    f,
                    "ISTIO_META_POD_PORTS",
                    r#"[{"name":"http","containerPort":8080}]"#,
                )
            },
            |b| assert!(b.metadata.contains_key("ISTIO_META_POD_PORTS")),
        ),
        (
            "an unknown ISTIO_META_ key is metadata",
            |f| set(f, "ISTIO_META_FOO", "bar"),
            |b| {
                assert_eq!(b.metadata["ISTIO_META_FOO"], "bar");
                assert!(b.warnings.is_empty());
            },
        ),
        (
            "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION is ignored with a warning",
            |f| set(f, "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", "true"),
            |b| {
                assert!(matches!(&b.warnings[..], [Warning::Ignored { key, .. }]
                    if key == "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION"))
            },
        ),
        (
            "a user's own proxyMetadata key is accepted with a warning",
            |f| set(f, "CLUSTER_MESH_CONFIG_VALUE", "foo"),
            |b| {
                assert_eq!(
                    b.warnings,
                    vec![Warning::Unknown {
                        key: "CLUSTER_MESH_CONFIG_VALUE".into()
                    }]
                )
            },
        ),
        (
            "mesh.yaml proxyMetadata fills a key cluster.env lacks",
            |f| {
                unset(f, "SERVICE_ACCOUNT");
                f.mesh = Some(
                    "defaultConfig:\n  proxyMetadata:\n    SERVICE_ACCOUNT: from-mesh\n".into(),
                );
            },
            |b| assert_eq!(b.identity.service_account, "from-mesh"),
        ),
        (
            "cluster.env wins over mesh.yaml, with a warning",
            |f| {
                f.mesh = Some(
                    "defaultConfig:\n  proxyMetadata:\n    SERVICE_ACCOUNT: from-mesh\n".into(),
                );
            },
            |b| {
                assert_eq!(b.identity.service_account, "vm-serviceaccount");
                assert_eq!(
                    b.warnings,
                    vec![Warning::Overridden {
                        key: "SERVICE_ACCOUNT".into()
                    }]
                );
            },
        ),
        (
            "optional files absent",
            |f| {
                f.mesh = None;
                f.hosts = None;
            },
            |b| assert!(b.hosts.is_empty()),
        ),
        (
            "shell quoting as istioctl writes an embedded quote",
            |f| set(f, "CANONICAL_REVISION", "it's"),
            |b| assert_eq!(b.canonical_revision.as_deref(), Some("it's")),
        ),
    ];
    let mut failures = Vec::new();
    for (name, edit, check) in cases {
        let mut f = Files::good();
        edit(&mut f);
        let (_d, b) = f.load();
        match b {
            Ok(b) => {
                if let Err(e) = std::panic::catch_unwind(|| check(&b)) {
                    failures.push(format!("{name}: {e:?}"));
                }
            }
            Err(e) => failures.push(format!("{name}: refused: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Bad bundles: each case names the file, line (if any) and key the error must name.
#[test]
fn bad_bundles_name_file_line_and_key() {
    struct Bad {
        name: &'static str,
        edit: Edit,
        file: &'static str,
        line: Option<usize>,
        key: Option<&'static str>,
        says: &'static str,
    }
    // Keys sort, so line numbers follow the sorted istioctl order of CLUSTER_ENV plus edits.
    let cases = [
        Bad {
            name: "missing SERVICE_ACCOUNT",
            edit: |f| {
                unset(f, "SERVICE_ACCOUNT");
                f.mesh = None;
            },
            file: "cluster.env",
            line: None,
            key: Some("SERVICE_ACCOUNT"),
            says: "required",
        },
        Bad {
            name: "missing namespace",
            edit: |f| {
                unset(f, "POD_NAMESPACE");
                unset(f, "ISTIO_NAMESPACE");
            },
            file: "cluster.env",
            line: None,
            key: Some("POD_NAMESPACE"),
            says: "required",
        },
        Bad {
            name: "missing workload name",
            edit: |f| unset(f, "ISTIO_META_WORKLOAD_NAME"),
            file: "cluster.env",
            line: None,
            key: Some("ISTIO_META_WORKLOAD_NAME"),
            says: "required",
        },
        Bad {
            name: "namespaces disagree",
            edit: |f| set(f, "ISTIO_NAMESPACE", "other"),
            file: "cluster.env",
            line: Some(12),
            key: Some("ISTIO_NAMESPACE"),
            says: "differs from POD_NAMESPACE",
        },
        Bad {
            name: "bad labels JSON",
            edit: |f| set(f, "ISTIO_METAJSON_LABELS", r#"{"app":"foo""#),
            file: "cluster.env",
            line: Some(6),
            key: Some("ISTIO_METAJSON_LABELS"),
            says: "JSON object",
        },
        Bad {
            name: "labels JSON not of strings",
            edit: |f| set(f, "ISTIO_METAJSON_LABELS", r#"{"replicas":3}"#),
            file: "cluster.env",
            line: Some(6),
            key: Some("ISTIO_METAJSON_LABELS"),
            says: "JSON object",
        },
        Bad {
            name: "bad exclude port",
            edit: |f| set(f, "ISTIO_LOCAL_EXCLUDE_PORTS", "22,ssh"),
            file: "cluster.env",
            line: Some(5),
            key: Some("ISTIO_LOCAL_EXCLUDE_PORTS"),
            says: "\"22,ssh\"",
        },
        Bad {
            name: "port out of range",
            edit: |f| set(f, "ISTIO_INBOUND_PORTS", "80,70000"),
            file: "cluster.env",
            line: Some(4),
            key: Some("ISTIO_INBOUND_PORTS"),
            says: "list of ports",
        },
        Bad {
            name: "bad service CIDR",
            edit: |f| set(f, "ISTIO_SERVICE_CIDR", "10.96.0.0/33"),
            file: "cluster.env",
            line: Some(14),
            key: Some("ISTIO_SERVICE_CIDR"),
            says: "list of networks",
        },
        Bad {
            name: "bad CA_ADDR",
            edit: |f| set(f, "CA_ADDR", "istiod"),
            file: "cluster.env",
            line: Some(3),
            key: Some("CA_ADDR"),
            says: "HOST:PORT",
        },
        Bad {
            name: "bad ISTIO_SVC_IP",
            edit: |f| set(f, "ISTIO_SVC_IP", "10.10.10"),
            file: "cluster.env",
            line: Some(15),
            key: Some("ISTIO_SVC_IP"),
            says: "IP address",
        },
        Bad {
            name: "bad DNS capture boolean",
            edit: |f| set(f, "ISTIO_META_DNS_CAPTURE", "yes"),
            file: "cluster.env",
            line: Some(8),
            key: Some("ISTIO_META_DNS_CAPTURE"),
            says: "true or false",
        },
        Bad {
            name: "bad service account name",
            edit: |f| set(f, "SERVICE_ACCOUNT", "Not/A/Name"),
            file: "cluster.env",
            line: Some(17),
            key: Some("SERVICE_ACCOUNT"),
            says: "Kubernetes name",
        },
        Bad {
            name: "TPROXY refused",
            edit: |f| set(f, "ISTIO_INBOUND_INTERCEPTION_MODE", "TPROXY"),
            file: "cluster.env",
            line: Some(4),
            key: Some("ISTIO_INBOUND_INTERCEPTION_MODE"),
            says: "not supported",
        },
        Bad {
            name: "unknown ISTIO_ key (a typo of ISTIO_LOCAL_EXCLUDE_PORTS)",
            edit: |f| set(f, "ISTIO_LOCAL_EXCLUDE_PORT", "22"),
            file: "cluster.env",
            line: Some(5),
            key: Some("ISTIO_LOCAL_EXCLUDE_PORT"),
            says: "unknown ISTIO_ key",
        },
        Bad {
            name: "shell expansion",
            edit: |f| f.raw_env = Some("SERVICE_ACCOUNT=$USER\n".into()),
            file: "cluster.env",
            line: Some(1),
            key: None,
            says: "expanded by the shell",
        },
        Bad {
            name: "unterminated quote",
            edit: |f| f.raw_env = Some("A='x'\nSERVICE_ACCOUNT='vm\n".into()),
            file: "cluster.env",
            line: Some(3),
            key: None,
            says: "never closed",
        },
        Bad {
            name: "cluster.env empty",
            edit: |f| f.raw_env = Some(String::new()),
            file: "cluster.env",
            line: None,
            key: Some("POD_NAMESPACE"),
            says: "required",
        },
        Bad {
            name: "cluster.env absent",
            edit: |f| f.no_env = true,
            file: "cluster.env",
            line: None,
            key: None,
            says: "cannot read",
        },
        Bad {
            name: "proxyMetadata value not a string",
            edit: |f| {
                f.mesh = Some(
                    "defaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: true\n".into(),
                )
            },
            file: "mesh.yaml",
            line: None,
            key: Some("defaultConfig.proxyMetadata.ISTIO_META_DNS_CAPTURE"),
            says: "expected a string",
        },
        Bad {
            name: "bad value from mesh.yaml names mesh.yaml",
            edit: |f| {
                unset(f, "ISTIO_SVC_IP");
                f.mesh = Some("defaultConfig:\n  proxyMetadata:\n    ISTIO_SVC_IP: nope\n".into())
            },
            file: "mesh.yaml",
            line: None,
            key: Some("defaultConfig.proxyMetadata.ISTIO_SVC_IP"),
            says: "IP address",
        },
        Bad {
            name: "mesh.yaml not YAML",
            edit: |f| f.mesh = Some("defaultConfig: [\n".into()),
            file: "mesh.yaml",
            line: None,
            key: None,
            says: "not a mesh config",
        },
        Bad {
            name: "bad hosts line",
            edit: |f| f.hosts = Some("# c\nistiod 10.0.0.1\n".into()),
            file: "hosts",
            line: Some(2),
            key: None,
            says: "not an IP address",
        },
        Bad {
            name: "root cert missing",
            edit: |f| f.root = None,
            file: "root-cert.pem",
            line: None,
            key: None,
            says: "cannot read",
        },
        Bad {
            name: "root cert not a certificate",
            edit: |f| f.root = Some("hello\n".into()),
            file: "root-cert.pem",
            line: None,
            key: None,
            says: "no usable root certificate",
        },
        Bad {
            name: "token missing",
            edit: |f| f.token = None,
            file: "istio-token",
            line: None,
            key: None,
            says: "cannot read",
        },
        Bad {
            name: "token empty",
            edit: |f| f.token = Some("\n".into()),
            file: "istio-token",
            line: None,
            key: None,
            says: "empty",
        },
    ];
    let mut failures = Vec::new();
    for c in cases {
        let mut f = Files::good();
        (c.edit)(&mut f);
        let (dir, b) = f.load();
        let Err(errs) = b else {
            failures.push(format!("{}: accepted", c.name));
            continue;
        };
        let text = errs.to_string();
        let found = errs.0.iter().any(|e| {
            e.path == dir.path().join(c.file)
                && e.line == c.line
                && e.key.as_deref() == c.key
                && e.to_string().contains(c.says)
        });
        if !found {
            failures.push(format!(
                "{}: want {}:{:?}:{:?} {:?}, got\n{text}",
                c.name, c.file, c.line, c.key, c.says
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut f = Files::good();
    unset(&mut f, "SERVICE_ACCOUNT");
    f.mesh = None;
    set(&mut f, "ISTIO_METAJSON_LABELS", "{");
    f.token = Some(String::new());
    let (_d, b) = f.load();
    let errs = b.unwrap_err();
    assert_eq!(errs.0.len(), 3, "{errs}");
    let text = errs.to_string();
    let files: Vec<String> = errs
        .0
        .iter()
        .map(|e| e.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        files,
        ["cluster.env", "cluster.env", "istio-token"],
        "{text}"
    );
    for want in ["SERVICE_ACCOUNT", "ISTIO_METAJSON_LABELS", "istio-token"] {
        assert!(text.contains(want), "{text}");
    }
}

/// docs/vm.md lists every key ambit knows, with its treatment.
#[test]
fn docs_list_every_key() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/vm.md"))
            .unwrap();
    let mut missing = Vec::new();
    for k in KEYS {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", k.name)));
        match (row, k.kind) {
            (None, _) => missing.push(k.name),
            (Some(r), KeyKind::Ignored(_)) if !r.contains("ignored") => missing.push(k.name),
            _ => {}
        }
    }
    assert!(missing.is_empty(), "docs/vm.md lacks rows for {missing:?}");
}

/// A bad line does not hide its neighbours: the keys on good lines are read, so only the bad
/// line is reported (not a cascade of "required" keys).
#[test]
fn a_bad_line_reports_only_itself() {
    let mut f = Files::good();
    f.mesh = None;
    let mut env: String = f
        .env
        .iter()
        .map(|(k, v)| format!("{k}={}\n", quote(v)))
        .collect();
    env.push_str("SERVICE_ACCOUNT='again'\nISTIO_SVC_IP=$IP\n");
    f.raw_env = Some(env);
    let (_d, b) = f.load();
    let errs = b.unwrap_err();
    let lines: Vec<Option<usize>> = errs.0.iter().map(|e| e.line).collect();
    assert_eq!(lines, vec![Some(19), Some(20)], "{errs}");
    assert!(
        errs.to_string().contains("already set on line 17"),
        "{errs}"
    );
}
