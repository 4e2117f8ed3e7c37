//! `copy_bidirectional` across the read-size tiers, and what an idle copy holds.

// Helpers outside #[test] fns are test code too; unwrapping there is fine.
#![allow(clippy::unwrap_used)]

#[path = "support/harness.rs"]
mod support;

use std::time::Duration;

use ambit_hbone::copy::{arena_free_bytes, arena_refills, copy_streams};
use ambit_hbone::{
    ConnectTarget, H2Stream, HboneClient, Responder, Transferred, copy_bidirectional,
};
use http::HeaderMap;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

fn target() -> ConnectTarget {
    "10.0.0.1:80".parse().unwrap()
}

/// A server whose handler copies each tunnel to an echoing "application" with
/// `copy_bidirectional` (what the inbound proxy does) and reports what it moved.
async fn echo_client(moved: mpsc::UnboundedSender<Transferred>) -> HboneClient {
    let mut served = serve(settings(), move |_req, responder: Responder| {
        let moved = moved.clone();
        async move {
            let mut tunnel = responder.accept(HeaderMap::new()).unwrap();
            let (mut upstream, app) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(app);
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
            });
            let t = copy_bidirectional(&mut upstream, &mut tunnel)
                .await
                .unwrap();
            let _ = moved.send(t);
        }
    });
    let io = std::mem::replace(&mut served.io, tokio::io::duplex(1).0);
    let (client, driver) = HboneClient::handshake(io, &settings()).await.unwrap();
    tokio::spawn(driver);
    // Keep the server running for the whole test.
    tokio::spawn(async move {
        let _served = served;
        std::future::pending::<()>().await
    });
    client
}

/// The client side of the proxy: an app socket copied into a fresh tunnel. Returns the app's
/// end and the copy task.
async fn proxied(
    client: &HboneClient,
) -> (
    DuplexStream,
    tokio::task::JoinHandle<Result<Transferred, ambit_hbone::CopyError>>,
) {
    let (_, mut tunnel): (_, H2Stream) = client
        .send_connect(&target(), HeaderMap::new())
        .await
        .unwrap();
    let (app, mut socket) = tokio::io::duplex(64 * 1024);
    let copy = tokio::spawn(async move { copy_bidirectional(&mut socket, &mut tunnel).await });
    (app, copy)
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_size_crosses_intact_with_half_close_and_counts() {
    // Around each block size and growth threshold (4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB),
    // and well into the bulk tier.
    const SIZES: &[usize] = &[
        0,
        1,
        2,
        1023,
        1024,
        4095,
        4096,
        4097,
        16 * 1024 - 1,
        16 * 1024 + 1,
        64 * 1024 - 1,
        64 * 1024,
        64 * 1024 + 1,
        256 * 1024 + 3,
        (1 << 20) - 1,
        1 << 20,
        (1 << 20) + 1,
        3 * (1 << 20) + 12_345,
    ];
    let (moved_tx, mut moved_rx) = mpsc::unbounded_channel();
    let client = echo_client(moved_tx).await;
    for (i, &size) in SIZES.iter().enumerate() {
        let (app, copy) = proxied(&client).await;
        let (mut r, mut w) = tokio::io::split(app);
        let data = pattern(size, i);
        let sent = data.clone();
        // Written in uneven pieces so reads see every alignment.
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(7_919) {
                w.write_all(piece).await.unwrap();
            }
            w.shutdown().await.unwrap(); // FIN → END_STREAM → app EOF → echo's FIN back
        });
        let mut got = Vec::with_capacity(size);
        let read = tokio::time::timeout(Duration::from_secs(20), r.read_to_end(&mut got)).await;
        read.expect("echo ended").unwrap();
        writer.await.unwrap();
        assert!(got == data, "size {size}: echoed bytes differ");
        let client_side = copy.await.unwrap().unwrap();
        let server_side = moved_rx.recv().await.unwrap();
        let n = size as u64;
        assert_eq!(
            (client_side.to_tunnel, client_side.from_tunnel),
            (n, n),
            "size {size}: client-side counters"
        );
        assert_eq!(
            (server_side.to_tunnel, server_side.from_tunnel),
            (n, n),
            "size {size}: server-side counters"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn idle_copies_share_one_read_block_per_thread() {
    // Everything runs on this thread, so every copy (client and server side) reads
    // through this thread's arenas.
    const CONNS: usize = 150;
    let (moved_tx, _moved_rx) = mpsc::unbounded_channel();
    let client = echo_client(moved_tx).await;
    let before = arena_refills();
    let mut open = Vec::new();
    for i in 0..CONNS {
        let (mut app, copy) = proxied(&client).await;
        app.write_all(&[i as u8]).await.unwrap();
        let mut b = [0u8; 1];
        app.read_exact(&mut b).await.unwrap();
        assert_eq!(b[0], i as u8);
        open.push((app, copy));
    }
    // 300 one-byte reads (both proxy sides of 150 connections) on one thread: one 4 KiB
    // block, where a buffer per connection would have cost 300 of them.
    assert_eq!(arena_refills() - before, 1);
    assert!(arena_free_bytes() <= 4096, "{}", arena_free_bytes());
    // The connections are idle, not finished: each still echoes.
    for (i, (app, copy)) in open.iter_mut().enumerate() {
        assert!(!copy.is_finished());
        app.write_all(&[i as u8 ^ 0xff]).await.unwrap();
        let mut b = [0u8; 1];
        app.read_exact(&mut b).await.unwrap();
        assert_eq!(b[0], i as u8 ^ 0xff);
    }
    for (app, copy) in open {
        drop(app);
        let t = copy.await.unwrap().unwrap();
        assert_eq!((t.to_tunnel, t.from_tunnel), (2, 2));
    }
}

/// A running [`copy_streams`]: bytes written each way, or which stream failed.
type PlainCopy = tokio::task::JoinHandle<Result<(u64, u64), ambit_hbone::copy::StreamsCopyError>>;

/// client app ↔ copy_streams ↔ echoing upstream app; returns the client's end and the copy.
fn plain_proxied() -> (DuplexStream, PlainCopy) {
    let (client, mut a) = tokio::io::duplex(64 * 1024);
    let (mut b, upstream) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (mut r, mut w) = tokio::io::split(upstream);
        tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let copy = tokio::spawn(async move { copy_streams(&mut a, &mut b).await });
    (client, copy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_copy_keeps_every_byte_with_half_close_and_counts() {
    for (i, size) in [0usize, 1, 4095, 4097, 65_537, (1 << 20) + 1, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let (client, copy) = plain_proxied();
        let (mut r, mut w) = tokio::io::split(client);
        let data = pattern(size, i);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(10_007) {
                w.write_all(piece).await.unwrap();
            }
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::with_capacity(size);
        let read = tokio::time::timeout(Duration::from_secs(20), r.read_to_end(&mut got)).await;
        read.expect("echo ended").unwrap();
        writer.await.unwrap();
        assert!(got == data, "size {size}: echoed bytes differ");
        let n = size as u64;
        assert_eq!(copy.await.unwrap().unwrap(), (n, n), "size {size}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn idle_plain_copies_share_one_read_block_per_thread() {
    const CONNS: usize = 100;
    let before = arena_refills();
    let mut open = Vec::new();
    for i in 0..CONNS {
        let (mut client, copy) = plain_proxied();
        client.write_all(&[i as u8]).await.unwrap();
        let mut b = [0u8; 1];
        client.read_exact(&mut b).await.unwrap();
        assert_eq!(b[0], i as u8);
        open.push((client, copy));
    }
    // 200 one-byte reads (both directions of 100 connections): one 4 KiB block.
    assert_eq!(arena_refills() - before, 1);
    assert!(arena_free_bytes() <= 4096, "{}", arena_free_bytes());
    for (client, copy) in open {
        assert!(!copy.is_finished());
        drop(client);
        assert_eq!(copy.await.unwrap().unwrap(), (1, 1));
    }
}

/// A stream whose reads or writes fail with `kind` (the other half behaves as an open,
/// quiet stream: reads pend, writes are accepted).
struct Failing {
    read_fails: bool,
    write_fails: bool,
}

impl tokio::io::AsyncRead for Failing {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        _buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.read_fails {
            std::task::Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()))
        } else {
            std::task::Poll::Pending
        }
    }
}

impl tokio::io::AsyncWrite for Failing {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.write_fails {
            std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()))
        } else {
            std::task::Poll::Ready(Ok(buf.len()))
        }
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// A failed plain copy names the stream that failed, whichever way the bytes were going.
#[tokio::test(flavor = "current_thread")]
async fn plain_copy_error_names_the_failing_stream() {
    use ambit_hbone::copy::StreamEnd;
    // (which stream is the failing one, fails on read?, expected end, expected kind)
    let cases = [
        ("first fails reading", true, StreamEnd::First, true),
        ("first fails writing", false, StreamEnd::First, true),
        ("second fails reading", true, StreamEnd::Second, false),
        ("second fails writing", false, StreamEnd::Second, false),
    ];
    for (what, on_read, want, failing_is_first) in cases {
        let mut failing = Failing {
            read_fails: on_read,
            write_fails: !on_read,
        };
        // The healthy side has bytes to send, so a failing writer is written to.
        let (mut healthy, mut feed) = tokio::io::duplex(1024);
        feed.write_all(b"hello").await.unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), async {
            if failing_is_first {
                copy_streams(&mut failing, &mut healthy).await
            } else {
                copy_streams(&mut healthy, &mut failing).await
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}: the copy did not end"));
        let err = result.expect_err(what);
        assert_eq!(err.end, want, "{what}: {err}");
        let kind = if on_read {
            std::io::ErrorKind::ConnectionReset
        } else {
            std::io::ErrorKind::BrokenPipe
        };
        assert_eq!(err.source.kind(), kind, "{what}");
    }
}
