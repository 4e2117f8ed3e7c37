//! Inbound plaintext capture on 15006: traffic from clients outside the mesh, REDIRECTed by
//! the in-pod rules. Authorized with no source identity (so a STRICT PeerAuthentication, which
//! becomes a DENY of "no principal", refuses it), then forwarded to the original destination
//! with the client's source IP (§3.6).

use std::net::SocketAddr;

use ambit_model::authz::Connection;
use tokio::net::{TcpListener, TcpStream};

use super::upstream::connect_app;
use super::{ProxyInputs, observe};
use crate::drain::DrainWatcher;
use crate::state::AuthzOutcome;
use crate::telemetry::{
    AccessLog, ConnectionLog, Direction, Reporter, ResponseFlag, TrafficLabels, connection_failed,
};

pub(super) async fn run(listener: TcpListener, inputs: ProxyInputs, drain: DrainWatcher) {
    super::accept_loop(
        "inbound plaintext",
        listener,
        drain,
        move |stream, peer, watcher| {
            let inputs = inputs.clone();
            async move {
                handle(stream, peer, &inputs).await;
                drop(watcher);
            }
        },
    )
    .await;
}

async fn handle(mut stream: TcpStream, peer: SocketAddr, inputs: &ProxyInputs) {
    let peer = super::canonical(peer);
    let orig = super::original_dst(&stream);
    if inputs.illegal_port(orig.port()) {
        connection_failed(
            peer,
            orig,
            Direction::Inbound,
            &"local: attempted recursive call to ourselves",
        );
        return;
    }
    let network = inputs
        .local_workload()
        .map(|w| w.network.clone())
        .unwrap_or_default();
    let Some(workload) = inputs.state.workload_by_addr(&network, orig.ip()) else {
        connection_failed(
            peer,
            orig,
            Direction::Inbound,
            &"local: no workload at destination",
        );
        return;
    };
    let mut info = ConnectionLog::new(Direction::Inbound, peer, orig);
    let mut labels = TrafficLabels::new(Reporter::Destination);
    if let Some(s) = inputs.state.workload_by_addr(&network, peer.ip()) {
        observe::source(&mut labels, &s);
        observe::log_src(&mut info, &s);
    }
    observe::destination(&mut labels, &workload);
    labels.destination_principal = workload.identity().to_string().into();
    observe::log_dst(&mut info, &workload);
    let guard = inputs.metrics.connection_opened(labels);
    let log = AccessLog::opened(info);
    let attrs = Connection {
        src_identity: None,
        src_ip: peer.ip(),
        dst_ip: orig.ip(),
        dst_port: orig.port(),
    };
    let result: Result<(), String> = async {
        if let AuthzOutcome::Deny(reason) = inputs.state.authorize(&workload, &attrs) {
            guard.set_failed(ResponseFlag::Deny);
            return Err(reason);
        }
        let mut tracked = inputs.tracker.track(workload.uid.clone(), attrs);
        let mut upstream = connect_app(inputs, orig, Some(peer.ip()))
            .await
            .map_err(|e| e.to_string())?;
        tokio::select! {
            r = super::copy_tcp(&mut stream, &mut upstream, &guard) => r,
            reason = tracked.closed() => {
                guard.set_failed(ResponseFlag::Deny);
                Err(reason)
            }
        }
    }
    .await;
    log.complete_with(
        &guard,
        result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
    );
}
