//! Inbound plaintext capture on 15006: traffic from clients outside the mesh, REDIRECTed by
//! the in-pod rules. Authorized with no source identity (so a STRICT PeerAuthentication, which
//! becomes a DENY of "no principal", refuses it), then forwarded to the original destination
//! with the client's source IP (§3.6).

use std::net::SocketAddr;
use std::sync::Arc;

use ambit_model::authz::Connection;
use tokio::net::{TcpListener, TcpStream};

use super::upstream::connect_app;
use super::{ProxyInputs, TrackedConnection, observe};
use crate::drain::DrainWatcher;
use crate::telemetry::{
    AccessLog, ConnectionGuard, ConnectionLog, Direction, Reporter, ResponseFlag, TrafficLabels,
    connection_failed,
};

pub(super) async fn run(listener: TcpListener, inputs: ProxyInputs, drain: DrainWatcher) {
    // One shared copy: each connection's task holds a pointer, not a clone of the inputs.
    let inputs = Arc::new(inputs);
    let gate = super::SyncGate::new(inputs.state.clone());
    super::accept_loop(
        "inbound plaintext",
        listener,
        gate,
        drain,
        move |stream, peer, watcher| handle(stream, peer, inputs.clone(), watcher),
    )
    .await;
}

/// Like the outbound handler, the admission work happens in [`admit`] (not async) so that
/// none of it stays in the connection's task for the connection's lifetime.
async fn handle(
    mut stream: TcpStream,
    peer: SocketAddr,
    inputs: Arc<ProxyInputs>,
    drain: DrainWatcher,
) {
    let Some(Admitted {
        guard,
        log,
        orig,
        peer,
        mut tracked,
    }) = admit(&stream, peer, &inputs)
    else {
        return;
    };
    let result: Result<(), PlaintextError> = async {
        let mut upstream = connect_app(&inputs, orig, Some(peer.ip())).await?;
        tokio::select! {
            r = super::copy_tcp(&mut stream, &mut upstream, &guard) => Ok(r?),
            reason = tracked.closed() => {
                guard.set_failed(ResponseFlag::Deny);
                Err(PlaintextError::Closed(reason))
            }
        }
    }
    .await;
    log.complete_with(
        &guard,
        result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
    );
    drop(drain);
}

/// Why an authorized plaintext connection ended early (the access log's error text).
#[derive(Debug, thiserror::Error)]
enum PlaintextError {
    #[error("{0}")]
    Connect(#[from] super::upstream::UpstreamError),
    #[error("copy: {0}")]
    Copy(#[from] super::CopyFailure),
    /// Closed by the tracker (a policy change denied it); the reason is its text.
    #[error("{0}")]
    Closed(String),
}

/// A connection that passed authorization, with its metrics and access log opened.
struct Admitted {
    guard: ConnectionGuard,
    log: AccessLog,
    orig: SocketAddr,
    peer: SocketAddr,
    tracked: TrackedConnection,
}

fn admit(stream: &TcpStream, peer: SocketAddr, inputs: &ProxyInputs) -> Option<Admitted> {
    let peer = super::canonical(peer);
    let orig = super::original_dst(stream);
    if inputs.illegal_port(orig.port()) {
        connection_failed(
            peer,
            orig,
            Direction::Inbound,
            &"local: attempted recursive call to ourselves",
        );
        return None;
    }
    // Policy is evaluated for the workload this listener serves, and only when the
    // destination address is that workload's (see `super::served_at`).
    let Some(workload) = inputs.local_workload() else {
        connection_failed(
            peer,
            orig,
            Direction::Inbound,
            &"local: the served workload is not in the state",
        );
        return None;
    };
    if let Err(e) = super::served_at(&inputs.state, &workload, orig.ip()) {
        connection_failed(peer, orig, Direction::Inbound, &e);
        return None;
    }
    let mut info = ConnectionLog::new(Direction::Inbound, peer, orig);
    let mut labels = TrafficLabels::new(Reporter::Destination);
    if let Some(s) = inputs.state.workload_by_addr(&workload.network, peer.ip()) {
        observe::source(&mut labels, &s);
        observe::log_src(&mut info, &s);
    }
    observe::destination(&mut labels, &workload);
    labels.destination_principal = observe::intern_display(workload.identity());
    observe::log_dst(&mut info, &workload);
    let guard = inputs.metrics.connection_opened(labels);
    let log = AccessLog::opened(info);
    let attrs = Connection {
        src_identity: None,
        src_ip: peer.ip(),
        dst_ip: orig.ip(),
        dst_port: orig.port(),
    };
    let tracked = match inputs.tracker.admit(&inputs.state, workload, attrs) {
        Ok(tracked) => tracked,
        Err(reason) => {
            guard.set_failed(ResponseFlag::Deny);
            log.complete_with(&guard, Some(&reason));
            return None;
        }
    };
    Some(Admitted {
        guard,
        log,
        orig,
        peer,
        tracked,
    })
}
