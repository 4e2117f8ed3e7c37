//! Forwarding to the nameservers of ztunnel's own `resolv.conf` (§7; forwarding every type
//! and opcode goes beyond upstream).
//!
//! The query is relayed byte for byte except its id: each upstream exchange uses a fresh
//! random id (and, over UDP, a fresh socket with a kernel-chosen random source port), so an
//! off-path attacker has to guess both; the client's id is restored on the answer. Sockets are
//! created through the pod's [`SocketFactory`] so they live in the pod netns and carry the
//! ztunnel mark.
//!
//! UDP clients are forwarded over UDP; a truncated (TC) answer is retried over TCP and the
//! full answer relayed when it fits the client's UDP limit, else the truncated one (the
//! client then asks us over TCP). TCP clients are forwarded over TCP.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ambit_netns::{SocketFactory, SocketOptions, connect_tcp};
use tokio::io::AsyncWriteExt;
use tokio::time::{Instant, timeout_at};

use super::message::{
    MAX_MESSAGE, is_response, is_truncated, read_id, read_tcp_message, set_id, tcp_frame,
};
use super::{DnsError, REQUEST_TIMEOUT, Transport};

/// The port nameservers listen on (resolv.conf has no port syntax).
const NAMESERVER_PORT: u16 = 53;

/// Upstream UDP answers are read into a buffer at least this big: the upstream server sizes
/// its answer by the EDNS size we relay from the client, and never beyond 64 KiB.
const MIN_UDP_RECV: usize = 4096;

/// Upstream nameservers, tried in order within one overall deadline per query.
#[derive(Debug, Clone)]
pub struct Forwarder {
    servers: Arc<[SocketAddr]>,
    timeout: Duration,
}

impl Forwarder {
    /// Forwards to `servers` with the default 5 s deadline per query.
    pub fn new(servers: Vec<SocketAddr>) -> Self {
        Self {
            servers: servers.into(),
            timeout: REQUEST_TIMEOUT,
        }
    }

    /// Changes the per-query deadline (shared by all servers tried).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Reads the `nameserver` lines of a resolv.conf (`/etc/resolv.conf` of ztunnel's own
    /// netns in production). Search domains and options are ignored: the pod's resolver already
    /// applied its own search list, and ours must not leak into forwarded names.
    pub fn from_resolv_conf(path: &Path) -> Result<Self, DnsError> {
        let text = std::fs::read_to_string(path).map_err(|source| DnsError::ResolvConf {
            path: path.to_path_buf(),
            source,
        })?;
        let servers = parse_resolv_conf(&text);
        if servers.is_empty() {
            return Err(DnsError::NoNameservers {
                path: path.to_path_buf(),
            });
        }
        Ok(Self::new(servers))
    }

    pub fn servers(&self) -> &[SocketAddr] {
        &self.servers
    }

    /// Sends `query` upstream and returns the answer with the query's own id, or the error of
    /// the last server tried.
    ///
    /// Each server gets an equal share of what is left of the deadline, so a dead first
    /// server still leaves time for the next one.
    pub async fn exchange(
        &self,
        factory: &dyn SocketFactory,
        query: &[u8],
        transport: Transport,
        udp_limit: usize,
    ) -> Result<Vec<u8>, DnsError> {
        let client_id = read_id(query).ok_or(DnsError::QueryTooShort { len: query.len() })?;
        let deadline = Instant::now() + self.timeout;
        let mut last = DnsError::NoUpstream;
        for (i, &server) in self.servers.iter().enumerate() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let left = u32::try_from(self.servers.len() - i).unwrap_or(u32::MAX);
            let attempt_deadline = now + (deadline - now) / left;
            let attempt = exchange_one(factory, server, query, transport, udp_limit);
            match timeout_at(attempt_deadline, attempt).await {
                Ok(Ok(mut answer)) => {
                    set_id(&mut answer, client_id);
                    return Ok(answer);
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = DnsError::UpstreamTimeout { server, transport },
            }
            tracing::debug!(target: "dns", %server, error = %last, "upstream attempt failed");
        }
        Err(last)
    }
}

/// The nameservers listed in resolv.conf text. Accepts `nameserver IP` (port 53), numeric
/// IPv6 scopes (`fe80::1%2`) and, as an extension for tests and local setups, `IP:port` /
/// `[IPv6]:port`. Unparsable lines are skipped.
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
                .and_then(parse_nameserver)
        })
        .collect()
}

fn parse_nameserver(word: &str) -> Option<SocketAddr> {
    if let Ok(addr) = word.parse::<SocketAddr>() {
        return Some(addr);
    }
    if let Ok(ip) = word.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, NAMESERVER_PORT));
    }
    let (ip, scope) = word.split_once('%')?;
    let ip: Ipv6Addr = ip.parse().ok()?;
    let scope: u32 = scope.parse().ok()?;
    Some(SocketAddr::V6(SocketAddrV6::new(
        ip,
        NAMESERVER_PORT,
        0,
        scope,
    )))
}

async fn exchange_one(
    factory: &dyn SocketFactory,
    server: SocketAddr,
    query: &[u8],
    transport: Transport,
    udp_limit: usize,
) -> Result<Vec<u8>, DnsError> {
    let mut query = query.to_vec();
    let id: u16 = rand::random();
    set_id(&mut query, id);
    if transport == Transport::Tcp {
        return tcp_exchange(factory, server, &query, id).await;
    }
    let answer = udp_exchange(factory, server, &query, id, udp_limit).await?;
    if !is_truncated(&answer) {
        return Ok(answer);
    }
    // The full answer only helps the client if it fits its UDP limit; otherwise the
    // truncated one makes it ask again over TCP, which we then forward over TCP.
    match tcp_exchange(factory, server, &query, id).await {
        Ok(full) if full.len() <= udp_limit => Ok(full),
        Ok(_) => Ok(answer),
        Err(e) => {
            tracing::debug!(target: "dns", %server, error = %e, "TCP retry after TC failed");
            Ok(answer)
        }
    }
}

fn upstream_opts(nodelay: bool) -> SocketOptions {
    SocketOptions {
        // A client socket: never share its port.
        reuse_address: false,
        nodelay,
        ..SocketOptions::default()
    }
}

async fn udp_exchange(
    factory: &dyn SocketFactory,
    server: SocketAddr,
    query: &[u8],
    id: u16,
    udp_limit: usize,
) -> Result<Vec<u8>, DnsError> {
    let io_err = |source| DnsError::UpstreamIo {
        server,
        transport: Transport::Udp,
        source,
    };
    let local = match server {
        SocketAddr::V4(_) => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
        SocketAddr::V6(_) => SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0),
    };
    let sock = factory
        .new_udp_socket(local, &upstream_opts(false))
        .map_err(|source| DnsError::UpstreamSocket { server, source })?;
    let sock = tokio::net::UdpSocket::from_std(sock).map_err(io_err)?;
    // Connected: the kernel drops datagrams from anyone but the server, and reports ICMP
    // port-unreachable as an error instead of leaving us waiting for the deadline.
    sock.connect(server).await.map_err(io_err)?;
    sock.send(query).await.map_err(io_err)?;
    let mut buf = vec![0u8; udp_limit.clamp(MIN_UDP_RECV, MAX_MESSAGE)];
    loop {
        let n = sock.recv(&mut buf).await.map_err(io_err)?;
        let answer = &buf[..n];
        // A stray or spoofed datagram does not end the exchange; the deadline does.
        if read_id(answer) == Some(id) && is_response(answer) {
            return Ok(answer.to_vec());
        }
    }
}

async fn tcp_exchange(
    factory: &dyn SocketFactory,
    server: SocketAddr,
    query: &[u8],
    id: u16,
) -> Result<Vec<u8>, DnsError> {
    let io_err = |source| DnsError::UpstreamIo {
        server,
        transport: Transport::Tcp,
        source,
    };
    let framed = tcp_frame(query).ok_or(DnsError::QueryTooLarge { len: query.len() })?;
    let mut stream = connect_tcp(factory, server, None, &upstream_opts(true))
        .await
        .map_err(|source| DnsError::UpstreamSocket { server, source })?;
    stream.write_all(&framed).await.map_err(io_err)?;
    loop {
        let answer = read_tcp_message(&mut stream).await.map_err(io_err)?;
        // Our connection carries one query; anything else is skipped until the deadline.
        if read_id(&answer) == Some(id) && is_response(&answer) {
            return Ok(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_table() {
        let text = "\
# comment
search default.svc.cluster.local svc.cluster.local cluster.local
options ndots:5
nameserver 10.96.0.10
nameserver   fd00::10   # trailing comment
nameserver fe80::1%3
nameserver fe80::1%eth0
nameserver 127.0.0.1:5353
nameserver [::1]:5353
nameserver not-an-ip
nameserver
;nameserver 9.9.9.9
 nameserver 1.1.1.1
";
        let want: Vec<SocketAddr> = vec![
            "10.96.0.10:53".parse().unwrap(),
            "[fd00::10]:53".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 53, 0, 3)),
            "127.0.0.1:5353".parse().unwrap(),
            "[::1]:5353".parse().unwrap(),
            "1.1.1.1:53".parse().unwrap(),
        ];
        assert_eq!(parse_resolv_conf(text), want);
    }

    #[test]
    fn resolv_conf_file_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert!(matches!(
            Forwarder::from_resolv_conf(&missing),
            Err(DnsError::ResolvConf { .. })
        ));
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "search x\n").unwrap();
        assert!(matches!(
            Forwarder::from_resolv_conf(&empty),
            Err(DnsError::NoNameservers { .. })
        ));
        let ok = dir.path().join("ok");
        std::fs::write(&ok, "nameserver 10.0.0.1\n").unwrap();
        let f = Forwarder::from_resolv_conf(&ok).unwrap();
        assert_eq!(f.servers(), ["10.0.0.1:53".parse::<SocketAddr>().unwrap()]);
    }
}
