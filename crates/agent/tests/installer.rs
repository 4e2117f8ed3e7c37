//! The CNI installer (`spec/cni.md` §1.3 step 9, §5.5, §1.10, §6.2) on temp dirs: what it
//! writes, what it repairs when the primary CNI or anyone else changes the node, what an
//! uninstall removes, clear errors for bad directories; and, in network namespaces (root),
//! the agent's readiness following the installer and upgrade vs uninstall shutdown.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_agent::AgentConfig;
use ambit_agent::installer::conflist::ConfMode;
use ambit_agent::installer::{InstallConfig, Installer, InstallerError, KubeApi, Pass, uninstall};
use ambit_netns::testing::netns_capable_or_skip;
use ambit_testkit::eventually_async;
use serde_json::{Value, json};

const BRIDGE: &str =
    r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#;
const ENTRY_KEY: &str = "ambit_test_marker";

/// A node's directories in a temp dir.
struct Node {
    _tmp: tempfile::TempDir,
    net_d: PathBuf,
    bin: PathBuf,
    run: PathBuf,
    sa: PathBuf,
    exe: PathBuf,
}

impl Node {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let p = |n: &str| tmp.path().join(n);
        let node = Self {
            net_d: p("net.d"),
            bin: p("bin"),
            run: p("run"),
            sa: p("sa"),
            exe: p("ambit-exe"),
            _tmp: tmp,
        };
        for d in [&node.net_d, &node.bin, &node.run, &node.sa] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(&node.exe, b"\x7fELF pretend ambit").unwrap();
        fs::write(node.sa.join("token"), "token-1\n").unwrap();
        fs::write(node.sa.join("ca.crt"), "CA").unwrap();
        node
    }

    fn config(&self, mode: ConfMode) -> InstallConfig {
        InstallConfig {
            conf_dir: Some(self.net_d.clone()),
            mode,
            bin_dir: Some(self.bin.clone()),
            binary_source: self.exe.clone(),
            run_dir: self.run.clone(),
            kube_api: Some(KubeApi {
                protocol: "https".into(),
                host: "10.96.0.1".into(),
                port: "443".into(),
                service_account_dir: self.sa.clone(),
                ca_file: None,
                skip_tls_verify: false,
            }),
            ..InstallConfig::default()
        }
    }

    fn binary(&self) -> PathBuf {
        self.bin.join("istio-cni")
    }

    fn kubeconfig(&self) -> PathBuf {
        self.run.join("istio-cni-kubeconfig")
    }

    fn write_conf(&self, name: &str, text: &str) {
        fs::write(self.net_d.join(name), text).unwrap();
    }

    fn read_conf(&self, name: &str) -> Value {
        serde_json::from_slice(&fs::read(self.net_d.join(name)).unwrap()).unwrap()
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.net_d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

fn entry() -> Value {
    json!({"cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni", ENTRY_KEY: 1})
}

fn types(list: &Value) -> Vec<String> {
    list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_owned())
        .collect()
}

fn mode_of(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn reconcile(inst: &mut Installer) -> (Result<Pass, InstallerError>, u32) {
    let mut drifts = 0;
    let r = inst.reconcile(&mut || drifts += 1);
    (r, drifts)
}

#[test]
fn first_pass_installs_everything_then_leaves_files_alone() {
    let node = Node::new();
    node.write_conf("10-bridge.conflist", BRIDGE);
    let mut inst = Installer::new(node.config(ConfMode::Chained), entry());

    let (pass, drifts) = reconcile(&mut inst);
    assert_eq!(
        pass.unwrap().repaired,
        vec!["binary", "kubeconfig", "cni config"]
    );
    assert_eq!(drifts, 1, "readiness drops once per pass, not per step");

    // Binary: same bytes, executable, no temp file left.
    assert_eq!(
        fs::read(node.binary()).unwrap(),
        fs::read(&node.exe).unwrap()
    );
    assert_eq!(mode_of(&node.binary()), 0o755);
    assert_eq!(fs::read_dir(&node.bin).unwrap().count(), 1);

    // Kubeconfig: upstream name and mode, server, token, CA data.
    let kc = fs::read_to_string(node.kubeconfig()).unwrap();
    assert_eq!(mode_of(&node.kubeconfig()), 0o600);
    let v: serde_json::Value = serde_norway::from_str(&kc).unwrap();
    assert_eq!(v["current-context"], "istio-cni-context");
    assert_eq!(
        v["clusters"][0]["cluster"]["server"],
        "https://10.96.0.1:443"
    );
    assert_eq!(
        v["clusters"][0]["cluster"]["certificate-authority-data"],
        "Q0E="
    );
    assert_eq!(v["users"][0]["user"]["token"], "token-1");

    // CNI config: appended last, without cniVersion.
    let list = node.read_conf("10-bridge.conflist");
    assert_eq!(types(&list), vec!["bridge", "portmap", "istio-cni"]);
    let ours = list["plugins"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(ours[ENTRY_KEY], 1);
    assert!(ours.get("cniVersion").is_none());
    assert_eq!(
        inst.conf_file(),
        Some(node.net_d.join("10-bridge.conflist").as_path())
    );

    // A second pass finds everything in place and rewrites nothing (other agents watch
    // the directory).
    let ids = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec())
    };
    let files = [
        node.binary(),
        node.kubeconfig(),
        node.net_d.join("10-bridge.conflist"),
    ];
    let before: Vec<_> = files.iter().map(|p| ids(p)).collect();
    let (pass, drifts) = reconcile(&mut inst);
    assert_eq!(pass.unwrap().repaired, Vec::<&str>::new());
    assert_eq!(drifts, 0);
    let after: Vec<_> = files.iter().map(|p| ids(p)).collect();
    assert_eq!(before, after);
}

#[test]
fn drift_is_repaired() {
    struct Case {
        name: &'static str,
        change: fn(&Node),
        repaired: Vec<&'static str>,
        check: fn(&Node),
    }
    let cases = [
        Case {
            name: "primary CNI rewrites its config, dropping our entry",
            change: |n| n.write_conf("10-bridge.conflist", BRIDGE),
            repaired: vec!["cni config"],
            check: |n| {
                assert_eq!(
                    types(&n.read_conf("10-bridge.conflist")),
                    vec!["bridge", "portmap", "istio-cni"]
                );
            },
        },
        Case {
            name: "a new primary config sorts first (a .conf: wrapped and renamed)",
            change: |n| {
                n.write_conf(
                    "05-calico.conf",
                    r#"{"cniVersion":"0.3.1","name":"k8s","type":"calico"}"#,
                );
            },
            repaired: vec!["cni config"],
            check: |n| {
                assert!(!n.net_d.join("05-calico.conf").exists());
                let list = n.read_conf("05-calico.conflist");
                assert_eq!(list["name"], "k8s-pod-network");
                assert_eq!(types(&list), vec!["calico", "istio-cni"]);
            },
        },
        Case {
            name: "primary config deleted and written back later by its CNI",
            change: |n| {
                fs::remove_file(n.net_d.join("10-bridge.conflist")).unwrap();
                n.write_conf("10-bridge.conflist", BRIDGE);
            },
            repaired: vec!["cni config"],
            check: |n| {
                assert!(types(&n.read_conf("10-bridge.conflist")).contains(&"istio-cni".into()));
            },
        },
        Case {
            name: "our entry edited by hand",
            change: |n| {
                let mut v = n.read_conf("10-bridge.conflist");
                v["plugins"][2][ENTRY_KEY] = json!(2);
                n.write_conf("10-bridge.conflist", &v.to_string());
            },
            repaired: vec!["cni config"],
            check: |n| {
                assert_eq!(
                    n.read_conf("10-bridge.conflist")["plugins"][2][ENTRY_KEY],
                    1
                );
            },
        },
        Case {
            name: "binary deleted",
            change: |n| fs::remove_file(n.binary()).unwrap(),
            repaired: vec!["binary"],
            check: |n| assert_eq!(fs::read(n.binary()).unwrap(), fs::read(&n.exe).unwrap()),
        },
        Case {
            name: "binary replaced by another one",
            change: |n| fs::write(n.binary(), b"someone else's istio-cni").unwrap(),
            repaired: vec!["binary"],
            check: |n| assert_eq!(fs::read(n.binary()).unwrap(), fs::read(&n.exe).unwrap()),
        },
        Case {
            name: "service account token rotated",
            change: |n| fs::write(n.sa.join("token"), "token-2").unwrap(),
            repaired: vec!["kubeconfig"],
            check: |n| {
                let kc = fs::read_to_string(n.kubeconfig()).unwrap();
                assert!(kc.contains("token-2") && !kc.contains("token-1"), "{kc}");
            },
        },
        Case {
            name: "kubeconfig deleted",
            change: |n| fs::remove_file(n.kubeconfig()).unwrap(),
            repaired: vec!["kubeconfig"],
            check: |n| assert_eq!(mode_of(&n.kubeconfig()), 0o600),
        },
    ];
    for c in cases {
        let node = Node::new();
        node.write_conf("10-bridge.conflist", BRIDGE);
        let mut inst = Installer::new(node.config(ConfMode::Chained), entry());
        reconcile(&mut inst).0.unwrap();
        (c.change)(&node);
        let (pass, drifts) = reconcile(&mut inst);
        assert_eq!(pass.unwrap().repaired, c.repaired, "{}", c.name);
        assert_eq!(drifts, 1, "{}", c.name);
        (c.check)(&node);
        // Stable again.
        assert!(
            reconcile(&mut inst).0.unwrap().repaired.is_empty(),
            "{}",
            c.name
        );
    }
}

#[test]
fn modes_install_and_uninstall() {
    struct Case {
        name: &'static str,
        mode: ConfMode,
        conf_name: Option<&'static str>,
        /// The file holding our entry and its mode.
        written: &'static str,
        written_mode: u32,
        /// Files after install / after uninstall.
        installed: Vec<&'static str>,
        uninstalled: Vec<&'static str>,
    }
    let owned = |group_read| ConfMode::IstioOwned {
        file_name: "02-istio-cni.conflist".into(),
        group_read,
    };
    let cases = [
        Case {
            name: "chained",
            mode: ConfMode::Chained,
            conf_name: None,
            written: "10-bridge.conflist",
            written_mode: 0o644,
            installed: vec!["10-bridge.conflist", "20-other.conflist"],
            uninstalled: vec!["10-bridge.conflist", "20-other.conflist"],
        },
        Case {
            name: "chained into CNI_CONF_NAME",
            mode: ConfMode::Chained,
            conf_name: Some("20-other.conflist"),
            written: "20-other.conflist",
            written_mode: 0o644,
            installed: vec!["10-bridge.conflist", "20-other.conflist"],
            uninstalled: vec!["10-bridge.conflist", "20-other.conflist"],
        },
        Case {
            name: "istio-owned",
            mode: owned(false),
            conf_name: None,
            written: "02-istio-cni.conflist",
            written_mode: 0o600,
            installed: vec![
                "02-istio-cni.conflist",
                "10-bridge.conflist",
                "20-other.conflist",
            ],
            uninstalled: vec!["10-bridge.conflist", "20-other.conflist"],
        },
        Case {
            name: "istio-owned, group read",
            mode: owned(true),
            conf_name: None,
            written: "02-istio-cni.conflist",
            written_mode: 0o640,
            installed: vec![
                "02-istio-cni.conflist",
                "10-bridge.conflist",
                "20-other.conflist",
            ],
            uninstalled: vec!["10-bridge.conflist", "20-other.conflist"],
        },
        Case {
            name: "standalone",
            mode: ConfMode::Standalone,
            conf_name: None,
            written: "YYY-istio-cni.conf",
            written_mode: 0o644,
            installed: vec![
                "10-bridge.conflist",
                "20-other.conflist",
                "YYY-istio-cni.conf",
            ],
            uninstalled: vec!["10-bridge.conflist", "20-other.conflist"],
        },
    ];
    let other = r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"macvlan"}]}"#;
    for c in cases {
        let node = Node::new();
        node.write_conf("10-bridge.conflist", BRIDGE);
        node.write_conf("20-other.conflist", other);
        for f in ["10-bridge.conflist", "20-other.conflist"] {
            fs::set_permissions(node.net_d.join(f), fs::Permissions::from_mode(0o644)).unwrap();
        }
        let mut cfg = node.config(c.mode.clone());
        cfg.conf_name = c.conf_name.map(str::to_owned);
        let mut inst = Installer::new(cfg.clone(), entry());
        reconcile(&mut inst).0.unwrap();
        assert_eq!(node.names(), c.installed, "{}", c.name);
        assert_eq!(
            mode_of(&node.net_d.join(c.written)),
            c.written_mode,
            "{}",
            c.name
        );
        let written = node.read_conf(c.written);
        match &c.mode {
            ConfMode::Standalone => {
                assert_eq!(written["type"], "istio-cni", "{}", c.name);
                assert_eq!(written["cniVersion"], "0.3.1", "{}", c.name);
            }
            ConfMode::IstioOwned { .. } => {
                // A copy of the primary plus our entry; the primary is untouched.
                assert_eq!(
                    types(&written),
                    vec!["bridge", "portmap", "istio-cni"],
                    "{}",
                    c.name
                );
                assert_eq!(
                    node.read_conf("10-bridge.conflist"),
                    serde_json::from_str::<Value>(BRIDGE).unwrap(),
                    "{}",
                    c.name
                );
            }
            ConfMode::Chained => {
                assert_eq!(types(&written).last().unwrap(), "istio-cni", "{}", c.name);
            }
        }
        assert!(
            reconcile(&mut inst).0.unwrap().repaired.is_empty(),
            "{}",
            c.name
        );

        let (removed, errors) = uninstall(&cfg);
        assert!(errors.is_empty(), "{}: {errors:?}", c.name);
        assert!(removed.contains(&node.binary()), "{}", c.name);
        assert!(removed.contains(&node.kubeconfig()), "{}", c.name);
        assert_eq!(node.names(), c.uninstalled, "{}", c.name);
        assert!(!node.binary().exists() && !node.kubeconfig().exists());
        for f in &c.uninstalled {
            let v = node.read_conf(f);
            assert!(
                !types(&v).contains(&"istio-cni".to_owned()),
                "{}: {f}",
                c.name
            );
        }
        assert_eq!(
            node.read_conf("10-bridge.conflist"),
            serde_json::from_str::<Value>(BRIDGE).unwrap(),
            "{}",
            c.name
        );
        // Idempotent.
        let (removed, errors) = uninstall(&cfg);
        assert!(removed.is_empty() && errors.is_empty(), "{}", c.name);
    }
}

#[test]
fn unconfigured_steps_are_skipped() {
    let node = Node::new();
    let cfg = InstallConfig {
        binary_source: node.exe.clone(),
        run_dir: node.run.clone(),
        ..InstallConfig::default()
    };
    let mut inst = Installer::new(cfg.clone(), entry());
    let (pass, drifts) = reconcile(&mut inst);
    assert_eq!(pass.unwrap().repaired, Vec::<&str>::new());
    assert_eq!(drifts, 0);
    assert_eq!(fs::read_dir(&node.run).unwrap().count(), 0);
    let (removed, errors) = uninstall(&cfg);
    assert!(
        removed.is_empty() && errors.is_empty(),
        "{removed:?} {errors:?}"
    );
}

#[test]
fn bad_directories_give_clear_errors() {
    struct Case {
        name: &'static str,
        setup: fn(&Node, &mut InstallConfig),
        /// Substrings of the error text.
        want: Vec<&'static str>,
        waiting: bool,
    }
    let cases = [
        Case {
            name: "no primary config yet: waiting, not a failure",
            setup: |_, _| {},
            want: vec!["no valid .conf/.conflist in", "net.d"],
            waiting: true,
        },
        Case {
            name: "conf dir missing",
            setup: |n, c| c.conf_dir = Some(n.net_d.join("missing")),
            want: vec!["listing", "missing", "No such file"],
            waiting: false,
        },
        Case {
            name: "bin dir missing",
            setup: |n, c| c.bin_dir = Some(n.bin.join("missing")),
            want: vec!["copying plugin binary", "missing"],
            waiting: false,
        },
        Case {
            name: "bin dir is a file",
            setup: |n, c| {
                fs::write(n.bin.join("file"), "").unwrap();
                c.bin_dir = Some(n.bin.join("file"));
            },
            want: vec!["copying plugin binary", "file"],
            waiting: false,
        },
        Case {
            name: "binary source unreadable",
            setup: |n, c| c.binary_source = n.exe.with_file_name("no-such-exe"),
            want: vec!["copying plugin binary", "no-such-exe"],
            waiting: false,
        },
        Case {
            name: "no service account token",
            setup: |n, _| fs::remove_file(n.sa.join("token")).unwrap(),
            want: vec!["kubeconfig", "service account token", "token"],
            waiting: false,
        },
        Case {
            name: "KUBE_CA_FILE missing",
            setup: |n, c| {
                if let Some(api) = c.kube_api.as_mut() {
                    api.ca_file = Some(n.sa.join("nope.crt"));
                }
            },
            want: vec!["kubeconfig", "reading CA", "nope.crt"],
            waiting: false,
        },
        Case {
            name: "run dir missing",
            setup: |n, c| c.run_dir = n.run.join("missing"),
            want: vec!["kubeconfig", "missing"],
            waiting: false,
        },
    ];
    for c in cases {
        let node = Node::new();
        let mut cfg = node.config(ConfMode::Chained);
        (c.setup)(&node, &mut cfg);
        if !c.waiting {
            node.write_conf("10-bridge.conflist", BRIDGE);
        }
        let mut inst = Installer::new(cfg, entry());
        let err = reconcile(&mut inst).0.unwrap_err();
        let text = err.to_string();
        for w in &c.want {
            assert!(text.contains(w), "{}: {text:?} lacks {w:?}", c.name);
        }
        assert_eq!(err.is_waiting(), c.waiting, "{}", c.name);
        // No temp files left behind anywhere.
        for d in [&node.bin, &node.net_d, &node.run] {
            for e in fs::read_dir(d).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                assert!(!name.contains(".tmp."), "{}: {name}", c.name);
            }
        }
    }
}

// ---- the agent: readiness follows the installer; upgrade vs uninstall (root) ----

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

async fn ready(addr: std::net::SocketAddr) -> bool {
    http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200")
}

fn has_entry(net_d: &Path, name: &str) -> bool {
    fs::read(net_d.join(name))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|v| types(&v).contains(&"istio-cni".to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ready_only_when_installed_and_uninstall_removes_it() {
    if !netns_capable_or_skip("agent_ready_only_when_installed_and_uninstall_removes_it") {
        return;
    }
    let topo = ambit_topology::Topology::builder()
        .node("n")
        .build()
        .unwrap();
    let host = topo.node("n").netns().path();
    // (disable safe upgrade, files kept after shutdown)
    for (uninstall_on_exit, kept) in [(false, true), (true, false)] {
        let node = Node::new();
        let vars: Vec<(String, String)> = [
            (
                "ZTUNNEL_UDS_ADDRESS",
                node.run.join("zt.sock").display().to_string(),
            ),
            ("CNI_AGENT_RUN_DIR", node.run.display().to_string()),
            ("MOUNTED_CNI_NET_DIR", node.net_d.display().to_string()),
            ("AMBIT_CNI_BIN_DIR", node.bin.display().to_string()),
            ("AMBIT_INSTALL_CHECK_INTERVAL", "50ms".into()),
            ("AMBIT_HOST_NETNS", host.display().to_string()),
            ("AMBIT_HEALTH_ADDR", "127.0.0.1:0".into()),
            ("AMBIT_METRICS_ADDR", "127.0.0.1:0".into()),
            (
                "AMBIENT_DISABLE_SAFE_UPGRADE",
                uninstall_on_exit.to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut cfg = AgentConfig::from_vars(&vars).unwrap();
        // The real executable is copied (as in a DaemonSet); the kubeconfig reads the
        // temp service account instead of the pod's.
        cfg.install.kube_api = node.config(ConfMode::Chained).kube_api;
        let check = ambit_agent::shutdown::check_for(&cfg);
        let agent = ambit_agent::start(cfg, ambit_agent::LocalPodSource::new())
            .await
            .unwrap();

        // No primary CNI config yet: the agent runs but is not ready.
        assert!(!ready(agent.health_addr).await);
        assert_eq!(agent.metrics.install_ready.get(), 0);

        // The primary CNI writes its config: installed, ready.
        node.write_conf("10-bridge.conflist", BRIDGE);
        eventually_async(
            "readiness after the primary config appears",
            Duration::from_secs(10),
            || ready(agent.health_addr),
        )
        .await;
        assert_eq!(agent.metrics.install_ready.get(), 1);
        assert!(has_entry(&node.net_d, "10-bridge.conflist"));
        let exe = fs::read("/proc/self/exe").unwrap();
        assert!(fs::read(node.binary()).unwrap() == exe, "binary differs");
        assert!(node.kubeconfig().exists());
        let entry = &node.read_conf("10-bridge.conflist")["plugins"][2];
        assert_eq!(entry["cni_agent_run_dir"], node.run.display().to_string());
        assert_eq!(entry["ambient_enabled"], true);

        // The primary CNI rewrites its config and drops our entry: re-inserted.
        node.write_conf("10-bridge.conflist", BRIDGE);
        eventually_async(
            "re-insertion after the primary rewrote its config",
            Duration::from_secs(10),
            || {
                let net_d = node.net_d.clone();
                async move { has_entry(&net_d, "10-bridge.conflist") }
            },
        )
        .await;
        eventually_async("ready again", Duration::from_secs(10), || {
            ready(agent.health_addr)
        })
        .await;
        // Two installs (first one, re-insertion), no failure episode (waiting is not one).
        let installs = |result: &'static str| {
            agent
                .metrics
                .installs
                .get_or_create(&ambit_agent::daemon::metrics::ResultLabel { result })
                .get()
        };
        assert_eq!(installs("SUCCESS"), 2);
        assert_eq!(installs("CREATE_CNI_CONFIG_FAILURE"), 0);

        let kind = agent.shutdown_with(check.as_ref()).await.unwrap();
        assert_eq!(
            kind == ambit_agent::shutdown::ShutdownKind::Uninstall,
            uninstall_on_exit
        );
        assert_eq!(has_entry(&node.net_d, "10-bridge.conflist"), kept);
        assert_eq!(node.binary().exists(), kept);
        assert_eq!(node.kubeconfig().exists(), kept);
        // The primary network's own plugins always survive.
        let list = node.read_conf("10-bridge.conflist");
        assert_eq!(&types(&list)[..2], ["bridge", "portmap"]);
    }
}
