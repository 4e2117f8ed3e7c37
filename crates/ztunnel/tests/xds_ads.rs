//! Workload xDS over the wire: the control plane's delta ADS server (`ambit_control::xds`)
//! behind its real TLS gRPC server, talked to by a raw protocol client and by ztunnel's
//! `XdsClient` feeding a `ProxyState`, and what waits for that state to sync (the in-pod
//! manager's ZDS connection).

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ambit_control::xds::{Snapshot, TokenAuthorizer, XdsPeer, XdsServer};
use ambit_model::authz::{Action, Scope};
use ambit_model::{
    Authorization, NamespacedHostname, PolicyKey, Service, SpiffeId, Workload, WorkloadUid,
};
use ambit_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use ambit_proto::prost::Message;
use ambit_proto::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, rpc, security, workload};
use ambit_testkit::eventually;
use ambit_tls::LocalCa;
use ambit_ztunnel::config::AuthToken;
use ambit_ztunnel::identity::{CertManager, CertProvider, IdentityError};
use ambit_ztunnel::inpod::InpodManager;
use ambit_ztunnel::proxy::ConnectionTracker;
use ambit_ztunnel::readiness::Ready;
use ambit_ztunnel::state::ProxyState;
use ambit_ztunnel::telemetry::{Exposition, Metrics};
use ambit_ztunnel::xds::{Backoff, XdsClient, XdsClientConfig};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

const TOKEN: &str = "node1-token";
const DEADLINE: Duration = Duration::from_secs(20);

// ---- model fixtures -----------------------------------------------------------------------

fn uid(name: &str) -> String {
    format!("Kubernetes//v1/Pod/default/{name}")
}

fn workload(name: &str, node: &str) -> Workload {
    let mut w = Workload::new(
        WorkloadUid::new(uid(name)).unwrap(),
        name,
        SpiffeId::parse(&format!("spiffe://cluster.local/ns/default/sa/{name}")).unwrap(),
    );
    w.addresses = vec!["10.0.0.1".parse().unwrap()];
    w.node = node.into();
    w
}

fn service(host: &str) -> Service {
    Service::new(host, NamespacedHostname::new("default", host).unwrap())
}

fn policy(name: &str) -> Authorization {
    Authorization {
        key: PolicyKey::new("default", name).unwrap(),
        scope: Scope::Namespace,
        action: Action::Deny,
        dry_run: false,
        rules: vec![],
    }
}

/// A snapshot of `workloads` (name, node), `services`, `policies`, plus workloads whose
/// address is 5 bytes long (refused by the client).
fn snapshot(
    workloads: &[(&str, &str)],
    services: &[&str],
    policies: &[&str],
    invalid: &[&str],
) -> Snapshot {
    let w: Vec<Workload> = workloads
        .iter()
        .map(|(n, node)| workload(n, node))
        .collect();
    let s: Vec<Service> = services.iter().map(|h| service(h)).collect();
    let p: Vec<Authorization> = policies.iter().map(|n| policy(n)).collect();
    let mut snap = Snapshot::from_model(&w, &s, &p);
    for name in invalid {
        let mut bad = workload::Workload::from(&workload(name, "bad"));
        bad.addresses = vec![vec![1, 2, 3, 4, 5]];
        let address = workload::Address {
            r#type: Some(workload::address::Type::Workload(bad)),
        };
        snap.insert_message(uid(name), &address);
    }
    snap
}

// ---- control plane ------------------------------------------------------------------------

/// The xDS server behind `serve_tls`, on a fixed address so it can be restarted there.
struct ControlPlane {
    xds: XdsServer,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl ControlPlane {
    async fn start(ca: &LocalCa, addr: SocketAddr, snapshot: Snapshot) -> Self {
        let tokens = HashMap::from([(TOKEN.to_string(), XdsPeer::named("node1"))]);
        let xds = XdsServer::new(Arc::new(TokenAuthorizer::new(tokens)));
        xds.update(snapshot);
        let cert = ca
            .server_cert_for_hostnames(&["localhost", "127.0.0.1"])
            .unwrap();
        let tls = Arc::new(ambit_tls::server_config_plain(&cert).unwrap());
        // A restart rebinds the port the previous server just released (its accept task is
        // aborted, not joined), so retry briefly.
        let listener = within("the port", async {
            loop {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => break l,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        })
        .await;
        let addr = listener.local_addr().unwrap();
        let routes = tonic::service::Routes::new(xds.service());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            ambit_control::grpc::serve_tls(listener, tls, routes, shutdown)
                .await
                .unwrap();
        });
        Self {
            xds,
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// Ends the streams, then the server; returns once the port is free again.
    async fn stop(mut self) -> SocketAddr {
        self.xds.shutdown();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DEADLINE, &mut self.task)
            .await
            .expect("server stops")
            .unwrap();
        self.addr
    }

    fn channel(&self, ca: &LocalCa) -> Channel {
        channel(ca, self.addr)
    }
}

fn channel(ca: &LocalCa, addr: SocketAddr) -> Channel {
    ambit_ztunnel::grpc::channel(&format!("https://{addr}"), ca.root_pem(), None).unwrap()
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

// ---- raw protocol client ------------------------------------------------------------------

struct RawStream {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl RawStream {
    async fn open(
        channel: Channel,
        token: Option<&str>,
        initial: Vec<DeltaDiscoveryRequest>,
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(16);
        for req in initial {
            tx.send(req).await.unwrap();
        }
        let outbound =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        let mut request = tonic::Request::new(outbound);
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let rx = AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(request)
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    async fn next(&mut self) -> DeltaDiscoveryResponse {
        within("a response", self.rx.message())
            .await
            .unwrap()
            .expect("stream open")
    }

    /// The next responses, one per listed type (in any order), by type.
    async fn next_of(&mut self, types: &[&str]) -> HashMap<String, DeltaDiscoveryResponse> {
        let mut got = HashMap::new();
        while got.len() < types.len() {
            let r = self.next().await;
            assert!(types.contains(&r.type_url.as_str()), "{r:?}");
            assert!(got.insert(r.type_url.clone(), r).is_none(), "two responses");
        }
        got
    }

    async fn answer(&self, resp: &DeltaDiscoveryResponse, nack: bool) {
        let req = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: nack.then(|| rpc::Status {
                code: 3,
                message: "refused by the test".into(),
                details: vec![],
            }),
            ..Default::default()
        };
        self.tx.send(req).await.unwrap();
    }
}

fn subscribe(type_url: &str, initial: &[(String, String)]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        initial_resource_versions: initial.iter().cloned().collect(),
        ..Default::default()
    }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut n: Vec<String> = r.resources.iter().map(|r| r.name.clone()).collect();
    n.sort();
    n
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn server_protocol_pushes_deltas_and_honours_acks() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let cp = ControlPlane::start(
        &ca,
        "127.0.0.1:0".parse().unwrap(),
        snapshot(&[("w1", "n1"), ("w2", "n1")], &["web"], &["p1"], &[]),
    )
    .await;

    // Refused without (or with a wrong) token.
    for token in [None, Some("wrong")] {
        let err = RawStream::open(
            cp.channel(&ca),
            token,
            vec![subscribe(ADDRESS_TYPE_URL, &[])],
        )
        .await
        .err()
        .expect("refused");
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{token:?}");
    }

    let both = [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL];
    let mut s = RawStream::open(
        cp.channel(&ca),
        Some(TOKEN),
        both.iter().map(|t| subscribe(t, &[])).collect(),
    )
    .await
    .unwrap();

    // First responses carry everything.
    let first = s.next_of(&both).await;
    let addr = &first[ADDRESS_TYPE_URL];
    assert_eq!(
        names(addr),
        sorted(&[&uid("w1"), &uid("w2"), "default/web"])
    );
    assert!(addr.removed_resources.is_empty());
    assert_eq!(names(&first[AUTHORIZATION_TYPE_URL]), ["default/p1"]);
    assert_ne!(addr.nonce, first[AUTHORIZATION_TYPE_URL].nonce);
    let held: Vec<(String, String)> = addr
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    for r in &addr.resources {
        let any = r.resource.as_ref().unwrap();
        assert_eq!(any.type_url, ADDRESS_TYPE_URL);
        workload::Address::decode(any.value.as_slice()).unwrap();
    }

    // An update before the ACK waits for it; then only the delta comes, removals by name.
    cp.xds
        .update(snapshot(&[("w2", "n2")], &["web"], &["p1", "p2"], &[]));
    // Answering with a stale nonce releases nothing (the server ignores it).
    s.answer(
        &DeltaDiscoveryResponse {
            nonce: "stale".into(),
            ..addr.clone()
        },
        false,
    )
    .await;
    for r in first.values() {
        s.answer(r, false).await;
    }
    let delta = s.next_of(&both).await;
    assert_eq!(names(&delta[ADDRESS_TYPE_URL]), [uid("w2")]);
    assert_eq!(delta[ADDRESS_TYPE_URL].removed_resources, [uid("w1")]);
    assert_eq!(names(&delta[AUTHORIZATION_TYPE_URL]), ["default/p2"]);
    for r in delta.values() {
        assert!(first.values().all(|f| f.nonce != r.nonce), "nonce reused");
    }

    // NACK: the stream stays; the refused version is not resent with the next change.
    s.answer(&delta[ADDRESS_TYPE_URL], true).await;
    s.answer(&delta[AUTHORIZATION_TYPE_URL], false).await;
    cp.xds.update(snapshot(
        &[("w2", "n2")],
        &["web", "api"],
        &["p1", "p2"],
        &[],
    ));
    let after_nack = s.next().await;
    assert_eq!(after_nack.type_url, ADDRESS_TYPE_URL);
    assert_eq!(names(&after_nack), ["default/api"]);
    assert!(after_nack.removed_resources.is_empty());
    s.answer(&after_nack, false).await;
    drop(s);

    // Reconnect declaring what it holds: w1 (gone), web (current), w2 (stale version).
    let current = cp.xds.snapshot();
    let version = |name: &str| current.get(ADDRESS_TYPE_URL, name).unwrap().version.clone();
    let mut initial: Vec<(String, String)> = held
        .into_iter()
        .filter(|(n, _)| *n != "default/web")
        .collect();
    initial.push(("default/web".into(), version("default/web")));
    let mut s = RawStream::open(
        cp.channel(&ca),
        Some(TOKEN),
        vec![subscribe(ADDRESS_TYPE_URL, &initial)],
    )
    .await
    .unwrap();
    let resync = s.next().await;
    assert_eq!(names(&resync), sorted(&[&uid("w2"), "default/api"]));
    assert_eq!(resync.removed_resources, [uid("w1")]);
    let w2 = resync
        .resources
        .iter()
        .find(|r| r.name == uid("w2"))
        .unwrap();
    assert_eq!(w2.version, version(&uid("w2")));

    assert_eq!(cp.xds.streams(), 1);
    drop(s);
    eventually("the server to forget the stream", DEADLINE, || {
        cp.xds.streams() == 0
    })
    .await;
    cp.stop().await;
}

// ---- ztunnel client -----------------------------------------------------------------------

fn metric(metrics: &Metrics, name: &str, label: &str) -> u64 {
    let text = metrics.encode(Exposition::Prometheus).unwrap();
    let prefix = format!("{name}{{{label}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

fn auth_messages(metrics: &Metrics) -> (u64, u64) {
    let label = format!("url=\"{AUTHORIZATION_TYPE_URL}\"");
    (
        metric(metrics, "istio_xds_message_total", &label),
        metric(metrics, "istio_xds_message_bytes_total", &label),
    )
}

/// What a step expects of the state.
type StateCheck = fn(&ProxyState) -> bool;

fn has_workload(state: &ProxyState, name: &str, node: &str) -> bool {
    state
        .workload_by_uid(&uid(name))
        .is_some_and(|w| w.node == node)
}

fn has_policy(state: &ProxyState, name: &str) -> bool {
    state.all_policies().iter().any(|p| p.key.name() == name)
}

#[tokio::test]
async fn client_syncs_refuses_invalid_and_resyncs_after_restart() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    // A free port with nothing listening yet: the client starts before the server.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();

    let state = Arc::new(ProxyState::new());
    let metrics = Metrics::new("test");
    let ready = Ready::new();
    let guard = ready.register_task("state manager");
    let (drain, watcher) = ambit_ztunnel::drain::new();
    let config = XdsClientConfig {
        node: ambit_ztunnel::xds::node_from_config(
            &ambit_ztunnel::Config::from_vars(&[], 1, &|_| false).unwrap(),
        ),
        token: Some(AuthToken::Literal(TOKEN.into())),
        cluster_id: "Kubernetes".into(),
        headers: vec![],
        backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(200),
        },
    };
    let client = XdsClient::new(channel(&ca, addr), config, state.clone(), metrics.clone());
    let client_task = tokio::spawn(client.run(guard, watcher));

    let refused = "istio_xds_connection_terminations_total";
    let reason = "reason=\"ConnectionError\"";
    eventually("a failed connection attempt", DEADLINE, || {
        metric(&metrics, refused, reason) >= 2
    })
    .await;
    assert_eq!(ready.pending(), ["state manager"]);

    // The first Address response holds an invalid workload: NACKed, the rest applied, and
    // readiness waits for an ACKed Address response.
    let cp = ControlPlane::start(
        &ca,
        addr,
        snapshot(&[("w1", "n1")], &["web"], &["p1"], &["bad"]),
    )
    .await;
    eventually("the first sync", DEADLINE, || {
        has_workload(&state, "w1", "n1")
            && state
                .service_by_key(&NamespacedHostname::new("default", "web").unwrap())
                .is_some()
            && has_policy(&state, "p1")
            && auth_messages(&metrics).0 >= 1
    })
    .await;
    assert!(state.workload_by_uid(&uid("bad")).is_none());
    assert_eq!(ready.pending(), ["state manager"], "Address was NACKed");

    // The fix arrives: ACK, and the node is ready.
    cp.xds.update(snapshot(
        &[("w1", "n1"), ("bad", "n1")],
        &["web"],
        &["p1", "p2"],
        &[],
    ));
    within("readiness", ready.wait_ready()).await;
    eventually("the fixed workload", DEADLINE, || {
        has_workload(&state, "bad", "n1")
    })
    .await;

    // Updates: policy added/removed, a workload changed.
    let steps: &[(&str, Snapshot, StateCheck)] = &[
        (
            "p1 removed, p3 added, w1 moved",
            snapshot(&[("w1", "n2"), ("bad", "n1")], &["web"], &["p2", "p3"], &[]),
            |s| has_workload(s, "w1", "n2") && !has_policy(s, "p1") && has_policy(s, "p3"),
        ),
        (
            "an invalid w1 keeps its last good version; the rest still applies",
            // w3 travels in the same (NACKed) response as the invalid w1: once it is
            // there, that response was handled.
            snapshot(
                &[("bad", "n1"), ("w3", "n1")],
                &["web"],
                &["p2", "p3", "p4"],
                &["w1"],
            ),
            |s| has_workload(s, "w3", "n1") && has_workload(s, "w1", "n2") && has_policy(s, "p4"),
        ),
    ];
    for (what, snap, check) in steps {
        cp.xds.update(snap.clone());
        eventually(what, DEADLINE, || check(&state)).await;
    }
    let p4 = {
        let snap = cp.xds.snapshot();
        let r = snap.get(AUTHORIZATION_TYPE_URL, "default/p4").unwrap();
        Resource {
            name: "default/p4".into(),
            version: r.version.clone(),
            resource: Some(r.resource.clone()),
            ..Default::default()
        }
        .encoded_len()
    };

    // Restart the control plane with changed content: the client reconnects, declares what
    // it holds, and gets only the difference.
    let before = auth_messages(&metrics);
    let addr = cp.stop().await;
    let cp = ControlPlane::start(
        &ca,
        addr,
        snapshot(
            &[("w2", "n1"), ("bad", "n1")],
            &["web"],
            &["p2", "p3", "p4"],
            &[],
        ),
    )
    .await;
    eventually("the resync", DEADLINE, || {
        has_workload(&state, "w2", "n1")
            && state.workload_by_uid(&uid("w1")).is_none()
            && state.workload_by_uid(&uid("w3")).is_none()
            && auth_messages(&metrics).0 > before.0
    })
    .await;
    let after = auth_messages(&metrics);
    assert!(
        after.1 - before.1 < u64::try_from(p4).unwrap(),
        "policies were resent: {} bytes",
        after.1 - before.1
    );
    assert!(
        metric(&metrics, refused, reason) >= 3,
        "server shutdown counted"
    );
    assert!(ready.is_ready());

    drop(drain);
    within("the client to stop", client_task).await.unwrap();
    cp.stop().await;
}

/// A certificate source for a manager that never starts a pod here.
struct NoCa;

impl CertProvider for NoCa {
    fn fetch<'a>(
        &'a self,
        identity: &'a SpiffeId,
    ) -> ambit_ztunnel::identity::BoxFuture<'a, ambit_tls::WorkloadCertificate> {
        Box::pin(async move {
            Err(IdentityError::Ca {
                identity: identity.clone(),
                message: "no CA in this test".into(),
            })
        })
    }
}

/// A policy whose source CIDR has a 5-byte address: refused, so its response is NACKed.
fn invalid_policy(name: &str) -> security::Authorization {
    let mut p = security::Authorization::from(&policy(name));
    p.rules = vec![security::Rule {
        clauses: vec![security::Clause {
            matches: vec![security::Match {
                source_ips: vec![security::Address {
                    address: vec![1, 2, 3, 4, 5],
                    length: 32,
                }],
                ..Default::default()
            }],
        }],
    }];
    p
}

/// Hole: an in-pod ztunnel joined the node's ZDS (and so acked pods and served them) before
/// its policy state had synced, evaluating every connection against a policy set that was
/// empty or missing a refused policy. It must join only once both types had an ACKed
/// response.
#[tokio::test]
async fn zds_is_joined_only_once_policy_has_synced() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // Addresses are fine; the Authorization response carries one refused policy.
    let mut snap = snapshot(&[("w1", "node1")], &[], &["p1"], &[]);
    snap.insert_message("default/refused", &invalid_policy("refused"));
    let cp = ControlPlane::start(&ca, addr, snap).await;

    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("ztunnel.sock");
    let zds = ambit_netns::SeqPacketListener::bind(&uds).unwrap();
    let vars: Vec<(String, String)> = [
        ("PROXY_MODE", "shared"),
        ("INPOD_UDS", uds.to_str().unwrap()),
        ("NODE_NAME", "node1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cfg = Arc::new(ambit_ztunnel::Config::from_vars(&vars, 1, &|_| false).unwrap());

    let state = Arc::new(ProxyState::new());
    let metrics = Metrics::new("test");
    let ready = Ready::new();
    let (drain, watcher) = ambit_ztunnel::drain::new();
    let config = XdsClientConfig {
        node: ambit_ztunnel::xds::node_from_config(&cfg),
        token: Some(AuthToken::Literal(TOKEN.into())),
        cluster_id: "Kubernetes".into(),
        headers: vec![],
        backoff: Backoff::default(),
    };
    let client = XdsClient::new(cp.channel(&ca), config, state.clone(), metrics.clone());
    let client_task = tokio::spawn(client.run(ready.register_task("state manager"), watcher));
    let mgr = Arc::new(InpodManager::new(
        cfg,
        state.clone(),
        CertManager::new(NoCa),
        Arc::new(metrics.clone()),
        ConnectionTracker::new(),
        ready.clone(),
        tokio::runtime::Handle::current(),
    ));
    let (mgr_drain, mgr_watcher) = ambit_ztunnel::drain::new();
    let mgr_task = tokio::spawn(mgr.run(mgr_watcher));

    // Both responses were handled (the refused one NACKed, the rest applied) ...
    eventually("the first responses", DEADLINE, || {
        has_workload(&state, "w1", "node1")
            && has_policy(&state, "p1")
            && auth_messages(&metrics).0 >= 1
    })
    .await;
    // ... and still no ztunnel on the ZDS socket. (Bounded: absence needs a window.)
    let early = tokio::time::timeout(Duration::from_millis(500), zds.accept()).await;
    assert!(
        early.is_err(),
        "ztunnel joined ZDS before Authorization had an ACKed response"
    );

    // The fix arrives: ACK, synced, and ztunnel connects and says hello.
    cp.xds
        .update(snapshot(&[("w1", "node1")], &[], &["p1", "refused"], &[]));
    let conn = within("the ZDS connection", zds.accept()).await.unwrap();
    let mut buf = [0u8; ambit_contract::zds::MAX_MESSAGE];
    let (n, _) = within("the hello", conn.recv_with_fd(&mut buf))
        .await
        .unwrap();
    assert_eq!(&buf[..n], &[0x08, 0x01]);

    mgr_drain
        .start_drain_and_wait(
            ambit_ztunnel::drain::DrainMode::Graceful,
            Duration::from_secs(5),
        )
        .await;
    within("the manager to stop", mgr_task).await.unwrap();
    drop(drain);
    within("the client to stop", client_task).await.unwrap();
    cp.stop().await;
}

/// Hole: with both `LOCAL_XDS_PATH` and xDS configured, reloading the file replaced the whole
/// state, and the delta stream never resends what it already delivered, so xDS workloads and
/// policies silently disappeared. Each source owns its records; where both define a key the
/// file's record is used, and the xDS one comes back when the file drops it.
#[tokio::test]
async fn local_config_reload_keeps_xds_records() {
    let ca = LocalCa::generate("cluster.local").unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cp = ControlPlane::start(
        &ca,
        addr,
        snapshot(&[("x1", "n1")], &["xweb"], &["xp", "both"], &[]),
    )
    .await;
    let state = Arc::new(ProxyState::new());
    let metrics = Metrics::new("test");
    let ready = Ready::new();
    let (drain, watcher) = ambit_ztunnel::drain::new();
    let config = XdsClientConfig {
        node: ambit_ztunnel::xds::node_from_config(
            &ambit_ztunnel::Config::from_vars(&[], 1, &|_| false).unwrap(),
        ),
        token: Some(AuthToken::Literal(TOKEN.into())),
        cluster_id: "Kubernetes".into(),
        headers: vec![],
        backoff: Backoff::default(),
    };
    let client = XdsClient::new(cp.channel(&ca), config, state.clone(), metrics);
    let client_task = tokio::spawn(client.run(ready.register_task("state manager"), watcher));
    within("the xDS sync", ready.wait_ready()).await;

    // A policy that exists under the same key in both sources; the file's version denies
    // port 1, xDS's has no rules.
    let local_both = || Authorization {
        rules: vec![ambit_model::authz::Rule {
            clauses: vec![ambit_model::authz::Clause {
                matches: vec![ambit_model::authz::Match {
                    destination_ports: vec![1],
                    ..Default::default()
                }],
            }],
        }],
        ..policy("both")
    };
    let from_file = |s: &ProxyState| {
        s.all_policies()
            .iter()
            .find(|p| p.key.name() == "both")
            .map(|p| !p.rules.is_empty())
    };
    let xweb = NamespacedHostname::new("default", "xweb").unwrap();
    let xds_intact = |s: &ProxyState| {
        has_workload(s, "x1", "n1") && s.service_by_key(&xweb).is_some() && has_policy(s, "xp")
    };
    struct Step {
        what: &'static str,
        reload: Option<(Vec<Workload>, Vec<Authorization>)>,
        xds: Option<Snapshot>,
        check: fn(&ProxyState) -> bool,
    }
    let steps = [
        Step {
            what: "the file loads its own workload and policies",
            reload: Some((vec![workload("l1", "n1")], vec![policy("lp"), local_both()])),
            xds: None,
            check: |s| has_workload(s, "l1", "n1") && has_policy(s, "lp"),
        },
        Step {
            what: "the file drops a policy: only that one goes",
            reload: Some((vec![workload("l1", "n1")], vec![local_both()])),
            xds: None,
            check: |s| !has_policy(s, "lp") && has_workload(s, "l1", "n1"),
        },
        Step {
            what: "xDS removes its copy of the shared key: the file's stays",
            reload: None,
            xds: Some(snapshot(&[("x1", "n1")], &["xweb"], &["xp", "marker"], &[])),
            check: |s| has_policy(s, "marker"),
        },
        Step {
            what: "xDS sends the shared key again: hidden behind the file's",
            reload: None,
            xds: Some(snapshot(&[("x1", "n1")], &["xweb"], &["xp", "both"], &[])),
            check: |s| !has_policy(s, "marker"),
        },
        Step {
            what: "the file drops the shared key: xDS's version comes back",
            reload: Some((vec![], vec![])),
            xds: None,
            check: |s| !has_workload(s, "l1", "n1"),
        },
    ];
    let expect_file_both = [Some(true), Some(true), Some(true), Some(true), Some(false)];
    for (step, file_both) in steps.iter().zip(expect_file_both) {
        if let Some((workloads, policies)) = &step.reload {
            state.replace_local(workloads.clone(), vec![], policies.clone());
        }
        if let Some(snap) = &step.xds {
            cp.xds.update(snap.clone());
        }
        eventually(step.what, DEADLINE, || (step.check)(&state)).await;
        assert!(xds_intact(&state), "{}: xDS records lost", step.what);
        assert_eq!(
            from_file(&state),
            file_both,
            "{}: policy default/both",
            step.what
        );
    }

    drop(drain);
    within("the client to stop", client_task).await.unwrap();
    cp.stop().await;
}
