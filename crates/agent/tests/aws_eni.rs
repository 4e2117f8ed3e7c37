//! AWS VPC CNI branch-ENI probe rules (`spec/cni.md` §3.11) in real network namespaces
//! (root). A topology node plays the host: aws-vpc-cni's per-pod table route and
//! `iif <veth> lookup <table>` rule are set up there with `ip`, `tcp_early_demux` is set
//! inside that node's netns only (the root namespace is never touched), and the agent's
//! hooks run against it through the same runner the agent uses. Everything lives in the
//! topology's namespaces, which are deleted on drop, panics included.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use ambit_agent::testing::cni_add;
use ambit_testkit::eventually;
use std::net::IpAddr;
use std::sync::Arc;

use ambit_agent::daemon::aws_eni::{self, BranchEniRoute};
use ambit_netns::NetnsFd;
use ambit_netns::testing::netns_capable_or_skip;
use ambit_redirect::{FdRunner, HostRunner};
use ambit_topology::Topology;

const TABLE: u32 = 101;
const IIF_PREF: u32 = 10;

fn sh(topo: &Topology, ns: &str, argv: &[&str]) -> String {
    let out = topo.exec(ns, argv).unwrap();
    assert!(
        out.status.success(),
        "{argv:?} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rules(topo: &Topology, node: &str) -> String {
    sh(topo, node, &["ip", "-4", "rule", "show"])
}

/// What aws-vpc-cni sets up for a branch-ENI pod: its host route moved to a per-pod table
/// and an `iif` rule sending the pod's traffic there.
fn branch_eni(topo: &Topology, node: &str, pod: &str) {
    let (veth, ip) = (topo.pod(pod).host_veth(), topo.pod(pod).ip().to_string());
    let (table, pref) = (TABLE.to_string(), IIF_PREF.to_string());
    sh(
        topo,
        node,
        &[
            "ip",
            "route",
            "add",
            &format!("{ip}/32"),
            "dev",
            &veth,
            "table",
            &table,
        ],
    );
    sh(
        topo,
        node,
        &[
            "ip", "rule", "add", "iif", &veth, "lookup", &table, "pref", &pref,
        ],
    );
}

fn early_demux(topo: &Topology, node: &str, value: &str) {
    sh(
        topo,
        node,
        &[
            "sysctl",
            "-q",
            "-w",
            &format!("net.ipv4.tcp_early_demux={value}"),
        ],
    );
    let now = sh(topo, node, &["cat", "/proc/sys/net/ipv4/tcp_early_demux"]);
    assert_eq!(now.trim(), value, "the sysctl is per network namespace");
}

fn host_runner(topo: &Topology, node: &str) -> HostRunner {
    HostRunner::Fd(FdRunner {
        netns: Arc::new(NetnsFd::open(topo.node(node).netns_path()).unwrap()),
    })
}

#[test]
fn branch_eni_rules_follow_the_pod() {
    if !netns_capable_or_skip("branch_eni_rules_follow_the_pod") {
        return;
    }
    // n1: a Security-Groups-for-Pods node (early demux off) with a branch-ENI pod `eni` and
    // a regular pod `plain`; n2: the same pod setup but early demux on (the gate).
    let topo = Topology::builder()
        .node("n1")
        .node("n2")
        .pod("n1", "eni")
        .pod("n1", "plain")
        .pod("n2", "eni2")
        .build()
        .unwrap();
    early_demux(&topo, "n1", "0");
    branch_eni(&topo, "n1", "eni");
    branch_eni(&topo, "n2", "eni2");
    let ip = |p: &str| IpAddr::V4(topo.pod(p).ip());
    let veth = topo.pod("eni").host_veth();
    let forward = format!("512:\tfrom all to {} lookup {TABLE}", ip("eni"));
    let ret = format!("{}:\tfrom all iif {veth} lookup local", IIF_PREF - 1);
    let aws = format!("{IIF_PREF}:\tfrom all iif {veth} lookup {TABLE}");
    let n1 = host_runner(&topo, "n1");
    let n2 = host_runner(&topo, "n2");
    let before_n1 = rules(&topo, "n1");
    let before_n2 = rules(&topo, "n2");

    // Detection on its own: found for the branch-ENI pod, nothing for the regular one.
    assert!(aws_eni::early_demux_disabled(&n1));
    assert!(!aws_eni::early_demux_disabled(&n2));
    assert_eq!(
        aws_eni::detect(&n1, ip("eni")).unwrap(),
        Some(BranchEniRoute {
            ip: ip("eni"),
            table: TABLE,
            veth: veth.clone(),
            iif_pref: IIF_PREF,
        })
    );
    assert_eq!(aws_eni::detect(&n1, ip("plain")).unwrap(), None);

    // (host, enabled, pod, rules added)
    let cases = [
        (&n1, false, "eni", false),  // AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE=false
        (&n2, true, "eni2", false),  // tcp_early_demux=1: inert
        (&n1, true, "plain", false), // not a branch-ENI pod
        (&n1, true, "eni", true),
    ];
    for (runner, enabled, pod, added) in cases {
        let case = format!("{pod} enabled={enabled}");
        aws_eni::on_add(runner, enabled, pod, &[ip(pod)]);
        let (node, before) = if std::ptr::eq(runner, &n1) {
            ("n1", &before_n1)
        } else {
            ("n2", &before_n2)
        };
        let now = rules(&topo, node);
        if added {
            assert!(now.contains(&forward), "{case}:\n{now}");
            assert!(now.contains(&ret), "{case}:\n{now}");
            assert_eq!(aws_eni::remembered(runner).len(), 1, "{case}");
        } else {
            assert_eq!(&now, before, "{case}");
        }
    }
    // Enrolling again (a retry) is idempotent.
    aws_eni::on_add(&n1, true, "eni", &[ip("eni")]);
    let now = rules(&topo, "n1");
    assert_eq!(now.matches(&forward).count(), 1, "{now}");
    assert_eq!(now.matches(&ret).count(), 1, "{now}");

    // Removing another pod leaves them; removing the pod deletes exactly ours.
    aws_eni::on_remove(&n1, "plain", &[ip("plain")]);
    assert!(rules(&topo, "n1").contains(&forward));
    aws_eni::on_remove(&n1, "eni", &[ip("eni")]);
    let now = rules(&topo, "n1");
    assert_eq!(now, before_n1, "only our rules go");
    assert!(now.contains(&aws), "aws-vpc-cni's rule stays:\n{now}");
    assert!(aws_eni::remembered(&n1).is_empty());

    // Uninstall: everything still remembered goes, even rules deleted behind our back.
    aws_eni::on_add(&n1, true, "eni", &[ip("eni")]);
    assert!(rules(&topo, "n1").contains(&forward));
    let errors = aws_eni::remove_all(&n1);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(rules(&topo, "n1"), before_n1);
    aws_eni::on_add(&n1, true, "eni", &[ip("eni")]);
    sh(&topo, "n1", &["ip", "rule", "del", "pref", "512"]);
    let errors = aws_eni::remove_all(&n1);
    assert!(errors.is_empty(), "already gone is fine: {errors:?}");
    assert_eq!(rules(&topo, "n1"), before_n1);
}

/// The agent calls the hooks: a CNI ADD of a branch-ENI pod adds the host rules, its
/// un-enrolment removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_adds_and_removes_branch_eni_rules() {
    use ambit_agent::pods::{Namespace, Pod, PodPhase};
    use ambit_agent::testing::FakeZtunnel;
    use std::collections::BTreeMap;
    use std::time::Duration;

    if !netns_capable_or_skip("agent_adds_and_removes_branch_eni_rules") {
        return;
    }
    let topo = Topology::builder()
        .node("n")
        .pod("n", "eni")
        .build()
        .unwrap();
    early_demux(&topo, "n", "0");
    branch_eni(&topo, "n", "eni");
    let ip = IpAddr::V4(topo.pod("eni").ip());
    let forward = format!("512:\tfrom all to {ip} lookup {TABLE}");
    let ret = format!(
        "{}:\tfrom all iif {} lookup local",
        IIF_PREF - 1,
        topo.pod("eni").host_veth()
    );
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let zds_sock = dir.path().join("zt").join("ztunnel.sock");
    let vars: Vec<(String, String)> = [
        ("ZTUNNEL_UDS_ADDRESS", zds_sock.display().to_string()),
        ("CNI_AGENT_RUN_DIR", run_dir.display().to_string()),
        (
            "AMBIT_HOST_NETNS",
            topo.node("n").netns_path().display().to_string(),
        ),
        ("AMBIT_HEALTH_ADDR", "127.0.0.1:0".into()),
        ("AMBIT_METRICS_ADDR", "127.0.0.1:0".into()),
        ("AMBIT_VERIFY_INTERVAL", "0".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let cfg = ambit_agent::AgentConfig::from_vars(&vars).unwrap();
    assert!(cfg.aws_branch_eni_probe, "on by default");
    let source = ambit_agent::LocalPodSource::new();
    source.upsert_namespace(Namespace {
        name: "demo".into(),
        labels: BTreeMap::from([("istio.io/dataplane-mode".into(), "ambient".into())]),
    });
    let pod = Pod {
        name: "eni".into(),
        namespace: "demo".into(),
        uid: "uid-eni".into(),
        service_account: "default".into(),
        ips: vec![ip],
        phase: PodPhase::Running,
        ..Pod::default()
    };
    source.upsert_pod(pod.clone());
    let agent = ambit_agent::start(cfg, source.clone()).await.unwrap();
    let _zt = FakeZtunnel::connect(&zds_sock, true).unwrap();

    let (code, out) = cni_add(&run_dir, &topo.pod("eni").netns_path(), "eni", ip);
    assert_eq!(code, 0, "{out}");
    let now = rules(&topo, "n");
    assert!(now.contains(&forward) && now.contains(&ret), "{now}");

    let mut off = pod;
    off.labels
        .insert("istio.io/dataplane-mode".into(), "none".into());
    source.upsert_pod(off);
    // The two rules go one after the other: wait for both.
    let either = |r: &str| r.contains(&forward) || r.contains(&ret);
    eventually(
        "both branch-ENI rules to go",
        Duration::from_secs(10),
        || !either(&rules(&topo, "n")),
    )
    .await;
    let now = rules(&topo, "n");
    assert!(!now.contains(&forward), "{now}");
    assert!(!now.contains(&ret), "{now}");
    agent.shutdown().await;
}
