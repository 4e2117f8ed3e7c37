//! Outbound capture on 15001: the application's connection, redirected by the in-pod rules,
//! is resolved by its original destination (§3.5) and carried over HBONE, plain TCP to a
//! non-mesh workload, or passed through to an unknown destination.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use ambit_hbone::{ConnectTarget, headers::build_forwarded, headers::new_traceparent};
use ambit_model::workload::{GatewayAddress, GatewayDestination, TunnelProtocol};
use ambit_model::{Service, SpiffeId, Workload};
use futures_util::future::Either;
use http::{HeaderMap, HeaderValue};
use rand::seq::IndexedRandom;
use tokio::net::{TcpListener, TcpStream};

use super::observe;
use super::upstream::{baggage_for, insert_baggage};
use super::{PoolKey, ProxyInputs};
use crate::drain::DrainWatcher;
use crate::telemetry::{
    AccessLog, ConnectionGuard, ConnectionLog, ConnectionSecurityPolicy, Direction, Reporter,
    ResponseFlag, TrafficLabels, connection_failed,
};

/// Why an outbound connection could not be proxied; the prefix says which side failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("local: attempted recursive call to ourselves ({0})")]
    SelfCall(SocketAddr),
    #[error("local: the source workload {0} is not (yet) known")]
    UnknownSource(String),
    #[error("upstream: service {0} has no healthy endpoint")]
    NoHealthyEndpoint(String),
    #[error("upstream: waypoint {0} cannot be resolved")]
    UnknownWaypoint(String),
    #[error("upstream: {0}")]
    Hbone(#[from] ambit_hbone::PoolError),
    #[error("upstream: CONNECT answered {0}")]
    Status(http::StatusCode),
    #[error("upstream: {0}")]
    Connect(#[from] super::upstream::UpstreamError),
    #[error("copy: {0}")]
    Copy(#[from] super::CopyFailure),
}

/// Where a connection goes.
#[derive(Debug)]
pub enum Route {
    /// Plain TCP (passthrough to an unknown address, or a non-HBONE workload).
    Tcp {
        dst: SocketAddr,
        workload: Option<Arc<Workload>>,
        service: Option<Arc<Service>>,
    },
    /// HBONE: mTLS to `dst` (a pod's 15008 or a waypoint), CONNECT `target`.
    Hbone {
        /// The peer is a waypoint (an Envoy), not a ztunnel.
        waypoint: bool,
        dst: SocketAddr,
        target: ConnectTarget,
        identities: Vec<SpiffeId>,
        workload: Arc<Workload>,
        service: Option<Arc<Service>>,
    },
}

pub(super) async fn run(listener: TcpListener, inputs: ProxyInputs, drain: DrainWatcher) {
    // One shared copy: each connection's task holds a pointer, not a clone of the inputs.
    let inputs = Arc::new(inputs);
    let gate = super::SyncGate::new(inputs.state.clone());
    super::accept_loop(
        "outbound",
        listener,
        gate,
        drain,
        move |stream, peer, watcher| handle(stream, peer, inputs.clone(), watcher),
    )
    .await;
}

/// The connection's lifetime state is the task's size, and most connections are long-lived
/// and idle: everything that is only needed to get the connection going is built in
/// [`open`] (not async, so none of it stays in the task) or boxed while it runs.
///
/// A function returning an `async` block rather than an `async fn`: an `async fn` keeps its
/// parameters twice for as long as it waits (the arguments and the copies its body moves
/// them into: 64 B of every idle connection here), an `async` block keeps what it captured
/// once. Of the drain watcher only the blocker is kept (the accept loop's tasks are aborted
/// when the drain is forced), and the plan is consumed whole so that it is not kept beside
/// the proxying it started (`-Zprint-type-sizes`, BENCHMARKS.md: together one 128 B size
/// class of tokio's task cell less per connection).
fn handle(
    mut stream: TcpStream,
    peer: SocketAddr,
    inputs: Arc<ProxyInputs>,
    drain: DrainWatcher,
) -> impl Future<Output = ()> + Send + 'static {
    let drain = drain.into_blocker();
    async move {
        let Some(Opened { guard, log, plan }) = open(&stream, peer, &inputs) else {
            return;
        };
        let result = proxy(plan, &inputs, &mut stream, &guard).await;
        if let Err(e) = &result {
            guard.set_failed(response_flag(e));
        }
        log.complete_with(
            &guard,
            result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
        );
        drop(drain);
    }
}

/// Starts proxying by `plan`, which it takes whole (a `match` on a local would keep it).
fn proxy<'a>(
    plan: Plan,
    inputs: &'a ProxyInputs,
    stream: &'a mut TcpStream,
    guard: &'a ConnectionGuard,
) -> impl Future<Output = Result<(), OutboundError>> + Send + 'a {
    match plan {
        Plan::Tcp(dst) => Either::Left(proxy_tcp(inputs, stream, dst, guard)),
        Plan::Hbone(connect) => Either::Right(proxy_hbone(stream, connect, guard)),
    }
}

/// A connection with a route, its metrics and its access log opened.
struct Opened {
    guard: ConnectionGuard,
    log: AccessLog,
    plan: Plan,
}

/// A pooled CONNECT still to be made: what [`open`] resolved for it.
struct HboneRequest {
    pool: super::WorkloadPool,
    key: PoolKey,
    target: ConnectTarget,
    headers: HeaderMap,
    /// Bytes of the client's first flight to send with the request (0: wait for the 200).
    early_data: usize,
}

enum Plan {
    Tcp(SocketAddr),
    /// The pooled CONNECT, boxed: the request, and later the dial, TLS and handshake, are
    /// large and over once the tunnel is up.
    Hbone(Box<HboneRequest>),
}

fn open(stream: &TcpStream, peer: SocketAddr, inputs: &ProxyInputs) -> Option<Opened> {
    let peer = super::canonical(peer);
    let orig = super::original_dst(stream);
    let src = inputs.local_workload();
    let route = match src.as_ref() {
        None => Err(OutboundError::UnknownSource(format!(
            "{}/{}",
            inputs.local.namespace, inputs.local.name
        ))),
        Some(_) if orig.ip().is_loopback() && inputs.illegal_port(orig.port()) => {
            Err(OutboundError::SelfCall(orig))
        }
        Some(src) => build_route(inputs, src, orig),
    };
    let (src, route) = match (src, route) {
        (Some(src), Ok(route)) => (src, route),
        (_, Err(e)) => {
            connection_failed(peer, orig, Direction::Outbound, &e);
            return None;
        }
        (None, Ok(_)) => return None,
    };
    let guard = inputs.metrics.connection_opened(labels_for(&src, &route));
    let mut info = ConnectionLog::new(Direction::Outbound, peer, orig);
    observe::log_src(&mut info, &src);
    info.names.src_identity = Some(observe::intern_display(src.identity()));
    let plan = match route {
        Route::Tcp { dst, workload, .. } => {
            if let Some(w) = &workload {
                observe::log_dst(&mut info, w);
                info.names.dst_identity = None;
            }
            info.dst_addr = dst;
            Plan::Tcp(dst)
        }
        Route::Hbone {
            waypoint,
            dst,
            target,
            identities,
            workload,
            service,
        } => {
            observe::log_dst(&mut info, &workload);
            info.dst_addr = dst;
            info.names.dst_hbone_addr = Some(observe::intern_display(&target));
            if let Some(s) = &service {
                info.names.dst_service = Some(observe::intern(s.hostname()));
            }
            let key = PoolKey {
                src_identity: src.identity().clone(),
                dst_identities: identities,
                dst,
                src_ip: None,
            };
            let headers = request_headers(&src, peer, service.as_deref());
            // A waypoint is an Envoy: it gets the request as upstream sends it.
            let early_data = if waypoint {
                0
            } else {
                inputs.cfg.hbone_early_data
            };
            Plan::Hbone(Box::new(HboneRequest {
                pool: inputs.pool.clone(),
                key,
                target,
                headers,
                early_data,
            }))
        }
    };
    Some(Opened {
        guard,
        log: AccessLog::opened(info),
        plan,
    })
}

fn response_flag(e: &OutboundError) -> ResponseFlag {
    match e {
        // The client's own socket failed while the CONNECT was pending.
        OutboundError::Hbone(ambit_hbone::PoolError::Connect(
            ambit_hbone::ClientError::EarlyData(_),
        )) => ResponseFlag::None,
        OutboundError::Hbone(_) | OutboundError::Status(_) | OutboundError::Connect(_) => {
            ResponseFlag::Connect
        }
        _ => ResponseFlag::None,
    }
}

fn request_headers(src: &Workload, peer: SocketAddr, service: Option<&Service>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    insert_baggage(&mut headers, &baggage_for(src));
    let forwarded = build_forwarded(peer, service.map(|s| s.hostname()));
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert("forwarded", v);
    }
    if let Ok(v) = HeaderValue::from_str(&new_traceparent()) {
        headers.insert("traceparent", v);
    }
    headers
}

async fn proxy_tcp(
    inputs: &ProxyInputs,
    stream: &mut TcpStream,
    dst: SocketAddr,
    guard: &ConnectionGuard,
) -> Result<(), OutboundError> {
    let mut upstream = super::upstream::connect_app(inputs, dst, None).await?;
    Ok(super::copy_tcp(stream, &mut upstream, guard).await?)
}

/// An `async` block, not an `async fn`, for the same reason as [`handle`].
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in its state"
)]
fn proxy_hbone<'a>(
    stream: &'a mut TcpStream,
    req: Box<HboneRequest>,
    guard: &'a ConnectionGuard,
) -> impl Future<Output = Result<(), OutboundError>> + Send + 'a {
    async move {
        // Boxed, and nothing of it is kept: the request, the early data's state and the
        // dial, TLS and handshake are large and over once the tunnel is up, and most
        // connections then sit idle for long.
        let (mut tunnel, early_bytes) = Box::pin(open_tunnel(&mut *stream, req)).await?;
        // The first flight went with the request; it counts once the tunnel is open.
        if early_bytes > 0 {
            guard.add_received(early_bytes);
        }
        Ok(super::copy_hbone(stream, &mut tunnel, guard, true).await?)
    }
}

/// The CONNECT of `req`, carrying the client's first flight; the open tunnel and how many
/// bytes of the client went with the request.
async fn open_tunnel(
    stream: &mut TcpStream,
    req: Box<HboneRequest>,
) -> Result<(ambit_hbone::H2Stream, u64), OutboundError> {
    let HboneRequest {
        pool,
        key,
        target,
        headers,
        early_data,
    } = *req;
    let mut early = ambit_hbone::EarlyData::new(stream, early_data);
    let (resp, tunnel) = pool
        .connect_early(key, &target, headers, &mut early)
        .await
        .map_err(|e| match &e {
            ambit_hbone::PoolError::Connect(ambit_hbone::ClientError::Status {
                status, ..
            }) => OutboundError::Status(*status),
            _ => OutboundError::Hbone(e),
        })?;
    if resp.status != http::StatusCode::OK {
        return Err(OutboundError::Status(resp.status));
    }
    Ok((tunnel, early.bytes()))
}

/// The decision tree of §3.5.
pub fn build_route(
    inputs: &ProxyInputs,
    src: &Workload,
    orig: SocketAddr,
) -> Result<Route, OutboundError> {
    let state = &inputs.state;
    let network = src.network.as_str();
    if let Some(service) = state.service_by_vip(network, orig.ip()) {
        if let Some(waypoint) = &service.waypoint {
            return via_waypoint(inputs, waypoint, orig, Some(service.clone()));
        }
        let endpoints = state.endpoints(&service);
        let Some(ep) = endpoints.choose(&mut rand::rng()) else {
            return Err(OutboundError::NoHealthyEndpoint(service.key.to_string()));
        };
        let target_port = ep
            .ports
            .get(&orig.port())
            .or_else(|| service.ports.get(&orig.port()))
            .copied()
            .unwrap_or(orig.port());
        let workload = ep.workload.clone();
        let Some(ip) = workload.addresses.first().copied() else {
            return Err(OutboundError::NoHealthyEndpoint(service.key.to_string()));
        };
        let dst = SocketAddr::new(ip, target_port);
        return Ok(match workload.protocol {
            TunnelProtocol::Hbone => {
                let mut identities: Vec<SpiffeId> = service
                    .subject_alt_names
                    .iter()
                    .filter_map(|s| SpiffeId::parse(s).ok())
                    .collect();
                identities.push(workload.identity().clone());
                identities.sort();
                identities.dedup();
                Route::Hbone {
                    waypoint: false,
                    dst: SocketAddr::new(ip, ambit_contract::ports::INBOUND_HBONE),
                    target: ConnectTarget::Addr(dst),
                    identities,
                    workload,
                    service: Some(service),
                }
            }
            TunnelProtocol::None => Route::Tcp {
                dst,
                workload: Some(workload),
                service: Some(service),
            },
        });
    }
    let Some(workload) = state.workload_by_addr(network, orig.ip()) else {
        return Ok(Route::Tcp {
            dst: orig,
            workload: None,
            service: None,
        });
    };
    if let Some(waypoint) = &workload.waypoint {
        let from_waypoint = waypoint_matches(inputs, waypoint, src);
        if !from_waypoint {
            return via_waypoint(inputs, waypoint, orig, None);
        }
    }
    Ok(match workload.protocol {
        TunnelProtocol::Hbone => Route::Hbone {
            waypoint: false,
            dst: SocketAddr::new(orig.ip(), ambit_contract::ports::INBOUND_HBONE),
            target: ConnectTarget::Addr(orig),
            identities: vec![workload.identity().clone()],
            workload,
            service: None,
        },
        TunnelProtocol::None => Route::Tcp {
            dst: orig,
            workload: Some(workload),
            service: None,
        },
    })
}

/// Resolves a waypoint to (its workload, the address to dial).
fn resolve_waypoint(
    inputs: &ProxyInputs,
    waypoint: &GatewayAddress,
) -> Option<(Arc<Workload>, SocketAddr)> {
    let state = &inputs.state;
    match &waypoint.destination {
        GatewayDestination::Address(addr) => {
            let w = state.workload_by_addr(&addr.network, addr.ip)?;
            Some((w, SocketAddr::new(addr.ip, waypoint.hbone_mtls_port)))
        }
        GatewayDestination::Hostname(host) => {
            let service = state.service_by_key(host)?;
            let endpoints = state.endpoints(&service);
            let ep = endpoints.choose(&mut rand::rng())?;
            let ip = ep.workload.addresses.first().copied()?;
            Some((
                ep.workload.clone(),
                SocketAddr::new(ip, waypoint.hbone_mtls_port),
            ))
        }
    }
}

fn waypoint_matches(inputs: &ProxyInputs, waypoint: &GatewayAddress, src: &Workload) -> bool {
    resolve_waypoint(inputs, waypoint).is_some_and(|(w, _)| w.uid == src.uid)
}

fn via_waypoint(
    inputs: &ProxyInputs,
    waypoint: &GatewayAddress,
    orig: SocketAddr,
    service: Option<Arc<Service>>,
) -> Result<Route, OutboundError> {
    let (workload, dst) = resolve_waypoint(inputs, waypoint)
        .ok_or_else(|| OutboundError::UnknownWaypoint(waypoint.destination.to_string()))?;
    Ok(Route::Hbone {
        waypoint: true,
        dst,
        target: ConnectTarget::Addr(orig),
        identities: vec![workload.identity().clone()],
        workload,
        service,
    })
}

fn labels_for(src: &Workload, route: &Route) -> TrafficLabels {
    let mut labels = TrafficLabels::new(Reporter::Source);
    observe::source(&mut labels, src);
    labels.source_principal = observe::intern_display(src.identity());
    match route {
        Route::Tcp {
            workload, service, ..
        } => {
            if let Some(w) = workload {
                observe::destination(&mut labels, w);
            }
            if let Some(s) = service {
                observe::service(&mut labels, s);
            }
        }
        Route::Hbone {
            workload,
            service,
            identities,
            ..
        } => {
            observe::destination(&mut labels, workload);
            if let Some(s) = service {
                observe::service(&mut labels, s);
            }
            if let Some(id) = identities.first() {
                labels.destination_principal = observe::intern_display(id);
            }
            labels.connection_security_policy = ConnectionSecurityPolicy::MutualTls;
        }
    }
    labels
}

#[cfg(test)]
mod task_size {
    /// Release: 640 B of future in a 768 B cell (8 B to spare); debug: 648 B.
    #[test]
    fn an_outbound_connection_task_stays_in_its_size_class() {
        let future = crate::proxy::tests::returned_size4(&super::handle);
        crate::proxy::tests::assert_task_fits("outbound::handle", future, 768, DEBUG_BUDGET);
    }

    /// Today's debug size plus the bytes the release cell has to spare.
    const DEBUG_BUDGET: usize = 656;
}
