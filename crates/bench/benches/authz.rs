//! Micro-benchmark of the per-connection authorization check as the number of policies the
//! node knows grows (100, 1,000, 10,000): all in the workload's namespace (every one
//! applies: before the index, a linear scan) and spread over namespaces (10 per
//! namespace). Each policy allows one principal; only the last policy of the workload's
//! namespace allows the caller. `plain walk` is the reference evaluation over every
//! applicable policy (what `PolicySet::evaluate` did before the index), for comparison.
//! Run with `cargo bench -p ambit-bench --bench authz` (results in BENCHMARKS.md).

use std::fmt::Write as _;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use ambit_model::authz::{Connection, evaluate};
use ambit_model::{LocalConfig, PolicySet, SpiffeId};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

/// A local config with one workload (`default/server`) and `policies` ALLOW policies
/// spread round-robin over `namespaces` namespaces (`default` first). Each allows one
/// principal; only the last policy of `default` allows the caller.
fn config(policies: usize, namespaces: usize) -> LocalConfig {
    let mut y = String::from(
        "workloads:\n- uid: cluster1//v1/Pod/default/server\n  name: server\n  namespace: default\n  serviceAccount: server\n  trustDomain: cluster.local\n  node: node1\n  workloadIps: [\"10.0.0.2\"]\n  protocol: HBONE\nservices: []\npolicies:\n",
    );
    let in_default = policies.div_ceil(namespaces);
    for i in 0..policies {
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
    for (layout, per_namespace) in [
        ("all in one namespace", None),
        ("10 per namespace", Some(10)),
    ] {
        let mut group = c.benchmark_group(format!("authorize, {layout}"));
        for policies in [100, 1_000, 10_000] {
            let namespaces = per_namespace.map_or(1, |k| policies / k);
            let cfg = config(policies, namespaces);
            let workload = cfg.workloads[0].clone();
            let mut set = PolicySet::new();
            for p in cfg.policies {
                set.insert(p);
            }
            assert_eq!(set.len(), policies);
            assert!(set.evaluate(&workload, &conn).is_allowed());
            group.bench_with_input(BenchmarkId::new("indexed", policies), &policies, |b, _| {
                b.iter(|| black_box(set.evaluate(black_box(&workload), black_box(&conn))))
            });
            group.bench_with_input(
                BenchmarkId::new("plain walk", policies),
                &policies,
                |b, _| {
                    b.iter(|| {
                        black_box(evaluate(
                            set.for_workload(black_box(&workload)),
                            black_box(&conn),
                        ))
                    })
                },
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
