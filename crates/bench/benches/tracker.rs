//! Micro-benchmark of what one workload change costs the inbound connection tracker as the
//! mesh grows (100, 1,000, 10,000 workloads, each with one open connection on this node):
//! `by change` is what ztunnel does (re-check only the connections the change can affect),
//! `every connection` the full re-check it did before; and a workload lookup by address at
//! the same sizes. Run with `cargo bench -p ambit-bench --bench tracker` (results in
//! BENCHMARKS.md).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use ambit_model::authz::Connection;
use ambit_model::{SpiffeId, Workload, WorkloadUid};
use ambit_ztunnel::proxy::ConnectionTracker;
use ambit_ztunnel::state::ProxyState;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

fn ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, (i >> 16) as u8, (i >> 8) as u8, i as u8))
}

fn workload(i: usize) -> Workload {
    let ns = format!("ns{}", i % 100);
    let mut w = Workload::new(
        WorkloadUid::new(format!("Kubernetes//Pod/{ns}/w{i}")).expect("uid"),
        format!("w{i}"),
        SpiffeId::new("cluster.local", &ns, "default").expect("id"),
    );
    w.addresses = vec![ip(i)];
    w
}

fn bench(c: &mut Criterion) {
    let mut change = c.benchmark_group("one workload change, re-check");
    let mut lookup = Vec::new();
    for n in [100, 1_000, 10_000] {
        let state = ProxyState::new();
        let tracker = ConnectionTracker::new();
        let mut open = Vec::with_capacity(n);
        for i in 0..n {
            state.upsert_workload(workload(i));
            let w = state
                .workload_by_uid(workload(i).uid.as_str())
                .expect("workload");
            let attrs = Connection {
                src_identity: None,
                src_ip: IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1)),
                dst_ip: ip(i),
                dst_port: 8080,
            };
            open.push(tracker.admit(&state, w, attrs).expect("allowed"));
        }
        let mut seen = *state.policy_changes().borrow();
        let changed = workload(n / 2);
        change.bench_with_input(BenchmarkId::new("by change", n), &n, |b, _| {
            b.iter(|| {
                state.upsert_workload(changed.clone());
                let (since, now) = state.changes_since(seen);
                seen = now;
                black_box(tracker.reevaluate_changes(&state, &since))
            })
        });
        change.bench_with_input(BenchmarkId::new("every connection", n), &n, |b, _| {
            b.iter(|| {
                state.upsert_workload(changed.clone());
                black_box(tracker.reevaluate(&state))
            })
        });
        lookup.push((n, state, open));
    }
    change.finish();
    let mut group = c.benchmark_group("workload by address");
    for (n, state, _open) in &lookup {
        let addr = ip(n / 2);
        group.bench_with_input(BenchmarkId::from_parameter(n), n, |b, _| {
            b.iter(|| black_box(state.workload_by_addr("", black_box(addr))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
