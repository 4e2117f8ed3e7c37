//! Micro-benchmark of the data-path copy (`ambit_hbone::copy_bidirectional`, the loop every
//! proxied connection runs on both ends): an in-memory "application" socket on each side, a
//! copy into and out of an HTTP/2 CONNECT tunnel on each side, the tunnel over an in-memory
//! pipe (no TLS, no kernel sockets: the copy and HTTP/2 framing alone). One thread, so the
//! figures are the CPU cost of both proxy ends.
//!
//! - `bulk, one way`: 8 MiB written by the client application in 64 KiB writes and read to
//!   the end by the server application (bytes/s).
//! - `1 KiB echo`: one 1 KiB request and its echo through an established tunnel (the chatty
//!   case; time per round trip).
//!
//! Run with `cargo bench -p ambit-bench --bench copy` (results in BENCHMARKS.md).

#[path = "support/mod.rs"]
mod support;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use support::Serve;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

const BULK: usize = 8 * 1024 * 1024;
const WRITE: usize = 64 * 1024;
const PIPE: usize = 256 * 1024;

/// A client-side proxy: the application's end of an in-memory socket whose other end is
/// copied into a new CONNECT tunnel on `client`.
async fn proxied_socket(client: &ambit_hbone::HboneClient) -> DuplexStream {
    let (_, mut tunnel) = client
        .send_connect(&support::target(), http::HeaderMap::new())
        .await
        .expect("CONNECT");
    let (app, mut proxy_end) = tokio::io::duplex(PIPE);
    tokio::spawn(async move {
        let _ = ambit_hbone::copy_bidirectional(&mut proxy_end, &mut tunnel).await;
    });
    app
}

/// An HBONE client whose connection is served in process over an in-memory pipe.
async fn in_memory(serve: Serve) -> ambit_hbone::HboneClient {
    let (client_io, server_io) = tokio::io::duplex(PIPE);
    support::spawn_server(server_io, serve);
    support::client_over(client_io).await
}

fn bench(c: &mut Criterion) {
    let rt = support::runtime();
    let mut group = c.benchmark_group("HBONE copy (both proxy ends, in memory)");

    let sink = rt.block_on(in_memory(Serve::CopyToSink));
    let chunk = vec![0xa5u8; WRITE];
    group.throughput(Throughput::Bytes(BULK as u64));
    group.bench_function("bulk, one way", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut app = proxied_socket(&sink).await;
                for _ in 0..BULK / WRITE {
                    app.write_all(&chunk).await.expect("write");
                }
                app.shutdown().await.expect("shutdown");
                // The server side ends its half once the sink has read everything.
                let mut rest = Vec::new();
                app.read_to_end(&mut rest).await.expect("close");
            });
        });
    });

    let echo = rt.block_on(in_memory(Serve::CopyToEcho));
    let mut app = rt.block_on(proxied_socket(&echo));
    let mut msg = [0x5au8; 1024];
    group.throughput(Throughput::Bytes(msg.len() as u64));
    group.bench_function("1 KiB echo", |b| {
        b.iter(|| {
            rt.block_on(async {
                app.write_all(&msg).await.expect("request");
                app.read_exact(&mut msg).await.expect("echo");
            });
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
