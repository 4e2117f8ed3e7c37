//! Micro-benchmark of HBONE stream setup, client and server in one process on loopback
//! (one thread, so a figure is the CPU cost of both ends):
//!
//! - `CONNECT on a pooled connection`: a CONNECT request and its 200 over an established
//!   mTLS + HTTP/2 connection, then END_STREAM both ways: what every new proxied TCP
//!   connection costs when the pool has a connection to the peer.
//! - `new connection + CONNECT`: TCP connect, TLS 1.3 handshake with client certificates
//!   (SPIFFE verification both ways), HTTP/2 handshake, then the same CONNECT: the pool-miss
//!   cost.
//!
//! Run with `cargo bench -p ambit-bench --bench hbone_stream` (results in BENCHMARKS.md).

#[path = "support/mod.rs"]
mod support;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use support::Serve;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One tunnel: CONNECT, 200, END_STREAM from us, END_STREAM from the server.
async fn one_stream(client: &ambit_hbone::HboneClient, target: &ambit_hbone::ConnectTarget) {
    let (resp, mut stream) = client
        .send_connect(target, http::HeaderMap::new())
        .await
        .expect("CONNECT");
    black_box(resp.status);
    stream.shutdown().await.expect("END_STREAM");
    let mut rest = Vec::new();
    stream
        .read_to_end(&mut rest)
        .await
        .expect("server END_STREAM");
}

fn bench(c: &mut Criterion) {
    let rt = support::runtime();
    let tls = support::tls();
    let target = support::target();
    let addr = rt.block_on(support::tls_server(&tls, Serve::Drain));
    let pooled = rt.block_on(support::tls_client(&tls, addr));

    let mut group = c.benchmark_group("HBONE stream setup (mTLS + h2, loopback)");
    group.bench_function("CONNECT on a pooled connection", |b| {
        b.iter(|| rt.block_on(one_stream(&pooled, &target)));
    });
    group.bench_function("new connection + CONNECT", |b| {
        b.iter(|| {
            rt.block_on(async {
                let client = support::tls_client(&tls, addr).await;
                one_stream(&client, &target).await;
            });
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
