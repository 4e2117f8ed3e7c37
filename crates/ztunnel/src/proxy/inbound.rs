//! Inbound HBONE on 15008: mTLS with the served workload's certificate, HTTP/2 CONNECT, the
//! target resolved against the arrival address (§3.2), authorization (§6), then a connection to
//! the application carrying the client's source IP.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_hbone::{ConnectRequest, ConnectTarget, H2Stream, Responder};
use ambit_model::authz::Connection;
use ambit_model::{SpiffeId, Workload};
use ambit_tls::WorkloadCertificate;
use ambit_tls::rustls::ServerConfig;
use ambit_tls::tokio_rustls::TlsAcceptor;
use http::{HeaderMap, StatusCode};
use tokio::net::{TcpListener, TcpStream};

use super::upstream::{baggage_for, connect_app, insert_baggage};
use super::{ProxyInputs, TrackedConnection, observe};
use crate::drain::DrainWatcher;
use crate::telemetry::{
    AccessLog, ConnectionGuard, ConnectionLog, ConnectionSecurityPolicy, Direction, Reporter,
    ResponseFlag, TrafficLabels, connection_failed,
};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Server TLS config for the current certificate, rebuilt only when the certificate changed.
#[derive(Debug, Default)]
struct TlsCache {
    current: Mutex<Option<(Arc<WorkloadCertificate>, Arc<ServerConfig>)>>,
}

impl TlsCache {
    fn get(
        &self,
        cert: Arc<WorkloadCertificate>,
    ) -> Result<Arc<ServerConfig>, ambit_tls::ConfigError> {
        let mut slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((c, cfg)) = slot.as_ref()
            && Arc::ptr_eq(c, &cert)
        {
            return Ok(cfg.clone());
        }
        let cfg = Arc::new(ambit_tls::server_config(&cert)?);
        *slot = Some((cert, cfg.clone()));
        Ok(cfg)
    }
}

pub(super) async fn run(listener: TcpListener, inputs: ProxyInputs, drain: DrainWatcher) {
    let tls = Arc::new(TlsCache::default());
    let gate = super::SyncGate::new(inputs.state.clone());
    super::accept_loop(
        "inbound",
        listener,
        gate,
        drain,
        move |stream, peer, watcher| {
            handle_conn(stream, peer, inputs.clone(), tls.clone(), watcher)
        },
    )
    .await;
}

async fn handle_conn(
    tcp: TcpStream,
    peer: SocketAddr,
    inputs: ProxyInputs,
    tls: Arc<TlsCache>,
    drain: DrainWatcher,
) {
    let peer = super::canonical(peer);
    let Ok(local) = tcp.local_addr().map(super::canonical) else {
        return;
    };
    let Some(workload) = inputs.local_workload() else {
        connection_failed(
            peer,
            local,
            Direction::Inbound,
            &"local: served workload unknown",
        );
        return;
    };
    let cert = match inputs.certs.fetch(workload.identity()).await {
        Ok(c) => c,
        Err(e) => {
            connection_failed(peer, local, Direction::Inbound, &format!("local: {e}"));
            return;
        }
    };
    let config = match tls.get(cert) {
        Ok(c) => c,
        Err(e) => {
            connection_failed(peer, local, Direction::Inbound, &format!("local: {e}"));
            return;
        }
    };
    // Boxed so the handshake's state is freed once done instead of sizing the task that
    // then serves the connection.
    let tcp = ambit_hbone::ReadAhead::new(tcp, super::HBONE_READ_AHEAD);
    let handshake = Box::pin(tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        TlsAcceptor::from(config).accept(tcp),
    ));
    let mut stream = match handshake.await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            connection_failed(
                peer,
                local,
                Direction::Inbound,
                &format!("downstream: TLS: {e}"),
            );
            return;
        }
        Err(_) => {
            connection_failed(
                peer,
                local,
                Direction::Inbound,
                &"downstream: TLS handshake timed out",
            );
            return;
        }
    };
    stream
        .get_mut()
        .1
        .set_buffer_limit(Some(super::HBONE_TLS_SEND_LIMIT));
    let src_identity = ambit_tls::peer_identity(stream.get_ref().1);
    let settings = super::h2_settings(&inputs.cfg);
    let ctx = Arc::new(StreamCtx {
        inputs,
        peer,
        local,
        src_identity,
    });
    let handler = move |req: ConnectRequest, responder: Responder| {
        // Only the target travels into the stream's task: the request headers (baggage,
        // forwarded, traceparent) are not used, so they are freed here rather than kept
        // until the tunnel closes.
        ctx.clone().handle_stream(Box::new(PendingStream {
            target: req.target,
            responder,
        }))
    };
    let drained = {
        let drain = drain.clone();
        async move {
            drain.signaled().await;
        }
    };
    if let Err(e) = ambit_hbone::serve_connection(stream, &settings, handler, drained).await {
        tracing::debug!(%peer, error = %e, "HBONE connection ended with an error");
    }
}

struct StreamCtx {
    inputs: ProxyInputs,
    peer: SocketAddr,
    local: SocketAddr,
    src_identity: Option<SpiffeId>,
}

/// Why a CONNECT was refused, with the status it maps to (§3.2).
#[derive(Debug, thiserror::Error)]
enum InboundError {
    #[error("ip mismatch: CONNECT to {requested} arrived on {arrived}")]
    IpMismatch { requested: IpAddr, arrived: IpAddr },
    #[error("attempted recursive call to ourselves (port {0})")]
    SelfCall(u16),
    #[error("local: the served workload is not in the state")]
    UnknownWorkload,
    #[error(transparent)]
    NotServed(#[from] super::NotServed),
    #[error("local: no service {0} with port {1} on this workload")]
    UnknownService(String, u16),
    #[error("{0}")]
    Denied(String),
    #[error("{0}")]
    Upstream(#[from] super::upstream::UpstreamError),
}

impl InboundError {
    fn status(&self) -> StatusCode {
        match self {
            InboundError::IpMismatch { .. } | InboundError::NotServed(_) => StatusCode::BAD_REQUEST,
            InboundError::Denied(_) => StatusCode::UNAUTHORIZED,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn flag(&self) -> ResponseFlag {
        match self {
            InboundError::Denied(_) => ResponseFlag::Deny,
            InboundError::Upstream(_) => ResponseFlag::Connect,
            _ => ResponseFlag::None,
        }
    }
}

impl StreamCtx {
    /// Resolves the CONNECT target to (destination workload, app address). The destination
    /// is always the workload this listener serves, never whatever record claims the arrival
    /// address (see [`super::served_at`]).
    fn resolve(&self, target: &ConnectTarget) -> Result<(Arc<Workload>, SocketAddr), InboundError> {
        let state = &self.inputs.state;
        let arrived = self.local.ip();
        let workload = self
            .inputs
            .local_workload()
            .ok_or(InboundError::UnknownWorkload)?;
        super::served_at(state, &workload, arrived)?;
        let port = match target {
            ConnectTarget::Addr(a) => {
                let requested = a.ip().to_canonical();
                if requested != arrived {
                    return Err(InboundError::IpMismatch { requested, arrived });
                }
                a.port()
            }
            ConnectTarget::Host { host, port } => {
                // Hostname targets carry the service port: map it through this workload's
                // membership (endpoint port map first, then the service's).
                let service = state
                    .services_by_hostname(host)
                    .into_iter()
                    .find(|s| workload.services.contains_key(&s.key))
                    .ok_or_else(|| InboundError::UnknownService(host.clone(), *port))?;
                workload
                    .services
                    .get(&service.key)
                    .and_then(|m| m.get(port))
                    .or_else(|| service.ports.get(port))
                    .copied()
                    .ok_or_else(|| InboundError::UnknownService(host.clone(), *port))?
            }
        };
        if self.inputs.illegal_port(port) {
            return Err(InboundError::SelfCall(port));
        }
        Ok((workload, SocketAddr::new(arrived, port)))
    }

    /// One CONNECT stream. The task's size is what an open tunnel costs for its whole life,
    /// so everything only needed to admit it is built in [`StreamCtx::admit`] (not async, so
    /// none of it stays in the task), and the request arrives boxed: as the task's own
    /// arguments its target and responder would stay in the task until the tunnel closes.
    ///
    /// A function returning an `async` block rather than an `async fn` (which would keep its
    /// arguments twice while it waits), and the app connection and the 200 are made in a
    /// boxed future that takes the app's address and the responder whole, so neither stays
    /// in the task beside the copy (`-Zprint-type-sizes`, BENCHMARKS.md: together one 128 B
    /// size class of tokio's task cell less per stream).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn keeps its arguments twice in its state"
    )]
    fn handle_stream(
        self: Arc<Self>,
        pending: Box<PendingStream>,
    ) -> impl Future<Output = ()> + Send + 'static {
        async move {
            // Destructured straight from the call: a named `Option<Admitted>` moved out of
            // field by field would keep its own storage in the task (measured: +184 B).
            let Some(Admitted {
                guard,
                log,
                workload,
                mut tracked,
                setup,
            }) = ({
                let PendingStream { target, responder } = *pending;
                self.admit(&target, responder)
            })
            else {
                return;
            };
            let result = 'run: {
                // Taken apart in its own statement: a `match` around the copy would keep the
                // whole result (152 B) beside the socket and tunnel moved out of it.
                let (mut upstream, mut tunnel) = match Box::pin(self.open(&workload, setup)).await {
                    Ok(Some(opened)) => opened,
                    Ok(None) => break 'run Ok(()),
                    Err(e) => break 'run Err(e),
                };
                tokio::select! {
                    r = super::copy_hbone(&mut upstream, &mut tunnel, &guard, false) => {
                        // A copy error after the 200 is the end of the connection, not a
                        // refusal.
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "inbound copy ended with an error");
                        }
                        Ok(())
                    }
                    reason = tracked.closed() => Err(InboundError::Denied(reason)),
                }
            };
            if let Err(e) = &result {
                guard.set_failed(e.flag());
            }
            log.complete_with(
                &guard,
                result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
            );
        }
    }

    /// Resolves and authorizes the stream, opening its metrics and access log. Refusals are
    /// answered, counted and logged here.
    fn admit(&self, target: &ConnectTarget, responder: Responder) -> Option<Admitted> {
        let mut info = ConnectionLog::new(Direction::Inbound, self.peer, self.local);
        info.names.dst_hbone_addr = Some(observe::intern_display(target));
        info.names.src_identity = self.src_identity.as_ref().map(observe::intern_display);
        let mut labels = TrafficLabels::new(Reporter::Destination);
        // Source workload fields come from the workload found by source IP, not the client's
        // baggage (which it controls), like upstream.
        if let Some(s) = self.inputs.state.workload_by_addr("", self.peer.ip()) {
            observe::log_src(&mut info, &s);
            observe::source(&mut labels, &s);
        }
        if let Some(id) = &self.src_identity {
            labels.source_principal = observe::intern_display(id);
        }
        labels.connection_security_policy = ConnectionSecurityPolicy::MutualTls;
        let (workload, app) = match self.resolve(target) {
            Ok(r) => r,
            Err(e) => {
                let _ = responder.reject(e.status());
                let guard = self.inputs.metrics.connection_opened(labels);
                guard.set_failed(e.flag());
                AccessLog::opened(info).complete_with(&guard, Some(&e));
                return None;
            }
        };
        observe::destination(&mut labels, &workload);
        labels.destination_principal = observe::intern_display(workload.identity());
        observe::log_dst(&mut info, &workload);
        info.dst_addr = app;
        let guard = self.inputs.metrics.connection_opened(labels);
        let log = AccessLog::opened(info);
        let attrs = Connection {
            src_identity: self.src_identity.clone(),
            src_ip: self.peer.ip(),
            dst_ip: app.ip(),
            dst_port: app.port(),
        };
        let tracked = match self
            .inputs
            .tracker
            .admit(&self.inputs.state, workload.clone(), attrs)
        {
            Ok(tracked) => tracked,
            Err(reason) => {
                let _ = responder.reject(StatusCode::UNAUTHORIZED);
                let e = InboundError::Denied(reason);
                guard.set_failed(e.flag());
                log.complete_with(&guard, Some(&e));
                return None;
            }
        };
        Some(Admitted {
            guard,
            log,
            workload,
            tracked,
            setup: Setup { app, responder },
        })
    }

    /// Connects to the app and answers the CONNECT: the app socket and the tunnel, or
    /// `None` when the client went away before the 200.
    async fn open(
        &self,
        workload: &Workload,
        setup: Setup,
    ) -> Result<Option<(TcpStream, H2Stream)>, InboundError> {
        let Setup { app, responder } = setup;
        let upstream = match connect_app(&self.inputs, app, Some(self.peer.ip())).await {
            Ok(s) => s,
            Err(e) => {
                let _ = responder.reject(StatusCode::SERVICE_UNAVAILABLE);
                return Err(e.into());
            }
        };
        let Ok(tunnel) = responder.accept(self.response_headers(workload)) else {
            return Ok(None);
        };
        Ok(Some((upstream, tunnel)))
    }

    fn response_headers(&self, workload: &Workload) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if self.inputs.cfg.enable_response_baggage {
            insert_baggage(&mut headers, &baggage_for(workload));
        }
        headers
    }
}

/// A CONNECT as it arrives, before admission.
struct PendingStream {
    target: ConnectTarget,
    responder: Responder,
}

/// A stream that passed resolution and authorization.
struct Admitted {
    guard: ConnectionGuard,
    log: AccessLog,
    workload: Arc<Workload>,
    tracked: TrackedConnection,
    setup: Setup,
}

/// What the admitted stream still needs to connect to its app and answer the CONNECT;
/// not `Copy`, so that moving it leaves nothing in the task.
struct Setup {
    app: SocketAddr,
    responder: Responder,
}

#[cfg(test)]
mod task_size {
    /// Release: 728 B of future in an 896 B cell (48 B to spare); debug: 736 B.
    #[test]
    fn an_inbound_stream_task_stays_in_its_size_class() {
        let future = crate::proxy::tests::returned_size(&super::StreamCtx::handle_stream);
        crate::proxy::tests::assert_task_fits(
            "inbound::StreamCtx::handle_stream",
            future,
            896,
            DEBUG_BUDGET,
        );
    }

    /// Today's debug size plus the bytes the release cell has to spare.
    const DEBUG_BUDGET: usize = 784;
}
