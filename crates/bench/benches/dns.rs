//! Micro-benchmark of the DNS proxy's local work per query: finding the client pod's workload
//! record and matching the name against the mesh's services (every candidate name of the
//! pod's search list, each tried exactly and as wildcard parents). With 100, 1,000 and
//! 10,000 services (and as many workloads) the per-query cost must not grow with the count.
//! Run with `cargo bench -p ambit-bench --bench dns` (results in BENCHMARKS.md).

use std::hint::black_box;
use std::net::IpAddr;

use ambit_model::names::{NamespacedHostname, WorkloadUid};
use ambit_model::{NetworkAddr, Service, SpiffeId, Workload};
use ambit_ztunnel::dns::resolve::{Family, NameConfig, resolve};
use ambit_ztunnel::state::ProxyState;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

const NAMESPACES: usize = 100;

fn ip(i: usize) -> IpAddr {
    IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8])
}

/// `n` services `svcI.nsK.svc.cluster.local` (K = I mod 100), each with a VIP, and `n`
/// workloads `podI` in the same namespaces.
fn mesh(n: usize) -> ProxyState {
    let services = (0..n)
        .map(|i| {
            let ns = format!("ns{}", i % NAMESPACES);
            let host = format!("svc{i}.{ns}.svc.cluster.local");
            let key = NamespacedHostname::new(&ns, &host).expect("service key");
            let mut s = Service::new(format!("svc{i}"), key);
            s.vips = vec![NetworkAddr::new("", ip(i))];
            s
        })
        .collect();
    let workloads = (0..n)
        .map(|i| {
            let ns = format!("ns{}", i % NAMESPACES);
            let id = SpiffeId::new("cluster.local", &ns, "default").expect("identity");
            let uid = WorkloadUid::new(format!("Kubernetes//Pod/{ns}/pod{i}")).expect("uid");
            let mut w = Workload::new(uid, format!("pod{i}"), id);
            w.addresses = vec![ip(n + i)];
            w.node = "node1".into();
            w
        })
        .collect();
    let state = ProxyState::new();
    state.replace_local(workloads, services, Vec::new());
    state
}

fn bench(c: &mut Criterion) {
    let cfg = NameConfig {
        cluster_domain: "cluster.local",
        prefered_service_namespace: None,
        ipv6_enabled: true,
    };
    // (label, query): the client is pod5 in ns5, so `svc5` expands through its search list.
    let queries = [
        ("fqdn hit", "svc5.ns5.svc.cluster.local"),
        ("short name via search list", "svc5"),
        // Not a mesh name: every candidate and wildcard parent is tried, then forwarded.
        (
            "miss, deep name",
            "a.b.c.d.example.org.ns5.svc.cluster.local",
        ),
    ];
    let mut group = c.benchmark_group("dns query");
    for n in [100, 1_000, 10_000] {
        let state = mesh(n);
        for (label, query) in queries {
            group.bench_with_input(BenchmarkId::new(label, n), &query, |b, query| {
                b.iter(|| {
                    // What the server does per query: the client's record, then the name.
                    let client = state
                        .find_local_workload("pod5", "ns5", "default", Some("node1"))
                        .expect("client workload");
                    black_box(resolve(&state, &cfg, &client, black_box(query), Family::V4))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
