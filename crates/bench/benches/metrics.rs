//! Micro-benchmark of what one proxied connection costs the metrics registry: open its
//! guard (`Metrics::connection_opened`, a full Istio label set of 25 labels), count bytes
//! both ways, drop it (closed, sockets open, duration). The registry already holds 1, 100 or
//! 1,000 other label sets, as a node with that many distinct peers would. Run with
//! `cargo bench -p ambit-bench --bench metrics` (results in BENCHMARKS.md).

use std::hint::black_box;

use ambit_ztunnel::telemetry::metrics::{Metrics, Reporter, TrafficLabels};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

/// A label set with values of realistic lengths; `peer` makes it distinct.
fn labels(peer: usize) -> TrafficLabels {
    let mut l = TrafficLabels::new(Reporter::Destination);
    l.source_workload = format!("client-deployment-{peer}").into();
    l.source_canonical_service = format!("client-{peer}").into();
    l.source_canonical_revision = "v1".into();
    l.source_workload_namespace = "default".into();
    l.source_principal = format!("spiffe://cluster.local/ns/default/sa/client-{peer}").into();
    l.source_app = format!("client-{peer}").into();
    l.source_version = "v1".into();
    l.source_cluster = "Kubernetes".into();
    l.destination_service = "server.default.svc.cluster.local".into();
    l.destination_service_namespace = "default".into();
    l.destination_service_name = "server".into();
    l.destination_workload = "server-deployment".into();
    l.destination_canonical_service = "server".into();
    l.destination_canonical_revision = "v1".into();
    l.destination_workload_namespace = "default".into();
    l.destination_principal = "spiffe://cluster.local/ns/default/sa/server".into();
    l.destination_app = "server".into();
    l.destination_version = "v1".into();
    l.destination_cluster = "Kubernetes".into();
    l
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("one connection's metrics: open, 2 byte counts, close");
    for peers in [1, 100, 1_000] {
        let metrics = Metrics::new("bench");
        for p in 0..peers {
            drop(metrics.connection_opened(labels(p)));
        }
        let peer = labels(peers / 2);
        group.bench_with_input(BenchmarkId::new("label sets", peers), &peers, |b, _| {
            b.iter(|| {
                let guard = metrics.connection_opened(black_box(peer.clone()));
                guard.add_received(black_box(1024));
                guard.add_sent(black_box(1024));
                drop(guard)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
