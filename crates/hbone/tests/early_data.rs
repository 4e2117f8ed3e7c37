//! A client's first flight sent with the CONNECT request ([`EarlyData`]): it reaches the
//! server before the server answers, within its bound, exactly once (also across a retry on
//! a fresh pooled connection), and refused CONNECTs that carried some leave the connection
//! usable.

// Helpers outside #[test] fns are test code too; unwrapping there is fine.
#![allow(clippy::unwrap_used)]

#[path = "support/harness.rs"]
mod support;

use std::time::Duration;

use ambit_hbone::{ClientError, EarlyData, H2Settings, HboneClient, Pool, PoolConfig, PoolError};
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(10);

type Opened = Result<(ambit_hbone::ConnectResponse, ambit_hbone::H2Stream), ClientError>;

/// One CONNECT to `authority` carrying `early`, within [`DEADLINE`] (`None`: it stalled).
async fn connect_early(
    client: &HboneClient,
    authority: &str,
    early: &mut EarlyData<'_, &[u8]>,
) -> Option<Opened> {
    let target = authority.parse().unwrap();
    tokio::time::timeout(
        DEADLINE,
        client.send_connect_early(&target, HeaderMap::new(), early),
    )
    .await
    .ok()
}

/// A raw h2 server that, for each CONNECT, reads `before` bytes of the request body
/// *before* it answers 200 (it would wait forever for a client that holds them back), sends
/// them back on the response's stream, then echoes the rest until the client's END_STREAM.
async fn raw_server(io: tokio::io::DuplexStream, before: usize) {
    let mut conn = h2::server::handshake(io).await.unwrap();
    while let Some(req) = conn.accept().await {
        let (req, mut respond) = req.unwrap();
        tokio::spawn(async move {
            let mut body = req.into_body();
            let mut first = Vec::new();
            while first.len() < before {
                let chunk = body.data().await.unwrap().unwrap();
                let _ = body.flow_control().release_capacity(chunk.len());
                first.extend_from_slice(&chunk);
            }
            let resp = Response::builder().status(200).body(()).unwrap();
            let mut send = respond.send_response(resp, false).unwrap();
            send.send_data(Bytes::from(first), false).unwrap();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                let _ = body.flow_control().release_capacity(chunk.len());
                send.send_data(chunk, false).unwrap();
            }
            send.send_data(Bytes::new(), true).unwrap();
        });
    }
}

#[tokio::test]
async fn the_first_flight_reaches_the_server_before_its_response_within_the_bound() {
    // (what the client has to say, the bound, bytes the server must see before answering)
    let cases: &[(usize, usize, usize)] = &[
        (18, 16 * 1024, 18),
        (5 * 1024, 16 * 1024, 5 * 1024),
        (3 * 16 * 1024, 16 * 1024, 16 * 1024),
        (100, 0, 0),
    ];
    for &(len, limit, before) in cases {
        let msg: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let (client_io, server_io) = tokio::io::duplex(BUF);
        tokio::spawn(raw_server(server_io, before));
        let (client, driver) = HboneClient::handshake(client_io, &settings())
            .await
            .unwrap();
        tokio::spawn(driver);
        let mut source: &[u8] = &msg;
        let mut early = EarlyData::new(&mut source, limit);
        let (resp, mut stream) = connect_early(&client, "10.0.0.1:80", &mut early)
            .await
            .unwrap_or_else(|| {
                panic!("{len}/{limit}: no response: the server never got {before} bytes")
            })
            .unwrap();
        assert_eq!(resp.status, StatusCode::OK);
        assert_eq!(early.bytes(), before as u64, "{len}/{limit}");
        // The rest goes through the tunnel as usual; nothing is lost or sent twice.
        drop(early);
        stream.write_all(source).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut back = Vec::new();
        tokio::time::timeout(DEADLINE, stream.read_to_end(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg, "{len}/{limit}");
    }
}

#[tokio::test]
async fn refused_connects_that_carried_early_data_leave_the_connection_usable() {
    // A 1 MiB connection window: if the server kept the refused streams' bytes charged to
    // it, 40 refusals of 64 KiB each would close it and the last CONNECT would stall.
    let small = H2Settings {
        connection_window: 1024 * 1024,
        ..settings()
    };
    let (client, _served) = {
        let mut served = serve(small.clone(), status_handler);
        let io = std::mem::replace(&mut served.io, tokio::io::duplex(1).0);
        let (client, driver) = HboneClient::handshake(io, &small).await.unwrap();
        tokio::spawn(driver);
        (client, served)
    };
    let msg = vec![7u8; 64 * 1024];
    for i in 0..40 {
        let mut source: &[u8] = &msg;
        let mut early = EarlyData::new(&mut source, 64 * 1024);
        let err = connect_early(&client, "10.0.0.1:401", &mut early)
            .await
            .unwrap_or_else(|| panic!("refusal {i} stalled"))
            .unwrap_err();
        assert!(
            matches!(&err, ClientError::Status { status, .. } if *status == 401),
            "{i}: {err:?}"
        );
    }
    let mut source: &[u8] = b"after";
    let mut early = EarlyData::new(&mut source, 64 * 1024);
    let (_, mut stream) = connect_early(&client, "10.0.0.1:80", &mut early)
        .await
        .expect("the connection's window leaked: the CONNECT after the refusals stalled")
        .unwrap();
    assert_eq!(early.bytes(), 5);
    drop(early);
    let back = tokio::time::timeout(DEADLINE, round_trip(&mut stream, b""))
        .await
        .unwrap();
    assert_eq!(back, b"after");
}

#[tokio::test]
async fn early_data_arrives_once_on_a_reused_or_replaced_pooled_connection() {
    // (kill the pooled connection's server first?)
    for kill in [false, true] {
        let dialer = Dialer::default();
        let d = dialer.clone();
        let pool = Pool::new(
            PoolConfig {
                h2: settings(),
                ..PoolConfig::default()
            },
            move |_key: String| {
                let io = d.dial(settings());
                async move { Ok::<_, std::io::Error>(io) }
            },
        );
        let key = "peer".to_string();
        let target = "10.0.0.1:80".parse().unwrap();
        let (_, mut s) = pool
            .connect(key.clone(), &target, HeaderMap::new())
            .await
            .unwrap();
        assert_eq!(round_trip(&mut s, b"warm").await, b"warm");
        drop(s);
        if kill {
            dialer.servers.lock().unwrap()[0].abort();
        }
        let mut source: &[u8] = b"first flight";
        let mut early = EarlyData::new(&mut source, 16 * 1024);
        let r: Result<_, PoolError> = tokio::time::timeout(
            DEADLINE,
            pool.connect_early(key.clone(), &target, HeaderMap::new(), &mut early),
        )
        .await
        .unwrap();
        let (_, mut s) = r.unwrap();
        assert_eq!(early.bytes(), 12, "kill={kill}");
        drop(early);
        let back = tokio::time::timeout(DEADLINE, round_trip(&mut s, b" then more"))
            .await
            .unwrap();
        assert_eq!(back, b"first flight then more", "kill={kill}");
        assert_eq!(dialer.count(), if kill { 2 } else { 1 }, "kill={kill}");
    }
}
