//! Shared (in-pod) mode end to end, as root: a test ZDS server (a real SEQPACKET listener
//! sending real protobuf and real network-namespace descriptors over SCM_RIGHTS) drives an
//! [`InpodManager`] in-process. Pods are anonymous network namespaces; what the manager did
//! is checked inside them with `ss` (listeners 15001/15006/15008, `fwmark:0x539`), through
//! readiness, metrics, `workloadState` and the certificate cache.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
// Test helpers outside #[test] functions may unwrap too.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use ambit_model::Workload;
use ambit_model::identity::SpiffeId;
use ambit_model::names::WorkloadUid;
use ambit_netns::{
    NetnsFd, NetnsSocketFactory, SeqPacket, SeqPacketListener, SocketFactory, SocketOptions,
    testing::netns_capable_or_skip,
};
use ambit_proto::zds::{self, workload_request::Payload};
use ambit_testkit::eventually;
use ambit_tls::{LocalCa, WorkloadCertificate};
use ambit_ztunnel::Config;
use ambit_ztunnel::drain::{self, DrainMode, DrainTrigger, DrainWatcher};
use ambit_ztunnel::identity::{BoxFuture, CertManager, CertProvider, CertState, IdentityError};
use ambit_ztunnel::inpod::{ExtrasError, InpodManager, PodContext, PodExtras, READINESS_TASK};
use ambit_ztunnel::proxy::ConnectionTracker;
use ambit_ztunnel::readiness::Ready;
use ambit_ztunnel::state::ProxyState;
use ambit_ztunnel::telemetry::Metrics;
use prost::Message;
use serde_json::json;

const NODE: &str = "node-a";
const PORTS: [u16; 3] = [15001, 15006, 15008];
const WAIT: Duration = Duration::from_secs(15);

// ---- an in-process CA ---------------------------------------------------------------------

struct TestCa(LocalCa);

impl CertProvider for TestCa {
    fn fetch<'a>(&'a self, identity: &'a SpiffeId) -> BoxFuture<'a, WorkloadCertificate> {
        Box::pin(async move {
            self.0
                .issue(identity, Duration::from_secs(3600))
                .map_err(|e| IdentityError::Ca {
                    identity: identity.clone(),
                    message: e.to_string(),
                })
        })
    }
}

// ---- pods -----------------------------------------------------------------------------------

/// A pod: its namespace and the workload record the state knows it by.
struct Pod {
    uid: &'static str,
    name: &'static str,
    netns: NetnsFd,
}

impl Pod {
    fn new(uid: &'static str, name: &'static str) -> Self {
        Self {
            uid,
            name,
            netns: NetnsFd::create_anonymous().unwrap(),
        }
    }

    fn identity(&self) -> SpiffeId {
        SpiffeId::new("cluster.local", "default", self.name).unwrap()
    }

    fn workload(&self) -> Workload {
        Workload {
            node: NODE.into(),
            ..Workload::new(
                WorkloadUid::new(format!("Kubernetes//Pod/default/{}", self.name)).unwrap(),
                self.name,
                self.identity(),
            )
        }
    }

    fn add(&self) -> Vec<u8> {
        request(Payload::Add(zds::AddWorkload {
            uid: self.uid.into(),
            workload_info: Some(zds::WorkloadInfo {
                name: self.name.into(),
                namespace: "default".into(),
                service_account: self.name.into(),
                windows_namespace: None,
            }),
        }))
    }

    /// TCP listeners in the pod's netns: port → `fwmark:…` (empty without a mark).
    fn listeners(&self) -> BTreeMap<u16, String> {
        self.sockets("-tlnHe")
    }

    /// Bound UDP sockets in the pod's netns, like [`Pod::listeners`].
    fn udp_sockets(&self) -> BTreeMap<u16, String> {
        self.sockets("-ulnHe")
    }

    fn sockets(&self, ss_args: &str) -> BTreeMap<u16, String> {
        let mut cmd = std::process::Command::new("ss");
        cmd.arg(ss_args);
        ambit_netns::set_command_netns(&mut cmd, &self.netns).unwrap();
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "ss: {out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let port = fields.get(3)?.rsplit(':').next()?.parse().ok()?;
                let mark = fields
                    .iter()
                    .find(|f| f.starts_with("fwmark:"))
                    .map_or(String::new(), |f| f.to_string());
                Some((port, mark))
            })
            .collect()
    }

    /// Whether the pod's proxy listeners are all there, each with the in-pod mark.
    fn proxied(&self) -> bool {
        let l = self.listeners();
        PORTS
            .iter()
            .all(|p| l.get(p).is_some_and(|m| m == "fwmark:0x539"))
    }

    /// Whether none of the proxy ports is bound.
    fn unproxied(&self) -> bool {
        let l = self.listeners();
        PORTS.iter().all(|p| !l.contains_key(p))
    }

    /// Waits until none of the proxy ports is bound, for a pod whose proxies were just
    /// stopped. Polled, not checked once: a process that another test of this binary is
    /// spawning at that moment (fork, then `setns` in `pre_exec`, then exec) holds a copy of
    /// every descriptor of the test process, the listeners ztunnel closed included, until
    /// its exec closes them; `ss` lists such a listener for that long (seen under load, with
    /// the map empty a moment later). A listener ztunnel never closes still fails here.
    async fn closes(&self, what: &str) {
        ambit_testkit::eventually(what, WAIT, || self.unproxied()).await;
    }
}

fn request(payload: Payload) -> Vec<u8> {
    zds::WorkloadRequest {
        payload: Some(payload),
    }
    .encode_to_vec()
}

fn snapshot() -> Vec<u8> {
    request(Payload::SnapshotSent(zds::SnapshotSent {}))
}

fn del(uid: &str) -> Vec<u8> {
    request(Payload::Del(zds::DelWorkload { uid: uid.into() }))
}

fn keep(uid: &str) -> Vec<u8> {
    request(Payload::Keep(zds::KeepWorkload { uid: uid.into() }))
}

// ---- the harness: test ZDS server + manager -------------------------------------------------

struct Harness {
    _dir: tempfile::TempDir,
    listener: SeqPacketListener,
    /// The current connection from the manager.
    conn: Option<SeqPacket>,
    mgr: Arc<InpodManager>,
    state: Arc<ProxyState>,
    certs: Arc<CertManager>,
    metrics: Arc<Metrics>,
    ready: Ready,
    drain: Option<DrainTrigger>,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    async fn start(workload_wait: Duration) -> Self {
        Self::start_with(workload_wait, None).await
    }

    async fn start_with(workload_wait: Duration, extras: Option<Arc<dyn PodExtras>>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ztunnel.sock");
        let listener = SeqPacketListener::bind(&path).unwrap();
        let vars: Vec<(String, String)> = [
            ("PROXY_MODE", "shared"),
            ("INPOD_UDS", path.to_str().unwrap()),
            ("NODE_NAME", NODE),
            ("CONNECTION_TERMINATION_DEADLINE", "1s"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let cfg = Arc::new(Config::from_vars(&vars, 2, &|_| false).unwrap());
        let state = Arc::new(ProxyState::new());
        // The tests feed the state directly: it has nothing else to wait for.
        state.mark_synced();
        let certs = CertManager::new(TestCa(LocalCa::generate("cluster.local").unwrap()));
        let metrics = Arc::new(Metrics::new("test"));
        let ready = Ready::new();
        let mut mgr = InpodManager::new(
            cfg,
            state.clone(),
            certs.clone(),
            metrics.clone(),
            ConnectionTracker::new(),
            ready.clone(),
            tokio::runtime::Handle::current(),
        )
        .with_workload_wait(workload_wait);
        if let Some(extras) = extras {
            mgr = mgr.with_extras(extras);
        }
        let mgr = Arc::new(mgr);
        assert_eq!(
            ready.pending(),
            [READINESS_TASK],
            "not ready before a snapshot"
        );
        let (trigger, watcher) = drain::new();
        let task = tokio::spawn(mgr.clone().run(watcher));
        let conn = accept(&listener).await;
        Self {
            _dir: dir,
            listener,
            conn: Some(conn),
            mgr,
            state,
            certs,
            metrics,
            ready,
            drain: Some(trigger),
            task,
        }
    }

    fn conn(&self) -> &SeqPacket {
        self.conn.as_ref().unwrap()
    }

    /// Sends one request (with descriptors) and returns the ack's error ("" = ACK).
    async fn send(&self, data: &[u8], fds: &[BorrowedFd<'_>]) -> String {
        self.conn().send_with_fds(data, fds).await.unwrap();
        let mut buf = [0u8; ambit_contract::zds::MAX_MESSAGE];
        let (n, fd) = tokio::time::timeout(WAIT, self.conn().recv_with_fd(&mut buf))
            .await
            .expect("an ack in time")
            .unwrap();
        assert!(n > 0, "connection closed instead of an ack");
        assert!(fd.is_none());
        match zds::WorkloadResponse::decode(&buf[..n]).unwrap().payload {
            Some(zds::workload_response::Payload::Ack(a)) => a.error,
            None => panic!("response without an ack"),
        }
    }

    async fn ack(&self, data: &[u8], fds: &[BorrowedFd<'_>]) {
        let err = self.send(data, fds).await;
        assert_eq!(err, "", "expected an ACK");
    }

    async fn add(&self, pod: &Pod) -> String {
        self.send(&pod.add(), &[pod.netns.as_fd()]).await
    }

    /// The manager dropped the connection: accept its next one (hello checked).
    async fn reconnected(&mut self) {
        let mut buf = [0u8; ambit_contract::zds::MAX_MESSAGE];
        let (n, _) = tokio::time::timeout(WAIT, self.conn().recv_with_fd(&mut buf))
            .await
            .expect("the manager closes the connection")
            .unwrap();
        assert_eq!(n, 0, "expected the manager to close the connection");
        self.conn = Some(accept(&self.listener).await);
    }

    /// The agent restarts: it closes the connection and accepts the manager's next one.
    async fn agent_restart(&mut self) {
        self.conn = None;
        self.conn = Some(accept(&self.listener).await);
    }

    fn wm(&self) -> (i64, i64, u64, u64) {
        let wm = self.metrics.workload_manager();
        (
            wm.active_proxies.get(),
            wm.pending_proxies.get(),
            wm.proxies_started.get(),
            wm.proxies_stopped.get(),
        )
    }

    fn is_ready(&self) -> bool {
        !self.ready.pending().iter().any(|t| t == READINESS_TASK)
    }

    async fn shutdown(mut self) {
        let trigger = self.drain.take().unwrap();
        trigger
            .start_drain_and_wait(DrainMode::Graceful, Duration::from_secs(5))
            .await;
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("the manager stops on drain")
            .unwrap();
    }
}

/// Accepts a connection and checks the hello (`08 01`).
async fn accept(listener: &SeqPacketListener) -> SeqPacket {
    let conn = tokio::time::timeout(WAIT, listener.accept())
        .await
        .expect("the manager connects")
        .unwrap();
    let mut buf = [0u8; ambit_contract::zds::MAX_MESSAGE];
    let (n, fd) = conn.recv_with_fd(&mut buf).await.unwrap();
    assert_eq!((&buf[..n], fd.is_none()), (&[0x08u8, 0x01][..], true));
    conn
}

macro_rules! skip_unless_root {
    ($name:expr) => {
        if !netns_capable_or_skip($name) {
            return;
        }
    };
}

// ---- tests ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_snapshot_readd_del_and_shutdown() {
    skip_unless_root!("add_snapshot_readd_del_and_shutdown");
    let h = Harness::start(Duration::from_secs(5)).await;
    let (a, b) = (Pod::new("uid-a", "alpha"), Pod::new("uid-b", "beta"));
    h.state.upsert_workload(a.workload());
    h.state.upsert_workload(b.workload());

    assert_eq!(h.add(&a).await, "");
    assert!(
        a.proxied(),
        "listeners with mark 0x539: {:?}",
        a.listeners()
    );
    assert!(!h.is_ready(), "not ready before the snapshot");
    h.ack(&snapshot(), &[]).await;
    assert!(h.is_ready());
    assert_eq!(h.wm(), (1, 0, 1, 0));
    assert_eq!(
        h.mgr.workload_state(),
        json!({"uid-a": {"state": "Up", "info": {
            "name": "alpha", "namespace": "default", "serviceAccount": "alpha"}}})
    );
    // The pod's certificate was prefetched from the CA.
    eventually("certificate issued", WAIT, || {
        h.certs
            .states()
            .iter()
            .any(|(id, st)| *id == a.identity() && matches!(st, CertState::Available(_)))
    })
    .await;

    // After the snapshot: Add starts, re-Add with another fd of the same netns is a no-op.
    assert_eq!(h.add(&b).await, "");
    let same_ns = b.netns.try_clone().unwrap();
    h.ack(&b.add(), &[same_ns.as_fd()]).await;
    assert_eq!(h.wm(), (2, 0, 2, 0));

    // Del drains that pod before the ack; unknown uids are acked too.
    h.ack(&del("uid-a"), &[]).await;
    a.closes("the deleted pod's listeners to close").await;
    assert!(b.proxied());
    h.ack(&del("uid-unknown"), &[]).await;
    assert_eq!(h.wm(), (1, 0, 2, 1));
    assert!(
        !h.certs.states().iter().any(|(id, _)| *id == a.identity()),
        "the removed pod's certificate is no longer renewed"
    );

    // Shutdown drains the rest.
    h.shutdown().await;
    b.closes("the listeners to close on shutdown").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_reconciles_across_reconnects() {
    skip_unless_root!("snapshot_reconciles_across_reconnects");
    let mut h = Harness::start(Duration::from_secs(5)).await;
    let pods = [
        Pod::new("uid-a", "alpha"),
        Pod::new("uid-b", "beta"),
        Pod::new("uid-c", "gamma"),
    ];
    for p in &pods {
        h.state.upsert_workload(p.workload());
        assert_eq!(h.add(p).await, "");
    }
    h.ack(&snapshot(), &[]).await;
    assert!(pods.iter().all(Pod::proxied));

    // The agent restarts: proxies survive the disconnect, readiness drops.
    h.agent_restart().await;
    eventually("not ready after the disconnect", WAIT, || !h.is_ready()).await;
    assert!(
        pods.iter().all(Pod::proxied),
        "proxies survive a disconnect"
    );

    // New snapshot: A re-added (same netns), B named then deleted before the snapshot, C not
    // named at all, D only kept (unknown here): B and C stop, A keeps running untouched.
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    assert_eq!(h.add(a).await, "");
    assert_eq!(h.add(b).await, "");
    h.ack(&del("uid-b"), &[]).await;
    assert!(
        b.proxied(),
        "a Del before the snapshot only un-names the pod"
    );
    h.ack(&keep("uid-d"), &[]).await;
    assert!(!h.is_ready());
    h.ack(&snapshot(), &[]).await;
    assert!(h.is_ready());
    assert!(a.proxied());
    b.closes("B's listeners to close at the snapshot").await;
    c.closes("C's listeners to close at the snapshot").await;
    assert_eq!(h.wm(), (1, 0, 3, 2), "A was never restarted");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_nacked_and_other_pods_keep_working() {
    skip_unless_root!("bad_messages_are_nacked_and_other_pods_keep_working");
    let mut h = Harness::start(Duration::from_secs(5)).await;
    let a = Pod::new("uid-a", "alpha");
    h.state.upsert_workload(a.workload());
    assert_eq!(h.add(&a).await, "");
    h.ack(&snapshot(), &[]).await;

    let other = Pod::new("uid-x", "xray");
    let no_info = request(Payload::Add(zds::AddWorkload {
        uid: "uid-x".into(),
        workload_info: None,
    }));
    let ns = other.netns.as_fd();
    /// (name, datagram, fds, expected error fragment, the connection is dropped)
    type Case<'a> = (
        &'static str,
        Vec<u8>,
        Vec<BorrowedFd<'a>>,
        &'static str,
        bool,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "malformed",
            vec![0xff, 0xff, 0xff],
            vec![],
            "failure to read message",
            true,
        ),
        (
            "add without fd",
            other.add(),
            vec![],
            "No control message",
            true,
        ),
        (
            "fd on a del",
            del("uid-x"),
            vec![ns],
            "unexpected file descriptor",
            true,
        ),
        (
            "two fds",
            other.add(),
            vec![ns, ns],
            "file descriptors in one message",
            true,
        ),
        (
            "keep after snapshot",
            keep("uid-a"),
            vec![],
            "protocol error",
            false,
        ),
        (
            "second snapshot",
            snapshot(),
            vec![],
            "protocol error",
            false,
        ),
        (
            "add without workload_info",
            no_info,
            vec![ns],
            "protocol error",
            false,
        ),
    ];
    for (name, data, fds, fragment, drops) in cases {
        let err = h.send(&data, &fds).await;
        assert!(err.contains(fragment), "{name}: {err:?}");
        if drops {
            h.reconnected().await;
            // Resync like a real agent: the running pod is re-added (a no-op) and kept.
            assert_eq!(h.add(&a).await, "", "{name}");
            h.ack(&snapshot(), &[]).await;
        } else {
            // Same connection, still serving.
            h.ack(&del("uid-unknown"), &[]).await;
        }
        assert!(a.proxied(), "{name}: the other pod keeps its listeners");
        assert!(h.is_ready(), "{name}");
    }
    assert_eq!(h.wm(), (1, 0, 1, 0), "the pod was never restarted");
    h.shutdown().await;
}

/// Blocks one of the proxy ports inside `pod`'s netns (no SO_REUSEPORT, so the proxy's bind
/// fails).
fn hold_port(pod: &Pod, port: u16) -> std::net::TcpListener {
    let f = NetnsSocketFactory::new(pod.netns.try_clone().unwrap(), None);
    f.new_tcp_listener(
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
        &SocketOptions {
            only_v6: Some(false),
            ..SocketOptions::default()
        },
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_starts_stay_pending_and_are_retried() {
    skip_unless_root!("failed_starts_stay_pending_and_are_retried");
    // (name, what breaks the start, expected NACK fragment)
    enum Cause {
        PortHeld,
        NoWorkloadRecord,
    }
    let cases = [
        ("port held", Cause::PortHeld, "failure to start proxy : "),
        (
            "no workload record",
            Cause::NoWorkloadRecord,
            "no workload alpha",
        ),
    ];
    for (name, cause, fragment) in cases {
        let h = Harness::start(Duration::from_millis(200)).await;
        let a = Pod::new("uid-a", "alpha");
        let mut held = None;
        match cause {
            Cause::PortHeld => {
                h.state.upsert_workload(a.workload());
                held = Some(hold_port(&a, 15006));
            }
            Cause::NoWorkloadRecord => {}
        }
        let err = h.add(&a).await;
        assert!(
            err.contains("failure to start proxy : ") && err.contains(fragment),
            "{name}: {err:?}"
        );
        h.ack(&snapshot(), &[]).await;
        assert_eq!(
            h.mgr.workload_state()["uid-a"]["state"],
            "Pending",
            "{name}"
        );
        assert!(!h.is_ready(), "{name}: not ready while a pod is pending");
        assert_eq!(h.wm(), (0, 1, 0, 0), "{name}");
        assert!(!a.proxied(), "{name}");

        // Fix the cause; the 5 s retry starts the pod.
        match cause {
            Cause::PortHeld => drop(held.take()),
            Cause::NoWorkloadRecord => h.state.upsert_workload(a.workload()),
        }
        eventually(name, WAIT, || a.proxied()).await;
        eventually(name, WAIT, || h.is_ready()).await;
        assert_eq!(h.mgr.workload_state()["uid-a"]["state"], "Up", "{name}");
        assert_eq!(h.wm(), (1, 0, 1, 0), "{name}");
        h.shutdown().await;
    }
}

/// A pending pod is forgotten by a `DelWorkload` and by a new connection, so its retry never
/// starts it later (on Windows the pod waiting for its network compartment is such a pod;
/// upstream's queued retry survives a Del). The witness is a second pending pod whose cause
/// is fixed at the same time: once it has started, a retry pass has run, and the cancelled
/// pod must not have been started by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_or_a_reconnect_cancels_a_pending_pod() {
    skip_unless_root!("a_del_or_a_reconnect_cancels_a_pending_pod");
    for cancel in ["Del", "agent restart"] {
        let mut h = Harness::start(Duration::from_millis(200)).await;
        let (a, witness) = (Pod::new("uid-a", "alpha"), Pod::new("uid-w", "witness"));
        h.state.upsert_workload(a.workload());
        h.state.upsert_workload(witness.workload());
        let held = [hold_port(&a, 15006), hold_port(&witness, 15006)];
        assert!(
            !h.add(&a).await.is_empty(),
            "{cancel}: NACK while the port is held"
        );
        h.ack(&snapshot(), &[]).await;
        assert_eq!(
            h.mgr.workload_state()["uid-a"]["state"],
            "Pending",
            "{cancel}"
        );
        match cancel {
            "Del" => h.ack(&del("uid-a"), &[]).await,
            _ => {
                h.agent_restart().await;
                eventually(cancel, WAIT, || {
                    h.mgr.workload_state().get("uid-a").is_none()
                })
                .await;
            }
        }
        assert!(
            h.mgr.workload_state().get("uid-a").is_none(),
            "{cancel}: {:?}",
            h.mgr.workload_state()
        );
        assert!(
            !h.add(&witness).await.is_empty(),
            "{cancel}: witness NACKed"
        );
        if cancel != "Del" {
            h.ack(&snapshot(), &[]).await;
        }
        assert_eq!(
            h.wm(),
            (0, 1, 0, 0),
            "{cancel}: only the witness is pending"
        );
        drop(held);
        eventually(cancel, WAIT, || witness.proxied()).await;
        assert!(
            a.unproxied(),
            "{cancel}: the cancelled pod was started: {:?}",
            a.listeners()
        );
        assert_eq!(h.wm(), (1, 0, 1, 0), "{cancel}");
        eventually(cancel, WAIT, || h.is_ready()).await;
        h.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readd_with_a_new_netns_replaces_the_proxies() {
    skip_unless_root!("readd_with_a_new_netns_replaces_the_proxies");
    let h = Harness::start(Duration::from_secs(5)).await;
    let old = Pod::new("uid-a", "alpha");
    h.state.upsert_workload(old.workload());
    assert_eq!(h.add(&old).await, "");
    h.ack(&snapshot(), &[]).await;
    // The sandbox was re-created: same uid, new netns.
    let new = Pod::new("uid-a", "alpha");
    assert_eq!(h.add(&new).await, "");
    old.closes("the old netns's listeners to close").await;
    assert!(new.proxied(), "{:?}", new.listeners());
    assert_eq!(h.wm(), (1, 0, 2, 1));
    h.shutdown().await;
}

/// A stand-in for the DNS proxy: a UDP socket on 127.0.0.1:15053 in the pod netns, held by a
/// task until the pod drains. Pods named "broken" fail to start it.
struct FakeDns;

impl PodExtras for FakeDns {
    fn start(
        &self,
        pod: &PodContext<'_>,
        tasks: &mut tokio::task::JoinSet<()>,
        drain: DrainWatcher,
    ) -> Result<(), ExtrasError> {
        if pod.workload.name == "broken" {
            return Err("DNS bind refused".into());
        }
        let sock = pod.socket_factory.new_udp_socket(
            SocketAddr::from(([127, 0, 0, 1], 15053)),
            &SocketOptions::default(),
        )?;
        let sock = tokio::net::UdpSocket::from_std(sock)?;
        tasks.spawn(async move {
            let _sock = sock;
            drain.signaled().await;
        });
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extras_run_next_to_the_proxy() {
    skip_unless_root!("extras_run_next_to_the_proxy");
    let h = Harness::start_with(Duration::from_secs(5), Some(Arc::new(FakeDns))).await;
    let (a, broken) = (Pod::new("uid-a", "alpha"), Pod::new("uid-b", "broken"));
    h.state.upsert_workload(a.workload());
    h.state.upsert_workload(broken.workload());

    assert_eq!(h.add(&a).await, "");
    assert_eq!(
        a.udp_sockets().get(&15053).map(String::as_str),
        Some("fwmark:0x539"),
        "{:?}",
        a.udp_sockets()
    );
    assert!(a.proxied());
    // A failing hook fails the pod's start like a failed bind: NACK, pending, no listeners.
    let err = h.add(&broken).await;
    assert!(
        err.contains("failure to start proxy : ") && err.contains("DNS bind refused"),
        "{err:?}"
    );
    assert!(broken.unproxied());
    h.ack(&snapshot(), &[]).await;
    assert_eq!(h.wm(), (1, 1, 1, 0));

    h.ack(&del("uid-a"), &[]).await;
    // Polled for the reason [`Pod::closes`] gives.
    ambit_testkit::eventually("the hook's servers to stop with the pod", WAIT, || {
        !a.udp_sockets().contains_key(&15053)
    })
    .await;
    a.closes("the deleted pod's listeners to close").await;
    h.shutdown().await;
}
