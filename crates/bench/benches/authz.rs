//! Micro-benchmark of the per-connection authorization check with 10,000 policies known to
//! the node: spread over 1,000 namespaces (10 apply to the workload, the common case) and
//! all in the workload's namespace (every one applies: the worst case, a linear scan).
//! Run with `cargo bench -p ambit-bench --bench authz` (results in BENCHMARKS.md).

use std::fmt::Write as _;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use ambit_model::authz::Connection;
use ambit_model::{LocalConfig, PolicySet, SpiffeId};
use criterion::{Criterion, criterion_group, criterion_main};

const POLICIES: usize = 10_000;

/// A local config with one workload (`default/server`) and `POLICIES` ALLOW policies
/// spread round-robin over `namespaces` namespaces (`default` first). Each allows one
/// principal; only the last policy of `default` allows the caller, so evaluation walks
/// every policy that applies before it finds the match.
fn config(namespaces: usize) -> LocalConfig {
    let mut y = String::from(
        "workloads:\n- uid: cluster1//v1/Pod/default/server\n  name: server\n  namespace: default\n  serviceAccount: server\n  trustDomain: cluster.local\n  node: node1\n  workloadIps: [\"10.0.0.2\"]\n  protocol: HBONE\nservices: []\npolicies:\n",
    );
    let in_default = POLICIES.div_ceil(namespaces);
    for i in 0..POLICIES {
        let ns = match i % namespaces {
            0 => "default".to_string(),
            n => format!("ns{n}"),
        };
        let sa = if ns == "default" && i / namespaces == in_default - 1 {
            "client".to_string()
        } else {
            format!("other{i}")
        };
        let _ = write!(
            y,
            "- name: p{i}\n  namespace: {ns}\n  scope: Namespace\n  action: Allow\n  rules: [[[ {{principals: [!Exact cluster.local/ns/default/sa/{sa}]}} ]]]\n"
        );
    }
    LocalConfig::from_yaml(&y).expect("generated config parses")
}

fn bench(c: &mut Criterion) {
    let conn = Connection {
        src_identity: Some(SpiffeId::new("cluster.local", "default", "client").expect("id")),
        src_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        dst_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        dst_port: 8080,
    };
    let mut group = c.benchmark_group("authorize, 10k policies");
    for (label, namespaces) in [("10 apply", 1_000), ("all 10k apply", 1)] {
        let cfg = config(namespaces);
        let workload = cfg.workloads[0].clone();
        let mut set = PolicySet::new();
        for p in cfg.policies {
            set.insert(p);
        }
        assert_eq!(set.len(), POLICIES);
        group.bench_function(label, |b| {
            b.iter(|| black_box(set.evaluate(black_box(&workload), black_box(&conn))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
