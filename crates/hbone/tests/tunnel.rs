//! Client ↔ server behaviour over in-memory connections.

// Helpers outside #[test] fns are test code too; unwrapping there is fine.
#![allow(clippy::unwrap_used)]

#[path = "support/harness.rs"]
mod support;

use std::time::Duration;

use ambit_hbone::{
    ClientError, ConnectTarget, ConnectionEnd, H2Stream, HboneClient, copy_bidirectional,
};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

fn target(s: &str) -> ConnectTarget {
    s.parse().unwrap()
}

/// Connects an [`HboneClient`] to a served connection (its io is taken over).
async fn client_for(mut served: Served) -> (HboneClient, Served) {
    let io = std::mem::replace(&mut served.io, tokio::io::duplex(1).0);
    let (client, driver) = HboneClient::handshake(io, &settings()).await.unwrap();
    tokio::spawn(driver);
    (client, served)
}

#[tokio::test]
async fn connect_round_trip_carries_headers_both_ways() {
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let served = serve(settings(), move |req, responder| {
        let seen_tx = seen_tx.clone();
        async move {
            seen_tx
                .send((req.target.clone(), req.headers.clone()))
                .unwrap();
            status_handler(req, responder).await
        }
    });
    let (client, _served) = client_for(served).await;
    let mut headers = HeaderMap::new();
    headers.insert(
        "baggage",
        HeaderValue::from_static("k8s.namespace.name=src"),
    );
    headers.insert(
        "forwarded",
        HeaderValue::from_static("for=\"10.0.0.9:4000\""),
    );
    let (resp, mut stream) = client
        .send_connect(&target("10.0.0.1:8080"), headers)
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(resp.headers["baggage"], RESPONSE_BAGGAGE);
    assert_eq!(
        round_trip(&mut stream, b"hello hbone").await,
        b"hello hbone"
    );

    let (seen_target, seen_headers) = seen_rx.recv().await.unwrap();
    assert_eq!(seen_target, target("10.0.0.1:8080"));
    assert_eq!(seen_headers["baggage"], "k8s.namespace.name=src");
    assert_eq!(seen_headers["forwarded"], "for=\"10.0.0.9:4000\"");
}

#[tokio::test]
async fn handler_statuses_reach_the_client_as_typed_errors() {
    let (client, _served) = client_for(serve(settings(), status_handler)).await;
    let cases = [
        ("10.0.0.1:400", StatusCode::BAD_REQUEST),
        ("10.0.0.1:401", StatusCode::UNAUTHORIZED),
        (
            "svc.ns.svc.cluster.local:503",
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        // Port 1: the handler drops its responder unanswered.
        ("10.0.0.1:1", StatusCode::SERVICE_UNAVAILABLE),
    ];
    for (authority, want) in cases {
        match client
            .send_connect(&target(authority), HeaderMap::new())
            .await
        {
            Err(ClientError::Status { status, .. }) => assert_eq!(status, want, "{authority}"),
            other => panic!("{authority}: expected status {want}, got {other:?}"),
        }
    }
    // The connection survives refused streams.
    let (_, mut stream) = client
        .send_connect(&target("[::1]:80"), HeaderMap::new())
        .await
        .unwrap();
    assert_eq!(round_trip(&mut stream, b"still up").await, b"still up");
}

/// A raw h2 client, so requests our own client would never send can be tried.
async fn raw_client(
    served: &mut Served,
    builder: h2::client::Builder,
) -> h2::client::SendRequest<Bytes> {
    let io = std::mem::replace(&mut served.io, tokio::io::duplex(1).0);
    let (send, conn) = builder.handshake(io).await.unwrap();
    tokio::spawn(conn);
    send
}

async fn raw_status(
    send: &h2::client::SendRequest<Bytes>,
    req: Request<()>,
) -> Result<StatusCode, h2::Error> {
    let mut send = send.clone().ready().await?;
    let (resp, _body) = send.send_request(req, true)?;
    Ok(resp.await?.status())
}

#[tokio::test]
async fn invalid_requests_get_400_without_reaching_the_handler() {
    let mut served = serve(settings(), |_req, _responder| async {
        panic!("handler must not see invalid requests")
    });
    let send = raw_client(&mut served, h2::client::Builder::new()).await;
    let cases = [
        (Method::GET, "http://10.0.0.1:8080/"),
        (Method::POST, "http://10.0.0.1:8080/x"),
        (Method::CONNECT, "bad_host:80"),
        (Method::CONNECT, "10.0.0.1:0"),
        (Method::CONNECT, "999.1.1.1:80"),
    ];
    for (method, uri) in cases {
        let req = Request::builder()
            .method(method.clone())
            .uri(uri)
            .body(())
            .unwrap();
        assert_eq!(
            raw_status(&send, req).await.unwrap(),
            StatusCode::BAD_REQUEST,
            "{method} {uri}"
        );
    }
}

#[tokio::test]
async fn oversized_headers_are_refused_and_connection_survives() {
    let mut served = serve(settings(), status_handler);
    let mut builder = h2::client::Builder::new();
    builder.max_header_list_size(1 << 20);
    let send = raw_client(&mut served, builder).await;
    let connect = || {
        Request::builder()
            .method(Method::CONNECT)
            .uri("10.0.0.1:80")
    };

    // A first small request makes sure the server's SETTINGS have been applied.
    let ok = raw_status(&send, connect().body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(ok, StatusCode::OK);

    let big = HeaderValue::from_str(&"x".repeat(80 * 1024)).unwrap();
    let req = connect().header("x-big", big).body(()).unwrap();
    match raw_status(&send, req).await {
        Ok(status) => assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        Err(e) => assert!(e.is_reset() || e.is_library() || e.is_remote(), "{e:?}"),
    }
    let again = raw_status(&send, connect().body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(again, StatusCode::OK);
    assert!(!served.server.is_finished(), "server must keep serving");
}

#[tokio::test]
async fn server_advertises_settings() {
    let mut served = serve(settings(), status_handler);
    let mut builder = h2::client::Builder::new();
    // Our send buffer must not be what limits the observed capacity.
    builder.max_send_buffer_size(64 << 20);
    let send = raw_client(&mut served, builder).await;
    let mut ready = send.clone().ready().await.unwrap();
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri("10.0.0.1:80")
        .body(())
        .unwrap();
    let (resp, mut body) = ready.send_request(req, false).unwrap();
    assert_eq!(resp.await.unwrap().status(), StatusCode::OK);
    assert_eq!(send.current_max_send_streams(), 200);

    // Send capacity is bounded by the server's 4 MiB stream window (its 16 MiB connection
    // window is larger), so asking for 8 MiB yields exactly 4 MiB.
    body.reserve_capacity(8 << 20);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while body.capacity() < 4 << 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "capacity stuck at {}",
            body.capacity()
        );
        std::future::poll_fn(|cx| body.poll_capacity(cx))
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(body.capacity(), 4 << 20);
}

#[tokio::test]
async fn client_advertises_settings() {
    // A raw h2 server: our client's 4 MiB stream window bounds the response capacity.
    let (client_io, server_io) = tokio::io::duplex(BUF);
    let server = tokio::spawn(async move {
        let mut builder = h2::server::Builder::new();
        builder.max_send_buffer_size(64 << 20);
        let mut conn = builder.handshake::<_, Bytes>(server_io).await.unwrap();
        let (req, mut respond) = conn.accept().await.unwrap().unwrap();
        assert_eq!(req.method(), Method::CONNECT);
        assert_eq!(req.uri().authority().unwrap().as_str(), "10.0.0.1:80");
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        send.reserve_capacity(8 << 20);
        tokio::spawn(async move { while conn.accept().await.is_some() {} });
        loop {
            let cap = std::future::poll_fn(|cx| send.poll_capacity(cx))
                .await
                .unwrap()
                .unwrap();
            if cap >= 4 << 20 {
                return cap;
            }
        }
    });
    let (client, driver) = HboneClient::handshake(client_io, &settings())
        .await
        .unwrap();
    tokio::spawn(driver);
    let (_resp, _stream) = client
        .send_connect(&target("10.0.0.1:80"), HeaderMap::new())
        .await
        .unwrap();
    let cap = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cap, 4 << 20);
}

#[tokio::test]
async fn half_close_propagates_in_both_directions() {
    // Who closes first: the client (server answers after EOF) or the server (client
    // still gets to send after seeing EOF).
    for client_first in [true, false] {
        let served = serve(
            settings(),
            move |_req, responder: ambit_hbone::Responder| async move {
                let mut s = responder.accept(HeaderMap::new()).unwrap();
                if client_first {
                    let mut got = Vec::new();
                    s.read_to_end(&mut got).await.unwrap();
                    s.write_all(&[b"after:".as_slice(), &got].concat())
                        .await
                        .unwrap();
                    s.shutdown().await.unwrap();
                } else {
                    s.write_all(b"bye").await.unwrap();
                    s.shutdown().await.unwrap();
                    let mut got = Vec::new();
                    s.read_to_end(&mut got).await.unwrap();
                    assert_eq!(got, b"late");
                }
            },
        );
        let (client, served) = client_for(served).await;
        let (_, mut s) = client
            .send_connect(&target("10.0.0.1:80"), HeaderMap::new())
            .await
            .unwrap();
        if client_first {
            assert_eq!(round_trip(&mut s, b"ping").await, b"after:ping");
        } else {
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"bye");
            s.write_all(b"late").await.unwrap();
            s.shutdown().await.unwrap();
        }
        drop(s);
        drop(client);
        // The server task ends only after its handler's assertions ran.
        let end = tokio::time::timeout(Duration::from_secs(10), served.server).await;
        assert_eq!(end.unwrap().unwrap().unwrap(), ConnectionEnd::Closed);
    }
}

#[tokio::test]
async fn copy_bidirectional_maps_fin_and_end_stream() {
    // app <-> (duplex "socket") <-> copy <-> H2Stream <-> server handler.
    let served = serve(
        settings(),
        |_req, responder: ambit_hbone::Responder| async move {
            let mut s = responder.accept(HeaderMap::new()).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap(); // app's FIN arrives as END_STREAM
            s.write_all(&got).await.unwrap();
            s.shutdown().await.unwrap();
        },
    );
    let (client, _served) = client_for(served).await;
    let (_, mut tunnel) = client
        .send_connect(&target("10.0.0.1:80"), HeaderMap::new())
        .await
        .unwrap();
    let (mut app, mut socket) = tokio::io::duplex(BUF);
    let copy = tokio::spawn(async move { copy_bidirectional(&mut socket, &mut tunnel).await });
    app.write_all(b"fin me").await.unwrap();
    app.shutdown().await.unwrap();
    let mut got = Vec::new();
    app.read_to_end(&mut got).await.unwrap(); // END_STREAM arrives as FIN (EOF)
    assert_eq!(got, b"fin me");
    let moved = copy.await.unwrap().unwrap();
    assert_eq!((moved.to_tunnel, moved.from_tunnel), (6, 6));
}

/// Deterministic pseudo-random bytes, so 64 MiB can be checked without storing it.
struct Pattern(u64);
impl Pattern {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            *b = self.0 as u8;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfer_keeps_every_byte() {
    const TOTAL: usize = 64 << 20;
    // Server side: tunnel <-> copy_bidirectional <-> echo "upstream".
    let served = serve(
        settings(),
        |_req, responder: ambit_hbone::Responder| async move {
            let mut tunnel = responder.accept(HeaderMap::new()).unwrap();
            let (mut upstream, echo_side) = tokio::io::duplex(BUF);
            tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(echo_side);
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
            });
            let moved = copy_bidirectional(&mut upstream, &mut tunnel)
                .await
                .unwrap();
            assert_eq!(
                (moved.to_tunnel, moved.from_tunnel),
                (TOTAL as u64, TOTAL as u64)
            );
        },
    );
    let (client, _served) = client_for(served).await;
    let (_, stream) = client
        .send_connect(&target("10.0.0.1:80"), HeaderMap::new())
        .await
        .unwrap();
    let (mut r, mut w) = tokio::io::split(stream);
    let writer = tokio::spawn(async move {
        let mut pattern = Pattern(0x9e3779b97f4a7c15);
        let mut chunk = vec![0u8; 100_000]; // deliberately not a power of two
        let mut sent = 0;
        while sent < TOTAL {
            let n = chunk.len().min(TOTAL - sent);
            pattern.fill(&mut chunk[..n]);
            w.write_all(&chunk[..n]).await.unwrap();
            sent += n;
        }
        w.shutdown().await.unwrap();
    });
    let mut expect = Pattern(0x9e3779b97f4a7c15);
    let (mut buf, mut want) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let mut received = 0;
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        expect.fill(&mut want[..n]);
        assert!(
            buf[..n] == want[..n],
            "corruption at byte offset {received}"
        );
        received += n;
    }
    writer.await.unwrap();
    assert_eq!(received, TOTAL);
}

#[tokio::test]
async fn drain_lets_in_flight_streams_finish_and_refuses_new_ones() {
    let served = serve(settings(), status_handler);
    let drain = served.drain.clone();
    let (client, served) = client_for(served).await;
    let (_, mut in_flight) = client
        .send_connect(&target("10.0.0.1:80"), HeaderMap::new())
        .await
        .unwrap();
    in_flight.write_all(b"before").await.unwrap();

    drain.send(true).unwrap();
    // New streams are refused once the GOAWAY lands; poll until that happens.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "new streams still accepted"
        );
        match client
            .send_connect(&target("10.0.0.1:80"), HeaderMap::new())
            .await
        {
            Err(e) => {
                assert!(e.is_connection_level(), "{e:?}");
                break;
            }
            Ok((_, s)) => drop(s),
        }
    }
    assert_eq!(
        round_trip(&mut in_flight, b" and after").await,
        b"before and after"
    );
    drop(in_flight);
    let end = tokio::time::timeout(Duration::from_secs(10), served.server).await;
    assert_eq!(end.unwrap().unwrap().unwrap(), ConnectionEnd::Drained);
}

#[tokio::test]
async fn drain_deadline_cuts_streams_that_do_not_finish() {
    let short = ambit_hbone::H2Settings {
        drain_deadline: Duration::from_millis(50),
        ..settings()
    };
    let served = serve(short, status_handler);
    let drain = served.drain.clone();
    let (client, served) = client_for(served).await;
    let (_, mut held) = client
        .send_connect(&target("10.0.0.1:80"), HeaderMap::new())
        .await
        .unwrap();
    held.write_all(b"x").await.unwrap();
    drain.send(true).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), served.server).await;
    assert_eq!(end.unwrap().unwrap().unwrap(), ConnectionEnd::DrainForced);
    // The held stream sees the connection go away rather than hanging.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), held.read_to_end(&mut rest))
        .await
        .expect("stream must not hang after forced close");
}

#[test]
fn stream_is_send_and_sync_enough_for_spawning() {
    fn assert_send<T: Send + 'static>() {}
    assert_send::<H2Stream>();
}

/// A peer that completes the byte-level preface (when it must) and then never answers:
/// PINGs go unanswered, so keepalive must drop the connection after its timeout.
async fn silent_peer(mut io: tokio::io::DuplexStream, send_client_preface: bool) {
    if send_client_preface {
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS
        io.write_all(&preface).await.unwrap();
    }
    let mut sink = vec![0u8; 64 * 1024];
    while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
}

#[tokio::test(start_paused = true)]
async fn keepalive_drops_connections_whose_peer_stops_answering() {
    let keepalive = ambit_hbone::H2Settings {
        keepalive_interval: Some(Duration::from_secs(10)),
        keepalive_timeout: Duration::from_secs(20),
        ..ambit_hbone::H2Settings::default()
    };
    // Client side: the silent peer plays the server.
    let (client_io, peer) = tokio::io::duplex(BUF);
    tokio::spawn(silent_peer(peer, false));
    let (_client, driver) = HboneClient::handshake(client_io, &keepalive).await.unwrap();
    let started = tokio::time::Instant::now();
    let err = driver.await.unwrap_err();
    assert!(
        matches!(err, ClientError::KeepaliveTimeout(t) if t == Duration::from_secs(20)),
        "{err:?}"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(30),
        "first PING at 10 s, +20 s timeout"
    );

    // Server side: the silent peer plays the client.
    let (server_io, peer) = tokio::io::duplex(BUF);
    tokio::spawn(silent_peer(peer, true));
    let served = ambit_hbone::serve_connection(
        server_io,
        &keepalive,
        status_handler,
        std::future::pending(),
    )
    .await;
    assert!(
        matches!(served, Err(ambit_hbone::ServerError::KeepaliveTimeout(_))),
        "{served:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_sends_the_preface_is_dropped() {
    let settings = ambit_hbone::H2Settings {
        server_handshake_timeout: Duration::from_secs(5),
        ..ambit_hbone::H2Settings::default()
    };
    let (server_io, peer) = tokio::io::duplex(BUF);
    tokio::spawn(silent_peer(peer, false));
    let started = tokio::time::Instant::now();
    let served =
        ambit_hbone::serve_connection(server_io, &settings, status_handler, std::future::pending())
            .await;
    assert!(
        matches!(served, Err(ambit_hbone::ServerError::HandshakeTimeout(t)) if t == Duration::from_secs(5)),
        "{served:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn keepalive_keeps_healthy_connections() {
    let keepalive = ambit_hbone::H2Settings {
        keepalive_interval: Some(Duration::from_secs(10)),
        ..ambit_hbone::H2Settings::default()
    };
    let mut served = serve(keepalive.clone(), status_handler);
    let io = std::mem::replace(&mut served.io, tokio::io::duplex(1).0);
    let (client, driver) = HboneClient::handshake(io, &keepalive).await.unwrap();
    let driver = tokio::spawn(driver);
    // Ten minutes of virtual time: 60 PING/PONG exchanges each way.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(!driver.is_finished() && !served.server.is_finished());
    let (_, mut s) = client
        .send_connect(&target("10.0.0.1:80"), HeaderMap::new())
        .await
        .unwrap();
    assert_eq!(round_trip(&mut s, b"still here").await, b"still here");
}
