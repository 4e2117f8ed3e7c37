//! Connection pool behaviour (spec §3.4) against in-memory HBONE servers.

// Helpers outside #[test] fns are test code too; unwrapping there is fine.
#![allow(clippy::unwrap_used)]

#[path = "support/harness.rs"]
mod support;

use std::time::Duration;

use ambit_hbone::{ConnectTarget, H2Settings, H2Stream, Pool, PoolConfig, PoolError};
use ambit_testkit::eventually;
use http::HeaderMap;
use support::*;

const KEY: &str = "spiffe://cluster.local/ns/default/sa/server@10.0.0.1:15008";

fn target() -> ConnectTarget {
    "10.0.0.1:8080".parse().unwrap()
}

/// A pool whose connector serves every dial with `server` settings in memory.
fn pool(config: PoolConfig, server: H2Settings) -> (Pool<String>, Dialer) {
    let dialer = Dialer::default();
    let d = dialer.clone();
    let pool = Pool::new(config, move |_key: String| {
        let io = d.dial(server.clone());
        async move { Ok::<_, std::io::Error>(io) }
    });
    (pool, dialer)
}

fn config() -> PoolConfig {
    PoolConfig {
        h2: settings(),
        ..PoolConfig::default()
    }
}

async fn open(pool: &Pool<String>) -> H2Stream {
    let (_, s) = pool
        .connect(KEY.to_string(), &target(), HeaderMap::new())
        .await
        .unwrap();
    s
}

#[tokio::test]
async fn concurrent_first_use_dials_once() {
    // A gated connector: every caller reaches the pool before the first dial completes.
    let (gate_tx, gate_rx) = tokio::sync::watch::channel(false);
    let dialer = Dialer::default();
    let d = dialer.clone();
    let pool = Pool::new(config(), move |_key: String| {
        let io = d.dial(settings());
        let mut gate = gate_rx.clone();
        async move {
            gate.wait_for(|open| *open).await.unwrap();
            Ok::<_, std::io::Error>(io)
        }
    });
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { round_trip(&mut open(&pool).await, b"x").await })
        })
        .collect();
    // Current-thread runtime: yielding lets every task run up to its wait point.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    gate_tx.send(true).unwrap();
    for t in tasks {
        assert_eq!(t.await.unwrap(), b"x");
    }
    assert_eq!(dialer.count(), 1);
    assert_eq!(pool.connection_count(&KEY.to_string()), 1);
}

#[tokio::test]
async fn dial_failure_is_shared_with_waiters() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    let pool: Pool<String> = Pool::new(config(), move |_key: String| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async {
            tokio::task::yield_now().await;
            Err::<tokio::io::DuplexStream, _>(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            ))
        }
    });
    let target = target();
    let results = futures_util::future::join_all(
        (0..5).map(|_| pool.connect(KEY.to_string(), &target, HeaderMap::new())),
    )
    .await;
    for r in results {
        assert!(matches!(r, Err(PoolError::Dial(_))), "{r:?}");
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn stream_cap_and_spread_decide_connection_count() {
    struct Case {
        name: &'static str,
        max_streams: usize,
        spread: usize,
        server_max_concurrent: u32,
        streams: usize,
        want_conns: usize,
    }
    let cases = [
        Case {
            name: "cap 2, 3 streams",
            max_streams: 2,
            spread: 1,
            server_max_concurrent: 200,
            streams: 3,
            want_conns: 2,
        },
        Case {
            name: "cap 2, 4 streams",
            max_streams: 2,
            spread: 1,
            server_max_concurrent: 200,
            streams: 4,
            want_conns: 2,
        },
        Case {
            name: "cap 1",
            max_streams: 1,
            spread: 1,
            server_max_concurrent: 200,
            streams: 3,
            want_conns: 3,
        },
        Case {
            name: "multiplexed",
            max_streams: 100,
            spread: 1,
            server_max_concurrent: 200,
            streams: 5,
            want_conns: 1,
        },
        Case {
            name: "peer limit wins",
            max_streams: 100,
            spread: 1,
            server_max_concurrent: 2,
            streams: 5,
            want_conns: 3,
        },
        Case {
            name: "spread 2",
            max_streams: 100,
            spread: 2,
            server_max_concurrent: 200,
            streams: 5,
            want_conns: 2,
        },
    ];
    for case in cases {
        let config = PoolConfig {
            max_streams_per_connection: case.max_streams,
            spread_connections_per_key: case.spread,
            ..config()
        };
        let server = H2Settings {
            server_max_concurrent_streams: case.server_max_concurrent,
            ..settings()
        };
        let (pool, dialer) = pool(config, server);
        let mut held = Vec::new();
        for _ in 0..case.streams {
            held.push(open(&pool).await);
        }
        assert_eq!(dialer.count(), case.want_conns, "{}: dials", case.name);
        assert_eq!(
            pool.connection_count(&KEY.to_string()),
            case.want_conns,
            "{}",
            case.name
        );
        for mut s in held {
            assert_eq!(round_trip(&mut s, b"ok").await, b"ok", "{}", case.name);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn idle_connections_are_released() {
    let config = PoolConfig {
        unused_release_timeout: Duration::from_millis(50),
        ..config()
    };
    let (pool, dialer) = pool(config, settings());
    let key = KEY.to_string();
    let mut s = open(&pool).await;
    assert_eq!(round_trip(&mut s, b"a").await, b"a");
    drop(s);
    eventually("idle release", Duration::from_secs(10), || {
        pool.connection_count(&key) == 0
    })
    .await;
    // The released connection is really closed: its server saw the client go away.
    let server = dialer.servers.lock().unwrap().remove(0);
    let end = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap();
    assert_eq!(end.unwrap().unwrap(), ambit_hbone::ConnectionEnd::Closed);

    let mut s = open(&pool).await;
    assert_eq!(round_trip(&mut s, b"b").await, b"b");
    assert_eq!(dialer.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn busy_connections_are_not_released() {
    let config = PoolConfig {
        unused_release_timeout: Duration::from_secs(60),
        ..config()
    };
    let (pool, dialer) = pool(config, settings());
    let mut held = open(&pool).await;
    // Ten release periods of virtual time pass while a stream is open.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(pool.connection_count(&KEY.to_string()), 1);
    assert_eq!(round_trip(&mut held, b"alive").await, b"alive");
    assert_eq!(dialer.count(), 1);
}

#[tokio::test]
async fn dead_connections_are_replaced() {
    let (pool, dialer) = pool(config(), settings());
    let mut s = open(&pool).await;
    assert_eq!(round_trip(&mut s, b"1").await, b"1");
    drop(s);
    // Kill the server side of the pooled connection.
    dialer.servers.lock().unwrap()[0].abort();
    let mut s = open(&pool).await;
    assert_eq!(round_trip(&mut s, b"2").await, b"2");
    assert_eq!(dialer.count(), 2);
    assert_eq!(pool.connection_count(&KEY.to_string()), 1);
}

#[tokio::test]
async fn status_errors_do_not_poison_the_connection() {
    let (pool, dialer) = pool(config(), settings());
    let refused: ConnectTarget = "10.0.0.1:401".parse().unwrap();
    let err = pool
        .connect(KEY.to_string(), &refused, HeaderMap::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PoolError::Connect(ambit_hbone::ClientError::Status { status, .. }) if *status == 401),
        "{err:?}"
    );
    let mut s = open(&pool).await;
    assert_eq!(round_trip(&mut s, b"ok").await, b"ok");
    assert_eq!(dialer.count(), 1);
}
