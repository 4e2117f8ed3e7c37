//! Agent lifecycle end-to-end tests in network namespaces (root): restart discovery
//! (`spec/cni.md` §1.8) and upgrade-vs-uninstall shutdown (§1.10).
//!
//! A topology node plays the host (host rules and probe set live there). Pod "processes"
//! are real `sleep`s started inside the pod namespaces; since a real process's cgroup
//! cannot be faked, the agent's host prefix (`AMBIT_HOST_PREFIX`) points at a temp dir
//! holding a fake `proc/` tree: `proc/<pid>/cgroup` files in kubelet formats and
//! `proc/<pid>/ns/net` symlinks to the real `/proc/<sleep pid>/ns/net`.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use ambit_agent::testing::cni_add;
use ambit_testkit::eventually;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambit_agent::installer::conflist::install_conflist;
use ambit_agent::pods::{Namespace, Pod, PodPhase};
use ambit_agent::shutdown::{AlwaysUpgrade, ShutdownKind, check_for};
use ambit_agent::testing::{FakeZtunnel, Seen};
use ambit_agent::{AgentConfig, LocalPodSource};
use ambit_netns::testing::netns_capable_or_skip;
use ambit_topology::Topology;

const WAIT: Duration = Duration::from_secs(10);
const MODE: &str = "istio.io/dataplane-mode";

fn uid(n: u8) -> String {
    let d = char::from(b'0' + n);
    let g = |len: usize| d.to_string().repeat(len);
    format!("{}-{}-4{}-8{}-{}", g(8), g(4), g(3), g(3), g(12))
}

fn pod(name: &str, uid: &str, ip: IpAddr, ambient: bool) -> Pod {
    let mut labels = BTreeMap::new();
    if !ambient {
        labels.insert(MODE.to_string(), "none".to_string());
    }
    Pod {
        name: name.into(),
        namespace: "demo".into(),
        uid: uid.into(),
        service_account: "default".into(),
        ips: vec![ip],
        phase: PodPhase::Running,
        labels,
        ..Pod::default()
    }
}

fn out(topo: &Topology, ns: &str, argv: &[&str]) -> String {
    let o = topo.exec(ns, argv).unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// In-pod rules in a comparable form (`-S` has no counters or timestamps).
fn pod_rules(topo: &Topology, ns: &str) -> String {
    ["nat", "mangle", "raw"]
        .iter()
        .map(|t| out(topo, ns, &["iptables", "-t", t, "-S"]))
        .collect()
}

/// Whether an app in `pod` (an unmarked socket) gets a TCP connection to `to`.
fn app_reaches(topo: &Topology, pod: &str, to: SocketAddr) -> bool {
    topo.pod(pod)
        .netns()
        .run(|| TcpStream::connect_timeout(&to, Duration::from_millis(300)).is_ok())
        .unwrap()
}

fn probe_set(topo: &Topology, node: &str) -> String {
    out(topo, node, &["ipset", "list", "istio-inpod-probes-v4"])
}

/// A temp dir that plays `/host`: `var` and `run` link to the real ones (netns paths from
/// CNI events resolve), `proc` is a fake tree filled by [`FakeProc::process`].
struct FakeHost {
    dir: tempfile::TempDir,
}

impl FakeHost {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for d in ["var", "run"] {
            std::os::unix::fs::symlink(format!("/{d}"), dir.path().join(d)).unwrap();
        }
        let host = Self { dir };
        // The test process plays the host (`/proc/1/ns/net` may be unreadable in containers).
        host.process("1", None, "/proc/self/ns/net", None);
        host
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// `proc/<pid>` with a cgroup file, `ns/net` → `netns_target` and optionally a stat.
    fn process(&self, pid: &str, cgroup: Option<&str>, netns_target: &str, start: Option<u64>) {
        let dir = self.root().join("proc").join(pid);
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        if let Some(c) = cgroup {
            std::fs::write(dir.join("cgroup"), c).unwrap();
        }
        std::os::unix::fs::symlink(netns_target, dir.join("ns/net")).unwrap();
        if let Some(s) = start {
            std::fs::write(
                dir.join("stat"),
                format!("{pid} (sleep) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 {s} 2000 90 18446744073709551615\n"),
            )
            .unwrap();
        }
    }
}

fn systemd_v2(uid: &str) -> String {
    format!(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-4f2a.scope\n",
        uid.replace('-', "_")
    )
}

fn cgroupfs_v1(uid: &str) -> String {
    format!(
        "12:pids:/kubepods/burstable/pod{uid}/0e1f\n11:memory:/kubepods/burstable/pod{uid}/0e1f\n1:name=systemd:/kubepods/burstable/pod{uid}/0e1f\n"
    )
}

fn vars(kv: &[(&str, String)]) -> Vec<(String, String)> {
    kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

fn base_vars(dir: &Path, host_netns: &Path) -> Vec<(&'static str, String)> {
    vec![
        (
            "ZTUNNEL_UDS_ADDRESS",
            dir.join("zt/ztunnel.sock").display().to_string(),
        ),
        ("CNI_AGENT_RUN_DIR", dir.join("run").display().to_string()),
        (
            "MOUNTED_CNI_NET_DIR",
            dir.join("net.d").display().to_string(),
        ),
        ("AMBIT_HOST_NETNS", host_netns.display().to_string()),
        ("AMBIT_HEALTH_ADDR", "127.0.0.1:0".into()),
        ("AMBIT_METRICS_ADDR", "127.0.0.1:0".into()),
        ("AMBIT_VERIFY_INTERVAL", "300ms".into()),
        ("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", "true".into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rediscovers_running_pods() {
    if !netns_capable_or_skip("restart_rediscovers_running_pods") {
        return;
    }
    // p1, p2: ambient with processes; p3: not ambient (its netns is the decoy);
    // p4: ambient, enrolled, but no process to find (ztunnel gets Keep).
    let topo = Topology::builder()
        .node("n")
        .pod("n", "p1")
        .pod("n", "p2")
        .pod("n", "p3")
        .pod("n", "p4")
        .build()
        .unwrap();
    let sleeps: Vec<_> = ["p1", "p1", "p2", "p3"]
        .iter()
        .map(|p| topo.spawn(p, &["sleep", "600"]).unwrap())
        .collect();
    let ns_of = |i: usize| format!("/proc/{}/ns/net", sleeps[i].id());

    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::new();
    let (u1, u2, u3, u4) = (uid(1), uid(2), uid(3), uid(4));
    // Tree: (pid, cgroup, netns, start time). Expected outcome in comments.
    host.process("self", Some(&systemd_v2(&u1)), &ns_of(0), Some(1)); // non-numeric: skipped
    host.process("50", Some(&systemd_v2(&u1)), "/proc/self/ns/net", Some(1)); // host netns: skipped
    host.process("100", Some(&systemd_v2(&u1)), &ns_of(0), Some(500)); // p1
    host.process("101", Some(&systemd_v2(&u1)), &ns_of(3), Some(2)); // p1's UID, p3's netns: rejected
    host.process("103", Some(&systemd_v2(&u1)), &ns_of(1), Some(400)); // p1, older: wins
    host.process("102", Some(&cgroupfs_v1(&u2)), &ns_of(2), None); // p2, no stat
    host.process("104", Some(&systemd_v2(&u3)), &ns_of(3), Some(3)); // unwanted UID
    host.process(
        "105",
        Some("0::/system.slice/containerd.service\n"),
        &ns_of(3),
        None,
    );
    host.process("106", None, &ns_of(0), None); // no cgroup file

    let node_ns = topo.node("n").netns().path();
    let mut kv = base_vars(dir.path(), &node_ns);
    kv.push(("AMBIT_HOST_PREFIX", host.root().display().to_string()));
    let cfg = AgentConfig::from_vars(&vars(&kv)).unwrap();
    let run_dir = cfg.run_dir.clone();
    let zds_sock = cfg.zds_socket.clone();

    let source = LocalPodSource::new();
    source.upsert_namespace(Namespace {
        name: "demo".into(),
        labels: BTreeMap::from([(MODE.to_string(), "ambient".to_string())]),
    });
    let ip = |p: &str| IpAddr::V4(topo.pod(p).ip());
    for (name, u, ambient) in [
        ("p1", &u1, true),
        ("p2", &u2, true),
        ("p3", &u3, false),
        ("p4", &u4, true),
    ] {
        source.upsert_pod(pod(name, u, ip(name), ambient));
    }

    // First agent: enrol through the CNI path.
    let agent = ambit_agent::start(cfg.clone(), source.clone())
        .await
        .unwrap();
    let zt = FakeZtunnel::connect(&zds_sock, true).unwrap();
    for p in ["p1", "p2", "p4"] {
        let (code, o) = cni_add(&run_dir, &topo.pod(p).netns_path(), p, ip(p));
        assert_eq!(code, 0, "{p}: {o}");
        assert_eq!(source.redirection("demo", p).as_deref(), Some("enabled"));
    }
    let rules: BTreeMap<&str, String> = ["p1", "p2", "p4"]
        .into_iter()
        .map(|p| (p, pod_rules(&topo, p)))
        .collect();
    assert!(rules.values().all(|r| r.contains("ISTIO_OUTPUT")));

    // The agent goes away (upgrade-safe); ztunnel's connection drops with it.
    agent.shutdown().await;
    drop(zt);
    // A stale entry a deleted pod left behind: pruned at restart.
    let added = out(
        &topo,
        "n",
        &[
            "ipset",
            "add",
            "istio-inpod-probes-v4",
            "10.99.99.99",
            "comment",
            "gone-uid",
        ],
    );
    assert!(added.is_empty(), "{added}");

    // Second agent: discovery before ZDS accepts.
    let agent = ambit_agent::start(cfg, source.clone()).await.unwrap();
    let mut found = agent.restart.found.clone();
    found.sort();
    assert_eq!(found, vec![u1.clone(), u2.clone()]);
    assert_eq!(agent.restart.keep, vec![u4.clone()]);
    assert_eq!(agent.restart.pruned, 1);

    let zt = FakeZtunnel::connect(&zds_sock, true).unwrap();
    eventually("the snapshot to reach the fake ztunnel", WAIT, || {
        zt.seen().contains(&Seen::SnapshotSent)
    })
    .await;
    let seen = zt.seen();
    let netns_of_add = |u: &str| {
        seen.iter().find_map(|s| match s {
            Seen::Add {
                uid, netns, fds: 1, ..
            } if uid == u => Some(*netns),
            _ => None,
        })
    };
    for (u, p) in [(&u1, "p1"), (&u2, "p2")] {
        assert_eq!(
            netns_of_add(u),
            Some(Some(topo.pod(p).netns_fd().identity())),
            "{p}: {seen:?}"
        );
    }
    assert!(
        seen.contains(&Seen::Keep {
            uid: u4.clone(),
            fds: 0
        }),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|s| matches!(s, Seen::Add { uid, .. } | Seen::Keep { uid, .. } if *uid == u3))
    );
    assert_eq!(seen.last(), Some(&Seen::SnapshotSent));

    // Data path untouched: same rules, probe entries kept, stale one gone.
    for (p, before) in &rules {
        assert_eq!(&pod_rules(&topo, p), before, "{p}");
    }
    let set = probe_set(&topo, "n");
    for p in ["p1", "p2", "p4"] {
        assert!(set.contains(&ip(p).to_string()), "{p}: {set}");
    }
    assert!(!set.contains("10.99.99.99"), "{set}");
    eventually("agent.metrics.unprotected.get() == 0", WAIT, || {
        agent.metrics.unprotected.get() == 0
    })
    .await;

    // A discovered pod is a full citizen: un-enrolling it deletes its rules.
    let mut p1 = source.pod("demo", "p1").unwrap();
    p1.labels.insert(MODE.into(), "none".into());
    source.upsert_pod(p1);
    eventually(
        "source.redirection(\"demo\", \"p1\").is_none()",
        WAIT,
        || source.redirection("demo", "p1").is_none(),
    )
    .await;
    assert!(!pod_rules(&topo, "p1").contains("ISTIO"));
    assert!(zt.seen().contains(&Seen::Del { uid: u1.clone() }));

    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_upgrade_keeps_uninstall_cleans() {
    if !netns_capable_or_skip("shutdown_upgrade_keeps_uninstall_cleans") {
        return;
    }
    let topo = Topology::builder()
        .node("n")
        .pod("n", "p1")
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let net_d = dir.path().join("net.d");
    std::fs::create_dir_all(&net_d).unwrap();
    std::fs::write(
        net_d.join("10-bridge.conflist"),
        r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    let conflist = install_conflist(&net_d, &serde_json::json!({"type": "istio-cni"})).unwrap();

    let source = LocalPodSource::new();
    source.upsert_namespace(Namespace {
        name: "demo".into(),
        labels: BTreeMap::from([(MODE.to_string(), "ambient".to_string())]),
    });
    let ip = IpAddr::V4(topo.pod("p1").ip());
    // With its netns hint, so the restarted agent finds it (and adopts its guard).
    let mut p1 = pod("p1", &uid(1), ip, true);
    p1.netns = Some(topo.pod("p1").netns_path());
    source.upsert_pod(p1);
    let node_ns = topo.node("n").netns().path();
    // Something outside the pod for its app to reach.
    let outside = SocketAddr::new(topo.pod("p1").gateway().into(), 18080);
    let _listener = topo
        .node("n")
        .netns()
        .run(|| TcpListener::bind(outside))
        .unwrap()
        .unwrap();

    struct Step {
        name: &'static str,
        disable_safe_upgrade: bool,
        want: ShutdownKind,
        /// Host rules, probe set, CNI entry and plugin socket still there afterwards.
        host_state_kept: bool,
    }
    let steps = [
        Step {
            name: "upgrade (default)",
            disable_safe_upgrade: false,
            want: ShutdownKind::Upgrade,
            host_state_kept: true,
        },
        Step {
            name: "uninstall (AMBIENT_DISABLE_SAFE_UPGRADE)",
            disable_safe_upgrade: true,
            want: ShutdownKind::Uninstall,
            host_state_kept: false,
        },
    ];
    for step in steps {
        let mut kv = base_vars(dir.path(), &node_ns);
        kv.push((
            "AMBIENT_DISABLE_SAFE_UPGRADE",
            step.disable_safe_upgrade.to_string(),
        ));
        let cfg = AgentConfig::from_vars(&vars(&kv)).unwrap();
        let (run_dir, zds_sock) = (cfg.run_dir.clone(), cfg.zds_socket.clone());
        let check = check_for(&cfg);
        let agent = ambit_agent::start(cfg, source.clone()).await.unwrap();
        let zt = FakeZtunnel::connect(&zds_sock, true).unwrap();
        if source.redirection("demo", "p1").is_none() {
            let (code, o) = cni_add(&run_dir, &topo.pod("p1").netns_path(), "p1", ip);
            assert_eq!(code, 0, "{o}");
        }
        let set = probe_set(&topo, "n");
        assert!(
            set.contains(&ip.to_string()),
            "{}: {set} {:?} {:?}",
            step.name,
            agent.restart,
            source.annotation_log()
        );

        let kind = agent.shutdown_with(check.as_ref()).await.unwrap();
        drop(zt);
        assert_eq!(kind, step.want, "{}", step.name);
        let host_rules = out(&topo, "n", &["iptables", "-t", "nat", "-S"]);
        let sets = out(&topo, "n", &["ipset", "list", "-n"]);
        let conf = std::fs::read_to_string(&conflist).unwrap();
        let checks = [
            ("host rules", host_rules.contains("ISTIO_POSTRT")),
            ("probe set", sets.contains("istio-inpod-probes-v4")),
            ("CNI entry", conf.contains("istio-cni")),
            (
                "plugin socket",
                PathBuf::from(&run_dir).join("pluginevent.sock").exists(),
            ),
        ];
        for (what, present) in checks {
            assert_eq!(present, step.host_state_kept, "{}: {what}", step.name);
        }
        // The primary network's own entry always survives.
        assert!(conf.contains("bridge"), "{}", step.name);
        // Never on shutdown: the running pod stays captured.
        assert!(
            pod_rules(&topo, "p1").contains("ISTIO_OUTPUT"),
            "{}",
            step.name
        );
        // The fail-closed guard: the owned table goes with the agent; the standby table
        // stays after an upgrade, so a nat flush while no agent runs does not open the
        // pod, and goes with an uninstall.
        let tables = || out(&topo, "p1", &["nft", "list", "tables"]);
        eventually("the owned guard table goes with the agent", WAIT, || {
            !tables()
                .lines()
                .any(|l| l.trim() == "table inet ambit-guard")
        })
        .await;
        let upgrade = step.want == ShutdownKind::Upgrade;
        let now = tables();
        assert_eq!(
            now.contains("table inet ambit-guard-standby"),
            upgrade,
            "{}: {now}",
            step.name
        );
        if upgrade {
            let flushed = topo.exec("p1", &["iptables", "-t", "nat", "-F"]).unwrap();
            assert!(flushed.status.success());
            assert!(
                !app_reaches(&topo, "p1", outside),
                "{}: the app left the pod with the agent down and its rules flushed",
                step.name
            );
        }
    }
    // The explicit check objects agree with the configuration mapping.
    assert_eq!(
        ambit_agent::shutdown::UninstallCheck::decide(&AlwaysUpgrade).await,
        ShutdownKind::Upgrade
    );
}
