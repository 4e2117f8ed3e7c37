//! Shared test plumbing: in-memory connections, a status-by-port handler, deadlines.

#![allow(dead_code, clippy::unwrap_used)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ambit_hbone::{
    ConnectRequest, ConnectionEnd, H2Settings, H2Stream, Responder, ServerError, serve_connection,
};
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub const BUF: usize = 1024 * 1024;
pub const RESPONSE_BAGGAGE: &str = "k8s.namespace.name=default,service.name=echo";

/// Settings without keepalive so idle tests never see PINGs.
pub fn settings() -> H2Settings {
    H2Settings {
        keepalive_interval: None,
        ..H2Settings::default()
    }
}

/// Ports that make [`status_handler`] refuse with that status.
pub fn status_for_port(port: u16) -> Option<StatusCode> {
    match port {
        400 | 401 | 503 => StatusCode::from_u16(port).ok(),
        _ => None,
    }
}

/// Echo server handler: rejects ports 400/401/503 with that status, port 1 by dropping the
/// responder, otherwise answers 200 with response baggage and echoes until EOF.
pub async fn status_handler(req: ConnectRequest, responder: Responder) {
    let port = req.target.port();
    if port == 1 {
        drop(responder);
        return;
    }
    if let Some(status) = status_for_port(port) {
        responder.reject(status).expect("reject");
        return;
    }
    let mut headers = HeaderMap::new();
    headers.insert("baggage", HeaderValue::from_static(RESPONSE_BAGGAGE));
    let stream = responder.accept(headers).expect("accept");
    echo(stream).await;
}

pub async fn echo(stream: H2Stream) {
    let (mut r, mut w) = tokio::io::split(stream);
    let _ = tokio::io::copy(&mut r, &mut w).await;
    let _ = w.shutdown().await;
}

/// A served in-memory connection: the client's end, a drain trigger and the server task.
pub struct Served {
    pub io: DuplexStream,
    pub drain: watch::Sender<bool>,
    pub server: ServerTask,
}

pub fn serve<H, Fut>(settings: H2Settings, handler: H) -> Served
where
    H: Fn(ConnectRequest, Responder) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (client, server_io) = tokio::io::duplex(BUF);
    let (drain, mut drain_rx) = watch::channel(false);
    let server = tokio::spawn(async move {
        let drained = async move {
            // A dropped trigger means "never drain".
            if drain_rx.wait_for(|d| *d).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        serve_connection(server_io, &settings, handler, drained).await
    });
    Served {
        io: client,
        drain,
        server,
    }
}

pub type ServerTask = JoinHandle<Result<ConnectionEnd, ServerError>>;

/// Counts dials and remembers each server task so tests can kill connections.
#[derive(Clone, Default)]
pub struct Dialer {
    pub dials: Arc<AtomicUsize>,
    pub servers: Arc<std::sync::Mutex<Vec<ServerTask>>>,
}

impl Dialer {
    pub fn count(&self) -> usize {
        self.dials.load(Ordering::SeqCst)
    }

    pub fn dial(&self, settings: H2Settings) -> DuplexStream {
        self.dials.fetch_add(1, Ordering::SeqCst);
        let served = serve(settings, status_handler);
        self.servers.lock().unwrap().push(served.server);
        served.io
    }
}

/// Writes `msg`, half-closes, and reads everything the peer sends until its EOF.
pub async fn round_trip(stream: &mut H2Stream, msg: &[u8]) -> Vec<u8> {
    stream.write_all(msg).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    out
}
