//! CNI plugin: pure `plugin_main` against a fake agent on a real Unix socket, and the
//! chained conflist installer on temp dirs.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};

use ambit_agent::installer::conflist::install_conflist;
use ambit_agent::plugin_main;
use serde_json::{Value, json};

/// A one-shot-per-connection HTTP server answering every request with `status`.
struct FakeAgent {
    dir: tempfile::TempDir,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
}

impl FakeAgent {
    fn start(status: u16, body: &'static str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("pluginevent.sock")).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read head + Content-Length body.
                loop {
                    let n = s.read(&mut chunk).unwrap();
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len: usize = text
                            .lines()
                            .find_map(|l| l.strip_prefix("Content-Length: "))
                            .unwrap()
                            .trim()
                            .parse()
                            .unwrap();
                        if buf.len() >= end + 4 + len {
                            let line = text.lines().next().unwrap().to_string();
                            let body: Value = serde_json::from_slice(&buf[end + 4..]).unwrap();
                            seen.lock().unwrap().push((line, body));
                            break;
                        }
                    }
                    if n == 0 {
                        break;
                    }
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { dir, requests }
    }

    fn run_dir(&self) -> String {
        self.dir.path().display().to_string()
    }
}

fn env(cmd: &str, args: &str) -> Vec<(String, String)> {
    [
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/cni-1234"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_ARGS", args),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

const POD_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=u1";

fn conf(run_dir: &str, version: &str, prev: Option<Value>) -> Vec<u8> {
    let mut c = json!({
        "cniVersion": version, "name": "istio-cni", "type": "istio-cni",
        "cni_agent_run_dir": run_dir, "ambient_enabled": true,
        "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
    });
    if let Some(p) = prev {
        c["prevResult"] = p;
    }
    serde_json::to_vec(&c).unwrap()
}

fn prev_100() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/cni-1234"}],
        "ips": [{"interface": 0, "address": "10.244.1.5/24", "gateway": "10.244.1.1"},
                {"address": "fd00::5/64"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {}
    })
}

fn out_json(out: &[u8]) -> Value {
    serde_json::from_slice(out).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(out)))
}

#[test]
fn add_posts_cmdadd_and_prints_prev_result() {
    let agent = FakeAgent::start(200, "");
    let (code, out) = plugin_main(
        &env("ADD", POD_ARGS),
        &conf(&agent.run_dir(), "1.0.0", Some(prev_100())),
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out));
    let out = out_json(&out);
    assert_eq!(out["cniVersion"], "1.0.0");
    assert_eq!(out["ips"][0]["address"], "10.244.1.5/24");
    assert!(out["ips"][0].get("version").is_none());

    let reqs = agent.requests.lock().unwrap();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].0, "POST /cmdadd HTTP/1.1");
    assert_eq!(
        reqs[0].1,
        json!({
            "Netns": "/var/run/netns/cni-1234", "PodName": "web-0", "PodNamespace": "demo",
            "IPs": [
                {"Interface": 0, "Address": {"IP": "10.244.1.5", "Mask": "////AA=="}, "Gateway": "10.244.1.1"},
                {"Interface": null, "Address": {"IP": "fd00::5", "Mask": "//////////8AAAAAAAAAAA=="}, "Gateway": ""}
            ]
        })
    );
}

#[test]
fn result_versions() {
    let agent = FakeAgent::start(200, "");
    struct Case {
        version: &'static str,
        prev: Option<Value>,
        check: fn(&Value),
    }
    let cases = [
        Case {
            version: "0.3.1",
            prev: Some(prev_100()),
            check: |v| {
                assert_eq!(v["cniVersion"], "0.3.1");
                assert_eq!(v["ips"][0]["version"], "4");
                assert_eq!(v["ips"][1]["version"], "6");
            },
        },
        Case {
            version: "0.2.0",
            prev: Some(prev_100()),
            check: |v| {
                assert_eq!(v["ip4"]["ip"], "10.244.1.5/24");
                assert_eq!(v["ip4"]["gateway"], "10.244.1.1");
                assert_eq!(v["ip6"]["ip"], "fd00::5/64");
            },
        },
        Case {
            version: "1.0.0",
            prev: None,
            check: |v| assert_eq!(v, &json!({"cniVersion": "1.0.0", "dns": {}})),
        },
    ];
    for c in cases {
        let (code, out) = plugin_main(
            &env("ADD", POD_ARGS),
            &conf(&agent.run_dir(), c.version, c.prev),
        );
        assert_eq!(code, 0, "{}: {}", c.version, String::from_utf8_lossy(&out));
        (c.check)(&out_json(&out));
    }
}

#[test]
fn skipped_pods_do_not_post() {
    let agent = FakeAgent::start(500, "must not be called");
    for (name, args) in [
        (
            "excluded namespace",
            "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns",
        ),
        (
            "self pod",
            "K8S_POD_NAMESPACE=istio-system;K8S_POD_NAME=istio-cni-node-abcde",
        ),
        ("no pod name", "K8S_POD_NAMESPACE=demo"),
        ("no CNI_ARGS", ""),
    ] {
        let (code, out) = plugin_main(&env("ADD", args), &conf(&agent.run_dir(), "1.0.0", None));
        assert_eq!(code, 0, "{name}: {}", String::from_utf8_lossy(&out));
    }
    assert!(agent.requests.lock().unwrap().is_empty());
}

#[test]
fn errors_are_cni_error_json() {
    let refusing = FakeAgent::start(500, "no ztunnel connection");
    let nowhere = tempfile::tempdir().unwrap();
    let nowhere = nowhere.path().display().to_string();
    struct Case {
        name: &'static str,
        env: Vec<(String, String)>,
        stdin: Vec<u8>,
        code: u64,
        text: &'static str,
    }
    let mut no_netns = env("ADD", POD_ARGS);
    no_netns.retain(|(k, _)| k != "CNI_NETNS");
    let cases = [
        Case {
            name: "agent says 500",
            env: env("ADD", POD_ARGS),
            stdin: conf(&refusing.run_dir(), "1.0.0", None),
            code: 11,
            text: "no ztunnel connection",
        },
        Case {
            name: "agent unreachable",
            env: env("ADD", POD_ARGS),
            stdin: conf(&nowhere, "1.0.0", None),
            code: 11,
            text: "unreachable",
        },
        Case {
            name: "broken json",
            env: env("ADD", POD_ARGS),
            stdin: b"{not json".to_vec(),
            code: 6,
            text: "decoding",
        },
        Case {
            name: "unknown command",
            env: env("FROB", POD_ARGS),
            stdin: conf(&nowhere, "1.0.0", None),
            code: 4,
            text: "FROB",
        },
        Case {
            name: "missing command",
            env: vec![],
            stdin: conf(&nowhere, "1.0.0", None),
            code: 4,
            text: "CNI_COMMAND",
        },
        Case {
            name: "missing netns",
            env: no_netns,
            stdin: conf(&nowhere, "1.0.0", None),
            code: 4,
            text: "CNI_NETNS",
        },
        Case {
            name: "bad CNI_ARGS",
            env: env("ADD", "garbage"),
            stdin: conf(&nowhere, "1.0.0", None),
            code: 4,
            text: "CNI_ARGS",
        },
        Case {
            name: "unsupported version",
            env: env("ADD", POD_ARGS),
            stdin: conf(&nowhere, "9.9.9", None),
            code: 1,
            text: "incompatible",
        },
        Case {
            name: "prevResult not an object",
            env: env("ADD", POD_ARGS),
            stdin: conf(&nowhere, "1.0.0", Some(json!([1]))),
            code: 7,
            text: "prevResult",
        },
    ];
    for c in cases {
        let (code, out) = plugin_main(&c.env, &c.stdin);
        assert_eq!(code, 1, "{}", c.name);
        let v = out_json(&out);
        assert_eq!(v["code"], c.code, "{}: {v}", c.name);
        let all = format!("{} {}", v["msg"], v["details"]);
        assert!(all.contains(c.text), "{}: {v}", c.name);
        assert!(v["cniVersion"].is_string(), "{}", c.name);
    }
}

#[test]
fn version_del_check() {
    let (code, out) = plugin_main(&env("VERSION", ""), b"");
    assert_eq!(code, 0);
    let v = out_json(&out);
    let versions: Vec<&str> = v["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(versions.contains(&"0.3.1") && versions.contains(&"1.0.0"));

    for cmd in ["DEL", "CHECK"] {
        let (code, out) = plugin_main(&env(cmd, POD_ARGS), &conf("/nonexistent", "1.0.0", None));
        assert_eq!((code, out), (0, Vec::new()), "{cmd}");
    }
}

#[test]
fn conflist_install() {
    let entry = json!({"cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni", "x": 1});
    struct Case {
        name: &'static str,
        files: Vec<(&'static str, String, u32)>,
        written: &'static str,
        gone: Option<&'static str>,
        plugin_types: Vec<&'static str>,
        mode: u32,
    }
    let flannel = json!({"name": "cbr0", "cniVersion": "0.3.1",
        "plugins": [{"type": "flannel"}, {"type": "portmap"}]})
    .to_string();
    let with_old = json!({"name": "cbr0", "cniVersion": "0.3.1",
        "plugins": [{"type": "istio-cni", "old": true}, {"type": "flannel"}]})
    .to_string();
    let cases = [
        Case {
            name: "conflist appended",
            files: vec![("10-flannel.conflist", flannel.clone(), 0o644)],
            written: "10-flannel.conflist",
            gone: None,
            plugin_types: vec!["flannel", "portmap", "istio-cni"],
            mode: 0o644,
        },
        Case {
            name: "conf wrapped and renamed, mode kept",
            files: vec![(
                "10-bridge.conf",
                json!({"cniVersion": "0.3.1", "name": "b", "type": "bridge"}).to_string(),
                0o600,
            )],
            written: "10-bridge.conflist",
            gone: Some("10-bridge.conf"),
            plugin_types: vec!["bridge", "istio-cni"],
            mode: 0o600,
        },
        Case {
            name: "existing entry replaced, first valid file wins",
            files: vec![
                ("05-broken.conflist", "{nope".into(), 0o644),
                ("06-notes.txt", "{}".into(), 0o644),
                ("10-a.conflist", with_old, 0o640),
                ("20-b.conflist", flannel, 0o644),
            ],
            written: "10-a.conflist",
            gone: None,
            plugin_types: vec!["flannel", "istio-cni"],
            mode: 0o640,
        },
    ];
    for c in cases {
        let dir = tempfile::tempdir().unwrap();
        for (name, text, mode) in &c.files {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
        }
        let written = install_conflist(dir.path(), &entry).unwrap();
        assert_eq!(written, dir.path().join(c.written), "{}", c.name);
        if let Some(g) = c.gone {
            assert!(!dir.path().join(g).exists(), "{}", c.name);
        }
        let v: Value = serde_json::from_slice(&std::fs::read(&written).unwrap()).unwrap();
        let types: Vec<&str> = v["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, c.plugin_types, "{}", c.name);
        let last = v["plugins"].as_array().unwrap().last().unwrap();
        assert_eq!(last["x"], 1, "{}", c.name);
        assert!(last.get("cniVersion").is_none(), "{}", c.name);
        let mode = std::fs::metadata(&written).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, c.mode, "{}", c.name);
        // Idempotent: a second install keeps exactly one istio-cni entry.
        install_conflist(dir.path(), &entry).unwrap();
        let v: Value = serde_json::from_slice(&std::fs::read(&written).unwrap()).unwrap();
        let n = v["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "istio-cni")
            .count();
        assert_eq!(n, 1, "{}", c.name);
        // No temp files left behind.
        assert!(
            std::fs::read_dir(dir.path()).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".tmp."))
        );
    }

    let empty = tempfile::tempdir().unwrap();
    assert!(install_conflist(empty.path(), &entry).is_err());
}
