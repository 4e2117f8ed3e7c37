//! Restart discovery (`spec/cni.md` §1.8 step 3) of CRI-O containers whose cgroup names no
//! pod (root, network namespaces). The pods are real namespaces with real addresses; the
//! proc tree is a temp dir whose `<pid>/ns/net` links point at those namespaces (a real
//! process's cgroup cannot be faked), as in `agent_restart.rs`.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;

use ambit_agent::discovery::find_pod_netns;
use ambit_netns::NetnsFd;
use ambit_netns::testing::netns_capable_or_skip;
use ambit_topology::Topology;

const CRIO_A: &str = "45490e76e0878aaa4d9808f7d2eefba37f093c3efbba9838b6d8ab804d9bd814";
const CRIO_B: &str = "9bca8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";

fn uid(n: u8) -> String {
    let d = char::from(b'0' + n);
    let g = |len: usize| d.to_string().repeat(len);
    format!("{}-{}-4{}-8{}-{}", g(8), g(4), g(3), g(3), g(12))
}

/// A `/proc/<pid>` entry: its cgroup file, its netns link, and a start time (`None`: no
/// `stat` file, which sorts last).
fn process(proc_root: &Path, pid: u32, cgroup: &str, netns: &Path, start: Option<u64>) {
    let dir = proc_root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    std::os::unix::fs::symlink(netns, dir.join("ns/net")).unwrap();
    if let Some(start) = start {
        let fields = vec!["0"; 18].join(" ");
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (pause) S {fields} {start} 0\n"),
        )
        .unwrap();
    }
}

#[test]
fn crio_containers_outside_a_pod_slice_are_found_by_their_ips() {
    if !netns_capable_or_skip("crio_containers_outside_a_pod_slice_are_found_by_their_ips") {
        return;
    }
    let topo = Topology::builder()
        .node("n")
        .pod("n", "p1")
        .pod("n", "p2")
        .pod("n", "p3")
        .pod("n", "p4")
        .build()
        .unwrap();
    let ip = |p: &str| IpAddr::V4(topo.pod(p).ip());
    let ns = |p: &str| topo.pod(p).netns_path();
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    let host = Path::new("/proc/self/ns/net");
    let crio = |id: &str| format!("0::/../crio-{id}.scope\n");

    process(&proc_root, 1, "0::/init.scope\n", host, Some(1));
    // p1: two CRI-O containers with no pod in their cgroup; the older one wins.
    process(&proc_root, 10, &crio(CRIO_A), &ns("p1"), Some(500));
    process(&proc_root, 11, &crio(CRIO_B), &ns("p1"), Some(400));
    // p2: the usual pod slice.
    process(
        &proc_root,
        20,
        &format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/crio-{CRIO_A}.scope\n",
            uid(2).replace('-', "_")
        ),
        &ns("p2"),
        Some(300),
    );
    // p3 is not wanted: its container is nobody's.
    process(&proc_root, 30, &crio(CRIO_A), &ns("p3"), Some(200));
    // p4 only has a conmon process in its netns (not a container: never taken).
    process(
        &proc_root,
        40,
        &format!("0::/system.slice/crio-conmon-{CRIO_A}.scope\n"),
        &ns("p4"),
        Some(100),
    );
    // A CRI-O container in the host netns is never a pod's.
    process(&proc_root, 50, &crio(CRIO_B), host, Some(50));

    let pid_of = |wanted: &HashMap<String, Vec<IpAddr>>, claimed: &HashSet<_>| {
        let found = find_pod_netns(&proc_root, wanted, claimed).unwrap();
        let mut pids: Vec<(String, u32)> = found.iter().map(|(u, f)| (u.clone(), f.pid)).collect();
        pids.sort();
        pids
    };
    let p1_id = NetnsFd::open(ns("p1")).unwrap().identity();
    let wanted = |pods: &[(u8, &str)]| -> HashMap<String, Vec<IpAddr>> {
        pods.iter().map(|(n, p)| (uid(*n), vec![ip(p)])).collect()
    };
    // (wanted pods, claimed namespaces, found (uid, pid))
    type Wanted = HashMap<String, Vec<IpAddr>>;
    type Claimed = HashSet<ambit_netns::NetnsId>;
    type Case = (Wanted, Claimed, Vec<(String, u32)>);
    let cases: Vec<Case> = vec![
        (
            wanted(&[(1, "p1"), (2, "p2"), (4, "p4")]),
            HashSet::new(),
            vec![(uid(1), 11), (uid(2), 20)],
        ),
        // Two wanted pods claim p1's IP: the CRI-O containers are ambiguous and skipped;
        // the pod-slice process of p2 is still found.
        (
            wanted(&[(1, "p1"), (5, "p1"), (2, "p2")]),
            HashSet::new(),
            vec![(uid(2), 20)],
        ),
        // p1's netns is already held by another pod.
        (
            wanted(&[(1, "p1"), (2, "p2")]),
            HashSet::from([p1_id]),
            vec![(uid(2), 20)],
        ),
        // A wanted pod without IPs is deferred, never guessed.
        (HashMap::from([(uid(1), vec![])]), HashSet::new(), vec![]),
    ];
    for (i, (wanted, claimed, want)) in cases.into_iter().enumerate() {
        assert_eq!(pid_of(&wanted, &claimed), want, "case {i}");
    }
}
