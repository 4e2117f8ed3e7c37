//! The ZDS connection loop (§2.1, §2.3): connect to the agent with backoff, say hello, then
//! read one request at a time, handle it and answer with an ack; retry pending pods on a
//! timer meanwhile. Stops when the drain is signaled.

use std::time::Duration;

use ambit_contract::zds::{MAX_MESSAGE, PodUid};
use ambit_netns::zds::{Conn, TransportError};

use super::{
    BACKOFF_INITIAL, BACKOFF_MAX, InpodManager, RETRY_INTERVAL, ZdsError, decode_request,
    encode_ack, encode_hello,
};
use crate::drain::DrainWatcher;

/// How a connection ended.
#[derive(Debug)]
enum End {
    /// The drain was signaled: stop for good.
    Drained,
    /// The agent closed the connection.
    Closed,
    /// A transport error was NACKed; reconnect.
    Dropped(ZdsError),
    /// Writing an ack failed.
    SendFailed(TransportError),
}

/// Runs connections until the drain is signaled. The first connection is only made once
/// the policy state has synced (like upstream): until then the agent sees no ztunnel (on a
/// hand-off it keeps sending new pods to the old one) and no pod is served against a state
/// without its policies.
pub(super) async fn run(mgr: &InpodManager, drain: &DrainWatcher) {
    let path = mgr.inputs.cfg.inpod_uds.clone();
    if !mgr.inputs.state.is_synced() {
        tracing::info!("waiting for the policy state to sync before joining the node's ZDS");
        tokio::select! {
            _ = drain.signaled() => return,
            () = mgr.inputs.state.wait_synced() => {}
        }
        tracing::info!("policy state synced");
    }
    let mut backoff = BACKOFF_INITIAL;
    loop {
        let connected = tokio::select! {
            _ = drain.signaled() => return,
            c = connect(&path) => c,
        };
        match connected {
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, retry_in = ?backoff, "failed to connect to the Istio CNI node agent");
            }
            Ok(sock) => {
                tracing::info!(path = %path.display(), "connected to the Istio CNI node agent");
                mgr.reset_connection();
                let (end, progressed) = serve(mgr, &sock, drain).await;
                // Not ready until the next connection's snapshot; running proxies stay.
                mgr.reset_connection();
                match end {
                    End::Drained => return,
                    End::Closed => tracing::warn!("the Istio CNI node agent closed the connection"),
                    End::Dropped(e) => {
                        tracing::warn!(error = %e, "dropping the connection to the Istio CNI node agent")
                    }
                    End::SendFailed(e) => {
                        tracing::warn!(error = %e, "failed to answer the Istio CNI node agent")
                    }
                }
                if progressed {
                    backoff = BACKOFF_INITIAL;
                }
            }
        }
        tokio::select! {
            _ = drain.signaled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Connects and announces ourselves (`ZdsHello{V1}`).
async fn connect(path: &std::path::Path) -> Result<Conn, TransportError> {
    let sock = Conn::connect(path).await?;
    sock.send(&encode_hello()).await?;
    Ok(sock)
}

/// Serves one connection. Returns how it ended and whether any request was handled
/// successfully (then the reconnect backoff starts over).
async fn serve(mgr: &InpodManager, sock: &Conn, drain: &DrainWatcher) -> (End, bool) {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut retry =
        tokio::time::interval_at(tokio::time::Instant::now() + RETRY_INTERVAL, RETRY_INTERVAL);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut progressed = false;
    loop {
        let received = tokio::select! {
            _ = drain.signaled() => return (End::Drained, progressed),
            _ = retry.tick() => {
                if mgr.has_pending() {
                    mgr.retry_pending().await;
                }
                continue;
            }
            r = sock.recv_with_fd(&mut buf) => r,
        };
        let request = match received {
            Ok((0, _)) => return (End::Closed, progressed),
            Ok((len, fd)) => decode_request(&buf[..len], fd),
            Err(e) => Err(ZdsError::Read(e)),
        };
        let result = match request {
            Ok(req) => {
                tracing::info!(
                    message = req.kind(),
                    uid = req.uid().map(PodUid::as_str).unwrap_or(""),
                    "ZDS request"
                );
                mgr.handle(req).await
            }
            Err(e) => Err(e),
        };
        let error = result.as_ref().err().map(ToString::to_string);
        if let Some(e) = &error {
            tracing::warn!(error = %e, "NACK to the Istio CNI node agent");
        } else {
            progressed = true;
        }
        if let Err(e) = send_ack(sock, error.as_deref()).await {
            return (End::SendFailed(e), progressed);
        }
        if let Err(e) = result
            && e.drops_connection()
        {
            return (End::Dropped(e), progressed);
        }
    }
}

/// The agent waits at most 5 s for an ack; a stuck write must not stall us forever.
async fn send_ack(sock: &Conn, error: Option<&str>) -> Result<(), TransportError> {
    match tokio::time::timeout(Duration::from_secs(5), sock.send(&encode_ack(error))).await {
        Ok(r) => r,
        Err(_) => Err(TransportError::Send(std::io::ErrorKind::TimedOut.into())),
    }
}
