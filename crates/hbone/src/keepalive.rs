//! HTTP/2 PING keepalive shared by client and server connections (spec §3.3): a PING every
//! interval; no PONG within the timeout means the peer (or the path) is dead.

use std::time::Duration;

use h2::{Ping, PingPong};

/// Why keepalive gave up on a connection.
#[derive(Debug)]
pub(crate) enum KeepaliveFailure {
    /// No PONG arrived in time.
    Timeout(Duration),
    /// h2 refused to send the PING or the connection failed while waiting.
    H2(h2::Error),
}

/// Runs until the connection should be dropped. Pending forever when disabled, so it can
/// sit in a `select!` next to the connection.
pub(crate) async fn run(
    ping_pong: Option<PingPong>,
    interval: Option<Duration>,
    timeout: Duration,
) -> KeepaliveFailure {
    let (Some(mut ping_pong), Some(interval)) = (ping_pong, interval) else {
        return std::future::pending().await;
    };
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    // A late tick after a long PONG wait should not cause a burst of PINGs.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match tokio::time::timeout(timeout, ping_pong.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(e)) => return KeepaliveFailure::H2(e),
            Err(_) => return KeepaliveFailure::Timeout(timeout),
        }
    }
}
