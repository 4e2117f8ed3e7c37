//! The DNS proxy over real sockets on 127.0.0.1: local answers for mesh names, verbatim
//! forwarding of everything else to a fake upstream nameserver (UDP and TCP), TCP fallback on
//! truncation, error answers, robustness against malformed packets, metrics and drain.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
// Test helpers outside #[test] functions may unwrap too.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_model::identity::SpiffeId;
use ambit_model::names::{NamespacedHostname, WorkloadUid};
use ambit_model::{NetworkAddr, Service, Workload};
use ambit_netns::DefaultSocketFactory;
use ambit_ztunnel::dns::{
    DnsContext, DnsListeners, DnsMetrics, DnsRequest, DnsServer, Forwarder, Transport,
};
use ambit_ztunnel::state::ProxyState;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, PTR, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

// ---- fake upstream nameserver ---------------------------------------------------------

/// What the fake upstream saw: (question name, type, transport, id it received).
type Seen = Arc<Mutex<Vec<(String, RecordType, Transport, u16)>>>;

struct Upstream {
    addr: SocketAddr,
    seen: Seen,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn a_record(name: &Name, ip: [u8; 4]) -> Record {
    Record::from_rdata(
        name.clone(),
        60,
        RData::A(A::from(std::net::Ipv4Addr::from(ip))),
    )
}

/// Canned answers: SRV, TXT, PTR, an UPDATE acknowledgement, A for `external.example.`,
/// `big.example.` (truncated over UDP, 3 records over TCP) and `huge.example.` (truncated
/// over UDP, 60 records over TCP); NXDOMAIN otherwise.
fn upstream_answer(query: &Message, transport: Transport) -> Message {
    let mut resp = Message::new();
    resp.set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true);
    resp.add_queries(query.queries().iter().cloned());
    if query.op_code() == OpCode::Update {
        return resp;
    }
    let Some(q) = query.query() else {
        resp.set_response_code(ResponseCode::FormErr);
        return resp;
    };
    let name = q.name().clone();
    let host = name.to_ascii().to_ascii_lowercase();
    match (q.query_type(), host.as_str()) {
        (RecordType::SRV, _) => {
            let target = Name::from_ascii("svc.example.").unwrap();
            resp.add_answer(Record::from_rdata(
                name,
                60,
                RData::SRV(SRV::new(0, 5, 8080, target)),
            ));
        }
        (RecordType::TXT, _) => {
            resp.add_answer(Record::from_rdata(
                name,
                60,
                RData::TXT(TXT::new(vec!["hello from upstream".into()])),
            ));
        }
        (RecordType::PTR, _) => {
            let target = Name::from_ascii("host.example.").unwrap();
            resp.add_answer(Record::from_rdata(name, 60, RData::PTR(PTR(target))));
        }
        (RecordType::A, "external.example.") => {
            resp.add_answer(a_record(&name, [93, 184, 216, 34]));
        }
        (RecordType::A, "big.example." | "huge.example.") if transport == Transport::Udp => {
            resp.set_truncated(true);
        }
        (RecordType::A, "big.example.") => {
            for i in 1..=3 {
                resp.add_answer(a_record(&name, [192, 0, 2, i]));
            }
        }
        (RecordType::A, "huge.example.") => {
            for i in 1..=60 {
                resp.add_answer(a_record(&name, [198, 51, 100, i]));
            }
        }
        _ => {
            resp.set_response_code(ResponseCode::NXDomain);
        }
    }
    resp
}

fn record_seen(seen: &Seen, query: &Message, transport: Transport) {
    let (name, ty) = query
        .query()
        .map(|q| (q.name().to_ascii(), q.query_type()))
        .unwrap_or((String::new(), RecordType::NULL));
    seen.lock().unwrap().push((name, ty, transport, query.id()));
}

/// Binds UDP and TCP on one 127.0.0.1 port.
async fn bind_pair() -> (UdpSocket, TcpListener) {
    for _ in 0..16 {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        if let Ok(udp) = UdpSocket::bind(tcp.local_addr().unwrap()).await {
            return (udp, tcp);
        }
    }
    panic!("no port free for both UDP and TCP");
}

async fn start_upstream() -> Upstream {
    let (udp, tcp) = bind_pair().await;
    let addr = tcp.local_addr().unwrap();
    let seen = Seen::default();
    let udp_seen = seen.clone();
    let udp_task = tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        loop {
            let (n, peer) = udp.recv_from(&mut buf).await.unwrap();
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            record_seen(&udp_seen, &query, Transport::Udp);
            let resp = upstream_answer(&query, Transport::Udp).to_vec().unwrap();
            udp.send_to(&resp, peer).await.unwrap();
        }
    });
    let tcp_seen = seen.clone();
    let tcp_task = tokio::spawn(async move {
        loop {
            let (mut stream, _) = tcp.accept().await.unwrap();
            let seen = tcp_seen.clone();
            tokio::spawn(async move {
                while let Ok(len) = stream.read_u16().await {
                    let mut buf = vec![0u8; usize::from(len)];
                    stream.read_exact(&mut buf).await.unwrap();
                    let query = Message::from_vec(&buf).unwrap();
                    record_seen(&seen, &query, Transport::Tcp);
                    let resp = upstream_answer(&query, Transport::Tcp).to_vec().unwrap();
                    stream.write_u16(resp.len() as u16).await.unwrap();
                    stream.write_all(&resp).await.unwrap();
                }
            });
        }
    });
    Upstream {
        addr,
        seen,
        tasks: vec![udp_task, tcp_task],
    }
}

// ---- the proxy under test -------------------------------------------------------------

#[derive(Default)]
struct CountingMetrics {
    counts: Mutex<HashMap<(&'static str, String, Transport), u64>>,
    labels: Mutex<Vec<(String, String)>>,
}

impl CountingMetrics {
    fn bump(&self, kind: &'static str, req: &DnsRequest) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry((kind, req.query_type.clone(), req.protocol))
            .or_default() += 1;
        let l = req.labels();
        self.labels.lock().unwrap().push((
            l.source_canonical_service.to_string(),
            l.source_canonical_revision.to_string(),
        ));
    }

    fn get(&self, kind: &'static str, ty: &str, protocol: Transport) -> u64 {
        let key = (kind, ty.to_string(), protocol);
        self.counts.lock().unwrap().get(&key).copied().unwrap_or(0)
    }
}

impl DnsMetrics for CountingMetrics {
    fn request(&self, req: &DnsRequest) {
        self.bump("request", req);
    }
    fn upstream_request(&self, req: &DnsRequest) {
        self.bump("upstream", req);
    }
    fn upstream_failure(&self, req: &DnsRequest) {
        self.bump("failure", req);
    }
    fn upstream_duration(&self, req: &DnsRequest, _: Duration) {
        self.bump("duration", req);
    }
}

fn client_workload() -> Workload {
    let id = SpiffeId::new("cluster.local", "default", "default").unwrap();
    let mut w = Workload::new(WorkloadUid::new("client").unwrap(), "client", id);
    w.addresses = vec!["10.244.0.9".parse().unwrap()];
    w.canonical_name = "client-app".into();
    w.canonical_revision = "v1".into();
    w
}

fn mesh_state() -> Arc<ProxyState> {
    let state = ProxyState::new();
    let svc = |ns: &str, host: &str, vips: &[&str]| {
        let mut s = Service::new(host, NamespacedHostname::new(ns, host).unwrap());
        s.vips = vips
            .iter()
            .map(|ip| NetworkAddr::new("", ip.parse().unwrap()))
            .collect();
        s
    };
    state.replace_local(
        vec![client_workload()],
        vec![
            svc("default", "svc1.default.svc.cluster.local", &["10.0.0.1"]),
            svc(
                "default",
                "remote.default.svc.cluster.local",
                &["10.0.0.2", "10.0.0.3"],
            ),
        ],
        vec![],
    );
    Arc::new(state)
}

struct Proxy {
    addr: SocketAddr,
    metrics: Arc<CountingMetrics>,
    drain: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Drains and checks that `serve` returns.
    async fn shutdown(mut self) {
        let _ = self.drain.take().unwrap().send(());
        timeout(WAIT, self.task.take().unwrap())
            .await
            .unwrap()
            .unwrap();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

async fn start_proxy(upstreams: Vec<SocketAddr>, client: Option<Workload>) -> Proxy {
    let listeners: DnsListeners =
        DnsServer::bind(&DefaultSocketFactory, &["127.0.0.1:0".parse().unwrap()]).unwrap();
    let addr = listeners.local_addrs()[0];
    let metrics = Arc::new(CountingMetrics::default());
    let client = client.map(Arc::new);
    let ctx = DnsContext {
        state: mesh_state(),
        client: Arc::new(move || client.clone()),
        cluster_domain: "cluster.local".into(),
        prefered_service_namespace: None,
        ipv6_enabled: true,
        forwarder: Forwarder::new(upstreams).with_timeout(Duration::from_secs(3)),
        socket_factory: Arc::new(DefaultSocketFactory),
        metrics: metrics.clone(),
    };
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(DnsServer::serve(listeners, ctx, async move {
        let _ = rx.await;
    }));
    Proxy {
        addr,
        metrics,
        drain: Some(tx),
        task: Some(task),
    }
}

// ---- client side ----------------------------------------------------------------------

fn query(name: &str, ty: RecordType) -> Message {
    let mut m = Message::new();
    m.set_id(0xabcd).set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), ty));
    m
}

fn update(zone: &str) -> Message {
    let mut m = query(zone, RecordType::SOA);
    m.set_op_code(OpCode::Update).set_recursion_desired(false);
    let name = Name::from_ascii(format!("new.{zone}")).unwrap();
    m.add_name_server(a_record(&name, [192, 0, 2, 77]));
    m
}

/// A connected UDP socket: it only accepts datagrams from `server`, so any answer proves it
/// came from the address the query was sent to.
async fn udp_client(server: SocketAddr) -> UdpSocket {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.connect(server).await.unwrap();
    sock
}

async fn udp_recv(sock: &UdpSocket) -> Message {
    let mut buf = vec![0u8; 65535];
    let n = timeout(WAIT, sock.recv(&mut buf))
        .await
        .expect("UDP answer")
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

async fn tcp_send(stream: &mut TcpStream, raw: &[u8]) {
    stream.write_u16(raw.len() as u16).await.unwrap();
    stream.write_all(raw).await.unwrap();
}

async fn tcp_recv(stream: &mut TcpStream) -> Message {
    let len = timeout(WAIT, stream.read_u16())
        .await
        .expect("TCP answer")
        .unwrap();
    let mut buf = vec![0u8; usize::from(len)];
    stream.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

async fn ask(server: SocketAddr, transport: Transport, msg: &Message) -> Message {
    let raw = msg.to_vec().unwrap();
    match transport {
        Transport::Udp => {
            let sock = udp_client(server).await;
            sock.send(&raw).await.unwrap();
            udp_recv(&sock).await
        }
        Transport::Tcp => {
            let mut stream = TcpStream::connect(server).await.unwrap();
            tcp_send(&mut stream, &raw).await;
            tcp_recv(&mut stream).await
        }
    }
}

/// Answer records as sorted `name type data` lines.
fn answers(m: &Message) -> Vec<String> {
    let mut v: Vec<String> = m
        .answers()
        .iter()
        .map(|r| format!("{} {} {}", r.name(), r.record_type(), r.data()))
        .collect();
    v.sort();
    v
}

const BOTH: [Transport; 2] = [Transport::Udp, Transport::Tcp];

// ---- tests ----------------------------------------------------------------------------

#[tokio::test]
async fn answers_mesh_names_locally() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(vec![upstream.addr], Some(client_workload())).await;
    let cases: &[(&str, RecordType, &[&str])] = &[
        ("svc1.", RecordType::A, &["svc1. A 10.0.0.1"]),
        (
            "svc1.default.svc.cluster.local.",
            RecordType::A,
            &["svc1.default.svc.cluster.local. A 10.0.0.1"],
        ),
        (
            "remote.default.",
            RecordType::A,
            &["remote.default. A 10.0.0.2", "remote.default. A 10.0.0.3"],
        ),
        (
            "remote.default.default.svc.cluster.local.",
            RecordType::A,
            &[
                "remote.default. A 10.0.0.2",
                "remote.default. A 10.0.0.3",
                "remote.default.default.svc.cluster.local. CNAME remote.default.",
            ],
        ),
        // Known name, no IPv6 VIP: NOERROR and no records, not NXDOMAIN.
        ("svc1.", RecordType::AAAA, &[]),
    ];
    for transport in BOTH {
        for (name, ty, want) in cases {
            let resp = ask(proxy.addr, transport, &query(name, *ty)).await;
            let what = format!("{name} {ty} over {transport}");
            assert_eq!(resp.id(), 0xabcd, "{what}");
            assert_eq!(resp.response_code(), ResponseCode::NoError, "{what}");
            assert!(resp.authoritative(), "{what}");
            assert_eq!(answers(&resp), *want, "{what}");
            assert!(resp.answers().iter().all(|r| r.ttl() == 30), "{what}");
            assert!(proxy.metrics.get("request", &ty.to_string(), transport) > 0);
        }
    }
    assert!(
        upstream.seen.lock().unwrap().is_empty(),
        "local names must not go upstream"
    );
    assert_eq!(proxy.metrics.get("upstream", "A", Transport::Udp), 0);
    let labels = proxy.metrics.labels.lock().unwrap().clone();
    assert!(
        labels
            .iter()
            .all(|l| l == &("client-app".to_string(), "v1".to_string()))
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn forwards_everything_else_verbatim() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(vec![upstream.addr], Some(client_workload())).await;
    struct Case {
        msg: Message,
        ty: &'static str,
        rcode: ResponseCode,
        want: &'static [&'static str],
    }
    let cases = [
        Case {
            msg: query("_http._tcp.svc.example.", RecordType::SRV),
            ty: "SRV",
            rcode: ResponseCode::NoError,
            want: &["_http._tcp.svc.example. SRV 0 5 8080 svc.example."],
        },
        Case {
            msg: query("9.0.244.10.in-addr.arpa.", RecordType::PTR),
            ty: "PTR",
            rcode: ResponseCode::NoError,
            want: &["9.0.244.10.in-addr.arpa. PTR host.example."],
        },
        Case {
            msg: query("txt.example.", RecordType::TXT),
            ty: "TXT",
            rcode: ResponseCode::NoError,
            want: &["txt.example. TXT hello from upstream"],
        },
        Case {
            msg: update("zone.example."),
            ty: "SOA",
            rcode: ResponseCode::NoError,
            want: &[],
        },
        Case {
            msg: query("external.example.", RecordType::A),
            ty: "A",
            rcode: ResponseCode::NoError,
            want: &["external.example. A 93.184.216.34"],
        },
        Case {
            msg: query("nothing.example.", RecordType::A),
            ty: "A",
            rcode: ResponseCode::NXDomain,
            want: &[],
        },
    ];
    for transport in BOTH {
        for c in &cases {
            let before = upstream.seen.lock().unwrap().len();
            let resp = ask(proxy.addr, transport, &c.msg).await;
            let what = format!("{:?} {} over {transport}", c.msg.op_code(), c.ty);
            assert_eq!(resp.id(), 0xabcd, "{what}: the client's id is restored");
            assert_eq!(resp.op_code(), c.msg.op_code(), "{what}");
            assert_eq!(resp.response_code(), c.rcode, "{what}");
            assert!(!resp.authoritative(), "{what}: relayed, not ours");
            assert_eq!(answers(&resp), c.want, "{what}");
            let seen = upstream.seen.lock().unwrap().clone();
            assert_eq!(
                seen.len(),
                before + 1,
                "{what}: exactly one upstream exchange"
            );
            let (name, _, upstream_transport, _) = &seen[before];
            assert_eq!(name, &c.msg.queries()[0].name().to_ascii(), "{what}");
            assert_eq!(
                *upstream_transport, transport,
                "{what}: same transport upstream"
            );
            assert!(proxy.metrics.get("upstream", c.ty, transport) > 0, "{what}");
        }
    }
    // Upstream ids are fresh per exchange, never the client's.
    let ids: Vec<u16> = upstream.seen.lock().unwrap().iter().map(|s| s.3).collect();
    assert!(ids.iter().any(|id| *id != 0xabcd));
    assert_eq!(proxy.metrics.get("request", "SRV", Transport::Udp), 1);
    assert_eq!(proxy.metrics.get("upstream", "SRV", Transport::Tcp), 1);
    assert_eq!(proxy.metrics.get("duration", "PTR", Transport::Udp), 1);
    assert_eq!(proxy.metrics.get("failure", "TXT", Transport::Udp), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn truncated_upstream_answers_fall_back_to_tcp() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(vec![upstream.addr], Some(client_workload())).await;

    // Fits in 512 bytes: the proxy fetches it over TCP and answers the UDP client in full.
    let resp = ask(
        proxy.addr,
        Transport::Udp,
        &query("big.example.", RecordType::A),
    )
    .await;
    assert!(!resp.truncated());
    assert_eq!(resp.answers().len(), 3);
    let transports: Vec<Transport> = upstream.seen.lock().unwrap().iter().map(|s| s.2).collect();
    assert_eq!(transports, [Transport::Udp, Transport::Tcp]);

    // Too big for the UDP client: it gets TC, asks again over TCP and gets everything.
    let resp = ask(
        proxy.addr,
        Transport::Udp,
        &query("huge.example.", RecordType::A),
    )
    .await;
    assert!(resp.truncated());
    let resp = ask(
        proxy.addr,
        Transport::Tcp,
        &query("huge.example.", RecordType::A),
    )
    .await;
    assert!(!resp.truncated());
    assert_eq!(resp.answers().len(), 60);
    proxy.shutdown().await;
}

#[tokio::test]
async fn error_answers() {
    let upstream = start_upstream().await;
    // A port nobody listens on: connected UDP sees ICMP port-unreachable at once.
    let dead = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let unknown_client = start_proxy(vec![upstream.addr], None).await;
    let dead_upstream = start_proxy(vec![dead], Some(client_workload())).await;
    let cases: &[(&Proxy, &str, RecordType, ResponseCode)] = &[
        // Without the pod's workload the search list is unknown.
        (
            &unknown_client,
            "svc1.",
            RecordType::A,
            ResponseCode::ServFail,
        ),
        // Forwarding does not depend on who asks.
        (
            &unknown_client,
            "txt.example.",
            RecordType::TXT,
            ResponseCode::NoError,
        ),
        (
            &dead_upstream,
            "external.example.",
            RecordType::A,
            ResponseCode::ServFail,
        ),
        (
            &dead_upstream,
            "svc.example.",
            RecordType::SRV,
            ResponseCode::ServFail,
        ),
        (
            &dead_upstream,
            "svc1.",
            RecordType::A,
            ResponseCode::NoError,
        ),
    ];
    for transport in BOTH {
        for (proxy, name, ty, rcode) in cases {
            let resp = ask(proxy.addr, transport, &query(name, *ty)).await;
            assert_eq!(resp.id(), 0xabcd);
            assert_eq!(resp.response_code(), *rcode, "{name} {ty} over {transport}");
        }
    }
    assert_eq!(dead_upstream.metrics.get("failure", "A", Transport::Udp), 1);
    assert_eq!(
        dead_upstream.metrics.get("failure", "SRV", Transport::Tcp),
        1
    );
    unknown_client.shutdown().await;
    dead_upstream.shutdown().await;
}

#[tokio::test]
async fn malformed_packets_do_not_stop_the_server() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(vec![upstream.addr], Some(client_workload())).await;
    let good = query("svc1.", RecordType::A);
    let mut good_raw = good.to_vec().unwrap();
    // A header that promises a question and carries none.
    let mut no_question = good_raw[..12].to_vec();
    no_question[0..2].copy_from_slice(&0x0bad_u16.to_be_bytes());
    let mut response = good.clone();
    response
        .set_message_type(MessageType::Response)
        .set_id(0x0eee);
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![1, 2, 3],
        no_question.clone(),
        response.to_vec().unwrap(),
        (0..=255).collect(),
    ];

    let sock = udp_client(proxy.addr).await;
    for g in &garbage {
        sock.send(g).await.unwrap();
    }
    good_raw[0..2].copy_from_slice(&0x600d_u16.to_be_bytes());
    sock.send(&good_raw).await.unwrap();
    // Replies may come in any order: one FORMERR for the readable header, one answer, and
    // whatever the 256-byte blob gets (it has a readable header too).
    let mut by_id = HashMap::new();
    while !by_id.contains_key(&0x600d) || !by_id.contains_key(&0x0bad) {
        let m = udp_recv(&sock).await;
        by_id.insert(m.id(), m);
    }
    assert_eq!(by_id[&0x0bad].response_code(), ResponseCode::FormErr);
    assert_eq!(answers(&by_id[&0x600d]), ["svc1. A 10.0.0.1"]);
    assert!(!by_id.contains_key(&0x0eee), "responses are never answered");

    // TCP: a malformed frame gets FORMERR; a zero-length frame closes the connection; a new
    // connection still works.
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    tcp_send(&mut stream, &no_question).await;
    assert_eq!(
        tcp_recv(&mut stream).await.response_code(),
        ResponseCode::FormErr
    );
    tcp_send(&mut stream, &[]).await;
    let mut rest = Vec::new();
    timeout(WAIT, stream.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    let resp = ask(proxy.addr, Transport::Tcp, &good).await;
    assert_eq!(answers(&resp), ["svc1. A 10.0.0.1"]);
    proxy.shutdown().await;
}

#[tokio::test]
async fn pipelined_tcp_queries_on_one_connection() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(vec![upstream.addr], Some(client_workload())).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let names = ["svc1.", "external.example.", "remote.default."];
    for (i, name) in names.iter().enumerate() {
        let mut q = query(name, RecordType::A);
        q.set_id(i as u16);
        tcp_send(&mut stream, &q.to_vec().unwrap()).await;
    }
    for (i, name) in names.iter().enumerate() {
        let resp = tcp_recv(&mut stream).await;
        assert_eq!(resp.id(), i as u16, "{name}");
        assert_eq!(resp.response_code(), ResponseCode::NoError, "{name}");
        assert!(!resp.answers().is_empty(), "{name}");
    }
    proxy.shutdown().await;
}

#[test]
fn bind_tolerates_missing_ipv6_but_not_ipv4() {
    let addrs: Vec<SocketAddr> = vec!["127.0.0.1:0".parse().unwrap(), "[::1]:0".parse().unwrap()];
    let listeners = DnsServer::bind(&DefaultSocketFactory, &addrs).unwrap();
    let bound = listeners.local_addrs();
    assert!(bound[0].ip() == IpAddr::from([127, 0, 0, 1]) && bound[0].port() != 0);
    assert!(bound.len() <= 2);

    // An IPv4 address that is not on this host must fail the bind.
    let missing: Vec<SocketAddr> = vec!["192.0.2.1:0".parse().unwrap()];
    assert!(DnsServer::bind(&DefaultSocketFactory, &missing).is_err());
    assert!(DnsServer::bind(&DefaultSocketFactory, &[]).is_err());

    let v4: SocketAddr = "127.0.0.1:15053".parse().unwrap();
    let v6: SocketAddr = "[::1]:15053".parse().unwrap();
    assert_eq!(ambit_ztunnel::dns::listen_addrs(false), [v4]);
    assert_eq!(ambit_ztunnel::dns::listen_addrs(true), [v4, v6]);
}
