#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

const WAIT: Duration = Duration::from_secs(5);

/// A server on an ephemeral localhost port answering `POST /echo` with the body it read
/// and anything else with `ok`; stops when the returned sender is dropped or sent.
async fn start(limits: Limits) -> (SocketAddr, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, mut stop) = watch::channel(false);
    let mut force = stop.clone();
    let task = tokio::spawn(async move {
        serve(
            "test",
            listener,
            limits,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
            async move {
                let _ = force.wait_for(|s| *s).await;
            },
            move |req: Request<Incoming>| async move {
                if req.uri().path() == "/echo" {
                    match read_body(req.into_body(), max_body(limits)).await {
                        Ok(b) => text(StatusCode::OK, b),
                        Err(e) => e.response(),
                    }
                } else {
                    text(StatusCode::OK, "ok")
                }
            },
        )
        .await;
    });
    (addr, stop_tx, task)
}

fn max_body(limits: Limits) -> usize {
    limits.max_body
}

/// Reads until EOF or `WAIT`; `None` when the peer kept the connection open.
async fn read_to_close(s: &mut TcpStream) -> Option<String> {
    let mut out = Vec::new();
    match tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

async fn request(addr: SocketAddr, raw: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    read_to_close(&mut s)
        .await
        .expect("the server answers and closes")
}

#[tokio::test]
async fn a_client_holding_its_headers_open_is_cut_at_the_deadline() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let (addr, _stop, _task) = start(limits).await;
    // (what the client sends, then holds the connection open)
    let cases = [
        ("a partial head", "GET / HTTP/1.1\r\nHost: x\r\n"),
        ("nothing at all", ""),
    ];
    for (name, partial) in cases {
        let started = tokio::time::Instant::now();
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(partial.as_bytes()).await.unwrap();
        assert!(
            read_to_close(&mut s).await.is_some(),
            "{name}: still open after {WAIT:?}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{name}: closed before the deadline"
        );
    }
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_with_413() {
    let limits = Limits {
        max_body: 16,
        ..Limits::default()
    };
    let (addr, _stop, _task) = start(limits).await;
    let big = "x".repeat(17);
    let chunked_big = format!("11\r\n{big}\r\n0\r\n\r\n");
    // (name, request, expected status line, expected body text)
    let cases = [
        (
            "declared length within the limit",
            "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
                .to_string(),
            "HTTP/1.1 200",
            "hello",
        ),
        (
            "declared length over the limit, body never sent",
            "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n"
                .to_string(),
            "HTTP/1.1 413",
            "larger than 16 bytes",
        ),
        (
            "declared length over the limit on a route that reads no body",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nConnection: close\r\n\r\n"
                .to_string(),
            "HTTP/1.1 413",
            "larger than 16 bytes",
        ),
        (
            "chunked body over the limit",
            format!(
                "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunked_big}"
            ),
            "HTTP/1.1 413",
            "larger than 16 bytes",
        ),
    ];
    for (name, raw, status, body) in cases {
        let got = request(addr, &raw).await;
        assert!(got.starts_with(status), "{name}: {got}");
        assert!(got.contains(body), "{name}: {got}");
    }
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_until_one_ends() {
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let (addr, _stop, _task) = start(limits).await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        idle.push(s);
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    third
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), third.read(&mut buf))
            .await
            .is_err(),
        "a third connection was served beside two open ones"
    );
    drop(idle.pop());
    let got = read_to_close(&mut third)
        .await
        .expect("served once a slot frees");
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
}

/// Fails every accept, counting the attempts.
struct Failing(Arc<AtomicUsize>);

impl Listener for Failing {
    type Io = TcpStream;

    async fn accept(&self) -> io::Result<TcpStream> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(io::Error::from_raw_os_error(24)) // EMFILE
    }
}

#[tokio::test]
async fn failed_accepts_back_off_instead_of_spinning() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let limits = Limits {
        accept_backoff: Duration::from_millis(50),
        ..Limits::default()
    };
    let window = Duration::from_millis(500);
    serve(
        "test",
        Failing(attempts.clone()),
        limits,
        tokio::time::sleep(window),
        std::future::ready(()),
        |_req: Request<Incoming>| async { text(StatusCode::OK, "") },
    )
    .await;
    let n = attempts.load(Ordering::SeqCst);
    // One attempt per backoff period (plus the first), never a busy loop.
    assert!((1..=12).contains(&n), "{n} accept attempts in {window:?}");
}

#[tokio::test]
async fn stopping_finishes_in_flight_requests_and_closes_idle_ones() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, mut stop) = watch::channel(false);
    let (release_tx, release) = watch::channel(false);
    let (entered_tx, mut entered) = watch::channel(false);
    let entered_tx = Arc::new(entered_tx);
    let task = tokio::spawn(async move {
        serve(
            "test",
            listener,
            Limits::default(),
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
            std::future::pending(),
            move |_req: Request<Incoming>| {
                let (mut release, entered) = (release.clone(), entered_tx.clone());
                async move {
                    let _ = entered.send(true);
                    let _ = release.wait_for(|r| *r).await;
                    text(StatusCode::OK, "done")
                }
            },
        )
        .await;
    });
    let mut busy = TcpStream::connect(addr).await.unwrap();
    busy.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    tokio::time::timeout(WAIT, entered.wait_for(|e| *e))
        .await
        .unwrap()
        .unwrap();
    stop_tx.send(true).unwrap();
    assert_eq!(read_to_close(&mut idle).await.as_deref(), Some(""));
    release_tx.send(true).unwrap();
    let got = read_to_close(&mut busy)
        .await
        .expect("in-flight request finishes");
    assert!(
        got.starts_with("HTTP/1.1 200") && got.ends_with("done"),
        "{got}"
    );
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "still listening");
}
