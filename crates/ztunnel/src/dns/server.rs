//! Sockets and tasks of one pod's DNS proxy: binding the UDP+TCP pairs, the receive/accept
//! loops, and the per-query handler that ties classification, local answers and forwarding
//! together.
//!
//! Task ownership: [`DnsServer::serve`] owns one loop per socket in a `JoinSet`; each loop owns
//! its in-flight queries (UDP) or connections (TCP) in its own `JoinSet`. On drain the loops
//! stop receiving and accepting, let in-flight work finish (each query is bounded by
//! [`REQUEST_TIMEOUT`]), and `serve` returns. Dropping the `serve` future aborts everything.

use std::future::Future;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use ambit_netns::{SocketFactory, SocketOptions};
use hickory_proto::op::ResponseCode;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use super::message::{
    Action, Classified, MAX_MESSAGE, Request, classify, read_tcp_message, tcp_frame,
};
use super::resolve::resolve;
use super::{DnsContext, DnsError, DnsRequest, REQUEST_TIMEOUT, Transport};

/// Queries in flight per UDP socket before new ones are answered SERVFAIL right away: a pod
/// flooding unanswerable names must not pile up unbounded upstream sockets.
const MAX_UDP_IN_FLIGHT: usize = 512;

/// TCP connections per listener; further ones are closed at once.
const MAX_TCP_CONNECTIONS: usize = 128;

/// Pause after a failed `accept` (e.g. EMFILE) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How many kernel-chosen ports to try when binding port 0 before giving up on finding one
/// that is free for both UDP and TCP.
const PORT_ZERO_ATTEMPTS: usize = 16;

/// Bound, not yet serving, sockets. Plain std sockets, so binding needs no runtime.
#[derive(Debug)]
pub struct DnsListeners {
    bound: Vec<Bound>,
}

#[derive(Debug)]
struct Bound {
    addr: SocketAddr,
    udp: UdpSocket,
    tcp: TcpListener,
}

impl DnsListeners {
    /// The addresses actually bound (UDP and TCP share each one; port 0 is resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.bound.iter().map(|b| b.addr).collect()
    }
}

/// The DNS proxy of one pod.
#[derive(Debug)]
pub struct DnsServer;

impl DnsServer {
    /// Binds UDP and TCP on each address through the pod's socket factory, with
    /// `SO_REUSEPORT` so a new ztunnel can bind while the old one drains.
    ///
    /// IPv6 addresses are best effort (the pod's loopback may have no `::1`); an IPv4 failure
    /// is an error. Port 0 picks one port free for both protocols (tests).
    ///
    /// Bind specific addresses, not a wildcard: UDP answers then leave from the address the
    /// query was redirected to (127.0.0.1), which conntrack needs to undo the REDIRECT.
    pub fn bind(
        factory: &dyn SocketFactory,
        addrs: &[SocketAddr],
    ) -> Result<DnsListeners, DnsError> {
        let mut bound = Vec::new();
        for &addr in addrs {
            match bind_pair(factory, addr) {
                Ok(b) => bound.push(b),
                Err(e) if addr.is_ipv6() => {
                    tracing::warn!(target: "dns", %addr, error = %e, "skipping IPv6 DNS listener");
                }
                Err(e) => return Err(e),
            }
        }
        if bound.is_empty() {
            return Err(DnsError::NoAddresses);
        }
        Ok(DnsListeners { bound })
    }

    /// Serves until `drain` resolves (its output is ignored), then stops receiving and
    /// accepting, lets in-flight queries finish (each bounded by [`REQUEST_TIMEOUT`]) and
    /// returns. `drain` is dropped as soon as it resolves, so a caller whose drain should
    /// wait for in-flight queries keeps its own drain handle until `serve` returns; dropping
    /// the `serve` future aborts everything at once.
    pub async fn serve<D: Future>(listeners: DnsListeners, ctx: DnsContext, drain: D) {
        let ctx = Arc::new(ctx);
        let (stop_tx, stop) = watch::channel(false);
        let mut loops = JoinSet::new();
        for Bound { addr, udp, tcp } in listeners.bound {
            let udp = tokio::net::UdpSocket::from_std(udp);
            let tcp = tokio::net::TcpListener::from_std(tcp);
            match (udp, tcp) {
                (Ok(udp), Ok(tcp)) => {
                    loops.spawn(udp_loop(Arc::new(udp), ctx.clone(), stop.clone()));
                    loops.spawn(tcp_loop(tcp, ctx.clone(), stop.clone()));
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::error!(target: "dns", %addr, error = %e, "cannot serve DNS listener");
                }
            }
        }
        drop(stop);
        drain.await;
        // Receivers only fail when every loop is gone already.
        let _ = stop_tx.send(true);
        while loops.join_next().await.is_some() {}
    }
}

fn bind_pair(factory: &dyn SocketFactory, addr: SocketAddr) -> Result<Bound, DnsError> {
    let opts = SocketOptions {
        // Port sharing is for hand-off on the fixed port; on port 0 it would let us land on a
        // stranger's reuseport socket.
        reuse_port: addr.port() != 0,
        ..SocketOptions::default()
    };
    let bind_err = |addr, transport| {
        move |source| DnsError::Bind {
            addr,
            transport,
            source,
        }
    };
    let attempts = if addr.port() == 0 {
        PORT_ZERO_ATTEMPTS
    } else {
        1
    };
    let mut last = None;
    for _ in 0..attempts {
        let tcp = factory
            .new_tcp_listener(addr, &opts)
            .map_err(bind_err(addr, Transport::Tcp))?;
        let actual = match tcp.local_addr() {
            Ok(a) => a,
            Err(e) => {
                let source = ambit_netns::SocketError::Bind { addr, source: e };
                return Err(bind_err(addr, Transport::Tcp)(source));
            }
        };
        match factory.new_udp_socket(actual, &opts) {
            Ok(udp) => {
                return Ok(Bound {
                    addr: actual,
                    udp,
                    tcp,
                });
            }
            Err(e) => last = Some(bind_err(actual, Transport::Udp)(e)),
        }
    }
    Err(last.unwrap_or(DnsError::NoAddresses))
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    // An error means the sender is gone, which only happens when serve was dropped.
    let _ = stop.wait_for(|s| *s).await;
}

async fn udp_loop(
    sock: Arc<tokio::net::UdpSocket>,
    ctx: Arc<DnsContext>,
    mut stop: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut in_flight = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            received = sock.recv_from(&mut buf) => {
                let (n, peer) = match received {
                    Ok(r) => r,
                    Err(e) => {
                        // Transient per-datagram errors; the socket itself stays usable.
                        tracing::debug!(target: "dns", error = %e, "UDP receive failed");
                        continue;
                    }
                };
                let raw = buf[..n].to_vec();
                if in_flight.len() >= MAX_UDP_IN_FLIGHT {
                    if let Classified::Request(req) = classify(&raw) {
                        let _ = sock.send_to(&req.error(ResponseCode::ServFail), peer).await;
                    }
                    continue;
                }
                let (sock, ctx) = (sock.clone(), ctx.clone());
                in_flight.spawn(async move {
                    if let Some(answer) = handle(&ctx, &raw, Transport::Udp).await {
                        // The socket is bound to the address the query was sent to, so the
                        // answer leaves from it and conntrack can undo the REDIRECT.
                        if let Err(e) = sock.send_to(&answer, peer).await {
                            tracing::debug!(target: "dns", %peer, error = %e, "UDP send failed");
                        }
                    }
                });
            }
        }
    }
    while in_flight.join_next().await.is_some() {}
}

async fn tcp_loop(
    listener: tokio::net::TcpListener,
    ctx: Arc<DnsContext>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) if conns.len() >= MAX_TCP_CONNECTIONS => drop(stream),
                Ok((stream, _)) => {
                    conns.spawn(tcp_connection(stream, ctx.clone(), stop.clone()));
                }
                Err(e) => {
                    tracing::warn!(target: "dns", error = %e, "TCP accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
    while conns.join_next().await.is_some() {}
}

/// Serves length-prefixed messages in order until the client closes, takes longer than
/// [`REQUEST_TIMEOUT`] to send a message (idle time before it included), sends something
/// unanswerable, or the server drains.
async fn tcp_connection(
    mut stream: tokio::net::TcpStream,
    ctx: Arc<DnsContext>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let raw = tokio::select! {
            _ = stopped(&mut stop) => return,
            raw = timeout(REQUEST_TIMEOUT, read_tcp_message(&mut stream)) => match raw {
                Ok(Ok(raw)) => raw,
                _ => return,
            },
        };
        let Some(answer) = handle(&ctx, &raw, Transport::Tcp).await else {
            return;
        };
        let Some(framed) = tcp_frame(&answer) else {
            return;
        };
        if !matches!(
            timeout(REQUEST_TIMEOUT, stream.write_all(&framed)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
}

/// Answers one raw query: `None` means send nothing.
pub(crate) async fn handle(ctx: &DnsContext, raw: &[u8], transport: Transport) -> Option<Vec<u8>> {
    let Classified::Request(req) = classify(raw) else {
        tracing::trace!(target: "dns", len = raw.len(), "dropping unreadable packet");
        return None;
    };
    let client = (ctx.client)();
    let info = DnsRequest {
        query_type: req.query_type.clone(),
        protocol: transport,
        client: client.clone(),
    };
    ctx.metrics.request(&info);
    let limit = match transport {
        Transport::Udp => req.udp_limit(),
        Transport::Tcp => MAX_MESSAGE,
    };
    match &req.action {
        Action::FormErr => Some(req.error(ResponseCode::FormErr)),
        Action::Forward => Some(forward(ctx, &req, raw, transport, &info).await),
        Action::Local { name, family } => {
            let Some(client) = client else {
                tracing::debug!(target: "dns", query = %name, "unknown client workload");
                return Some(req.error(ResponseCode::ServFail));
            };
            let domain = name.to_ascii();
            let Some(answer) = resolve(&ctx.state, &ctx.name_config(), &client, &domain, *family)
            else {
                return Some(forward(ctx, &req, raw, transport, &info).await);
            };
            tracing::event!(
                target: "dns",
                tracing::Level::DEBUG,
                src.workload = %client.name,
                src.namespace = client.namespace(),
                query = %req.query_type,
                domain,
                result = "local",
                service = %answer.service,
                endpoints = ?answer.addrs,
                "answered locally"
            );
            Some(req.local_answer(name, &answer, limit))
        }
    }
}

/// Relays the raw query upstream; SERVFAIL when no server answered.
async fn forward(
    ctx: &DnsContext,
    req: &Request,
    raw: &[u8],
    transport: Transport,
    info: &DnsRequest,
) -> Vec<u8> {
    ctx.metrics.upstream_request(info);
    let start = Instant::now();
    let result = ctx
        .forwarder
        .exchange(ctx.socket_factory.as_ref(), raw, transport, req.udp_limit())
        .await;
    ctx.metrics.upstream_duration(info, start.elapsed());
    match result {
        Ok(answer) => {
            tracing::debug!(target: "dns", query = %req.query_type, result = "forwarded");
            answer
        }
        Err(e) => {
            ctx.metrics.upstream_failure(info);
            tracing::debug!(target: "dns", query = %req.query_type, error = %e, "upstream failed");
            req.error(ResponseCode::ServFail)
        }
    }
}
