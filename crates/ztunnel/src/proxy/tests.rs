//! The accept loop's policy-sync gate, over loopback sockets.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{SyncGate, accept_loop};
use crate::state::ProxyState;

const WAIT: Duration = Duration::from_secs(10);

/// Serves one listener whose handler answers "ok"; returns its address, the state behind
/// its gate and the drain trigger.
async fn serve(
    gate_wait: Duration,
) -> (
    std::net::SocketAddr,
    Arc<ProxyState>,
    crate::drain::DrainTrigger,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(ProxyState::new());
    let gate = SyncGate {
        state: state.clone(),
        wait: gate_wait,
    };
    let (trigger, watcher) = crate::drain::new();
    tokio::spawn(accept_loop(
        "test",
        listener,
        gate,
        watcher,
        |mut s: TcpStream, _, _| async move {
            let _ = s.write_all(b"ok").await;
        },
    ));
    (addr, state, trigger)
}

/// What the client reads until EOF (empty: closed without an answer).
async fn answer(mut s: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("the connection ends")
        .unwrap_or_default();
    out
}

#[tokio::test]
async fn connections_wait_for_the_policy_sync() {
    struct Case {
        what: &'static str,
        synced_before: bool,
        synced_while_held: bool,
        gate_wait: Duration,
        answered: bool,
    }
    let cases = [
        Case {
            what: "already synced: served at once",
            synced_before: true,
            synced_while_held: false,
            gate_wait: WAIT,
            answered: true,
        },
        Case {
            what: "synced while the connection is held: served then",
            synced_before: false,
            synced_while_held: true,
            gate_wait: WAIT,
            answered: true,
        },
        Case {
            what: "never synced: closed at the deadline, never served",
            synced_before: false,
            synced_while_held: false,
            gate_wait: Duration::from_millis(100),
            answered: false,
        },
    ];
    for case in cases {
        let (addr, state, _trigger) = serve(case.gate_wait).await;
        if case.synced_before {
            state.mark_synced();
        }
        let mut conn = TcpStream::connect(addr).await.unwrap();
        if case.synced_while_held {
            // Held: nothing arrives while the state is not synced.
            let mut b = [0u8; 2];
            let early = tokio::time::timeout(Duration::from_millis(200), conn.read(&mut b)).await;
            assert!(early.is_err(), "{}: answered before the sync", case.what);
            state.mark_synced();
        }
        let got = answer(conn).await;
        let want: &[u8] = if case.answered { b"ok" } else { b"" };
        assert_eq!(got, want, "{}", case.what);
    }
}

/// A copy failure keeps the access log's text and names the side that failed.
#[test]
fn copy_failures_name_their_side_and_keep_the_log_text() {
    use ambit_hbone::copy::{StreamEnd, StreamsCopyError};
    use std::io::{Error, ErrorKind};
    let tcp = |end| {
        super::CopyFailure::Tcp(StreamsCopyError {
            end,
            written: (1, 2),
            source: Error::from(ErrorKind::ConnectionReset),
        })
    };
    let reset = Error::from(ErrorKind::ConnectionReset).to_string();
    let cases = [
        (
            tcp(StreamEnd::First),
            Some(super::TcpCopySide::Client),
            reset.clone(),
        ),
        (
            tcp(StreamEnd::Second),
            Some(super::TcpCopySide::Upstream),
            reset,
        ),
        (
            super::CopyFailure::Hbone(ambit_hbone::CopyError {
                side: ambit_hbone::CopySide::Tunnel,
                transferred: ambit_hbone::Transferred::default(),
                source: Error::from(ErrorKind::BrokenPipe),
            }),
            None,
            "tunnel side failed while copying (0 bytes to tunnel, 0 from tunnel)".to_string(),
        ),
    ];
    for (failure, side, text) in cases {
        assert_eq!(failure.tcp_side(), side, "{failure:?}");
        assert_eq!(failure.to_string(), text);
        // The typed error underneath stays reachable for whoever needs more than the text.
        assert!(std::error::Error::source(&failure).is_some(), "{failure:?}");
        let outbound = super::outbound::OutboundError::from(failure);
        assert_eq!(outbound.to_string(), format!("copy: {text}"));
    }
}

/// What tokio and the task set add to a connection's future in its task cell, read off the
/// release build (`-Zprint-type-sizes`, BENCHMARKS.md "Idle memory: one task size class less"):
/// a 32 B header, 16 B of core, 8 B of stage, the task set's 16 B member and a 48 B trailer.
const TASK_CELL_OVERHEAD: usize = 32 + 16 + 8 + 16 + 48;

/// Size of the future `f` returns, without calling it.
pub(super) fn returned_size<F, A, B, R>(_: &F) -> usize
where
    F: FnOnce(A, B) -> R,
{
    std::mem::size_of::<R>()
}

/// Same for a function of four arguments.
pub(super) fn returned_size4<F, A, B, C, D, R>(_: &F) -> usize
where
    F: FnOnce(A, B, C, D) -> R,
{
    std::mem::size_of::<R>()
}

/// An idle connection is mostly its task, and tokio allocates task cells in 128 B steps, so
/// a few bytes more in a connection's future can cost a whole step per connection. In a
/// release build (`cargo test --release`) the future must fit the cell it fits today; in a
/// debug build (CI), whose layouts differ (today 8 B larger), it must stay within today's
/// debug size plus what the release cell has to spare: either failure means measuring the
/// change's release layout before raising a budget.
pub(super) fn assert_task_fits(
    what: &str,
    future: usize,
    release_cell: usize,
    debug_future: usize,
) {
    if cfg!(debug_assertions) {
        assert!(
            future <= debug_future,
            "{what}: the connection's future is {future} B in this debug build, budget \
             {debug_future} B; measure its release layout (BENCHMARKS.md) before raising it"
        );
    } else {
        let cell = future + TASK_CELL_OVERHEAD;
        assert!(
            cell <= release_cell,
            "{what}: the connection's future is {future} B, its task cell {cell} B, over the \
             {release_cell} B size class it had"
        );
    }
}
