//! The daemon loop over fakes: a scripted runtime+HNS+policies ([`FakeNode`]), a ztunnel that
//! acks or NACKs and keeps the snapshot cache as the ZDS server does ([`FakeZtunnel`]), and
//! the in-memory pod source (annotations), with a switch to make annotation writes fail.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_netns::guid::Guid;
use tokio::time::Instant;

use super::*;
use crate::enrol::{Enablement, default_selectors};
use crate::pods::{LocalPodSource, Namespace, PodPhase, SourceError};

#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
struct FakeError(String);

/// What the fake runtime answers for one pod's next capture.
#[derive(Debug, Clone)]
enum Answer {
    Captured(PodNamespace),
    Fails(&'static str),
}

#[derive(Debug, Default)]
struct NodeState {
    /// Per pod UID, the answers still to give; an exhausted script keeps failing.
    script: BTreeMap<String, VecDeque<Answer>>,
    runtime_down: bool,
    release_fails: u32,
    captures: Vec<BTreeSet<String>>,
    releases: Vec<Guid>,
}

#[derive(Debug, Clone, Default)]
struct FakeNode(Arc<Mutex<NodeState>>);

impl FakeNode {
    fn state(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.0.lock().unwrap()
    }
    fn script(&self, uid: &str, answers: &[Answer]) {
        (self.state().script).insert(uid.to_owned(), answers.iter().cloned().collect());
    }
}

impl Node for FakeNode {
    type Error = FakeError;
    fn capture(
        &mut self,
        uids: &BTreeSet<String>,
    ) -> impl Future<Output = Result<BTreeMap<String, Result<PodNamespace, FakeError>>, FakeError>> + Send
    {
        let mut st = self.state();
        st.captures.push(uids.clone());
        let out = if st.runtime_down {
            Err(FakeError("runtime down".into()))
        } else {
            let mut out = BTreeMap::new();
            for uid in uids {
                let next = st.script.get_mut(uid).and_then(VecDeque::pop_front);
                let answer = match next {
                    Some(Answer::Captured(ns)) => Ok(ns),
                    Some(Answer::Fails(why)) => Err(FakeError(why.into())),
                    None => Err(FakeError("no sandbox names an HNS namespace".into())),
                };
                out.insert(uid.clone(), answer);
            }
            Ok(out)
        };
        std::future::ready(out)
    }
    fn release(&mut self, ns: &PodNamespace) -> Result<(), FakeError> {
        let mut st = self.state();
        st.releases.push(ns.guid);
        if st.release_fails > 0 {
            st.release_fails -= 1;
            return Err(FakeError("HcnModifyEndpoint failed".into()));
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct ZtunnelState {
    /// Per pod UID, how many of its next Adds are NACKed.
    nacks: BTreeMap<String, u32>,
    adds: Vec<Workload>,
    dels: Vec<String>,
    /// What the next snapshot would carry (the ZDS server's cache).
    cache: BTreeMap<String, Workload>,
}

#[derive(Debug, Clone, Default)]
struct FakeZtunnel(Arc<Mutex<ZtunnelState>>);

impl FakeZtunnel {
    fn state(&self) -> std::sync::MutexGuard<'_, ZtunnelState> {
        self.0.lock().unwrap()
    }
    fn snapshot(&self) -> BTreeSet<String> {
        self.state().cache.keys().cloned().collect()
    }
}

impl Ztunnel for FakeZtunnel {
    type Error = FakeError;
    fn add(&self, w: Workload) -> impl Future<Output = Result<(), FakeError>> + Send {
        let mut st = self.state();
        st.adds.push(w.clone());
        st.cache.insert(w.uid.clone(), w.clone());
        let nack = st.nacks.get_mut(&w.uid).filter(|n| **n > 0);
        let out = if let Some(n) = nack {
            *n -= 1;
            Err(FakeError(
                "ztunnel NACKed: compartment 0 does not exist".into(),
            ))
        } else {
            Ok(())
        };
        std::future::ready(out)
    }
    fn del(&self, uid: &str) -> impl Future<Output = Result<(), FakeError>> + Send {
        let mut st = self.state();
        st.dels.push(uid.to_owned());
        st.cache.remove(uid);
        std::future::ready(Ok(()))
    }
}

/// The in-memory source whose annotation writes can be made to fail (an API outage).
#[derive(Debug, Clone, Default)]
struct Source {
    local: LocalPodSource,
    failing: Arc<Mutex<u32>>,
}

impl PodSource for Source {
    fn watch(&self) -> tokio::sync::mpsc::UnboundedReceiver<PodEvent> {
        self.local.watch()
    }
    fn annotate(
        &self,
        namespace: &str,
        name: &str,
        value: Option<&str>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        use futures_util::FutureExt;
        let mut failing = self.failing.lock().unwrap();
        let out = if *failing > 0 {
            *failing -= 1;
            Err(SourceError::Api {
                pod: format!("{namespace}/{name}"),
                status: 503,
                message: "unavailable".into(),
            })
        } else {
            let write = self.local.annotate(namespace, name, value);
            write
                .now_or_never()
                .expect("the local source answers at once")
        };
        std::future::ready(out)
    }
}

const NS: &str = "demo";

fn guid(n: u128) -> Guid {
    Guid::from_u128(0x1000 + n)
}

fn hns(n: u128, compartment: u32) -> PodNamespace {
    PodNamespace {
        guid: guid(n),
        compartment,
    }
}

fn pod(name: &str, ambient: bool) -> Pod {
    let mut p = Pod {
        name: name.into(),
        namespace: NS.into(),
        uid: format!("uid-{name}"),
        service_account: "sa".into(),
        node: "win-1".into(),
        phase: PodPhase::Pending,
        ..Pod::default()
    };
    if ambient {
        p.labels
            .insert("istio.io/dataplane-mode".into(), "ambient".into());
    }
    p
}

struct Harness {
    node: FakeNode,
    zt: FakeZtunnel,
    source: Source,
    d: Daemon<FakeNode, FakeZtunnel, Source>,
    t0: Instant,
}

impl Harness {
    fn new() -> Self {
        let node = FakeNode::default();
        let zt = FakeZtunnel::default();
        let source = Source::default();
        source.local.upsert_namespace(Namespace {
            name: NS.into(),
            labels: BTreeMap::new(),
        });
        let enablement = Enablement {
            selectors: default_selectors(),
            exclude_namespaces: vec!["kube-system".into()],
            system_namespace: "istio-system".into(),
        };
        let d = Daemon::new(
            node.clone(),
            zt.clone(),
            source.clone(),
            enablement,
            Backoff::default(),
        );
        Self {
            node,
            zt,
            source,
            d,
            t0: Instant::now(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// The pod as the API server has it, given to the daemon as an event.
    fn upsert(&mut self, p: Pod, ms: u64) {
        self.source.local.upsert_pod(p.clone());
        let stored = self.source.local.pod(&p.namespace, &p.name).unwrap();
        self.d.handle(PodEvent::Pod(stored), self.at(ms));
    }

    fn delete(&mut self, p: &Pod, ms: u64) {
        let stored = self.source.local.pod(&p.namespace, &p.name).unwrap();
        self.source.local.delete_pod(&p.namespace, &p.name);
        self.d.handle(PodEvent::PodDeleted(stored), self.at(ms));
    }

    fn sync(&mut self) {
        let at = self.at(0);
        self.d.handle(
            PodEvent::Namespace(Namespace {
                name: NS.into(),
                labels: BTreeMap::new(),
            }),
            at,
        );
        self.d.handle(PodEvent::Synced, at);
    }

    async fn step(&mut self, ms: u64) {
        let at = self.at(ms);
        self.d.step(at).await;
        // What the daemon wrote reaches it back through the watch, as from the API server.
        for p in self.pods() {
            self.d.handle(PodEvent::Pod(p), at);
        }
    }

    fn pods(&self) -> Vec<Pod> {
        let names: Vec<String> = self.d.pods.values().map(|p| p.name.clone()).collect();
        (names.iter())
            .filter_map(|n| self.source.local.pod(NS, n))
            .collect()
    }

    fn annotation(&self, name: &str) -> Option<String> {
        self.source.local.redirection(NS, name)
    }

    fn phase(&self, name: &str) -> Option<Phase> {
        self.d
            .status()
            .get(&format!("uid-{name}"))
            .map(|s| s.phase.clone())
    }

    fn due_in_ms(&self) -> Option<u128> {
        self.d.next_due().map(|d| (d - self.t0).as_millis())
    }
}

#[test]
fn backoff_doubles_from_first_and_stops_at_the_cap() {
    let b = Backoff {
        first: Duration::from_millis(500),
        max: Duration::from_secs(30),
    };
    let cases = [
        (0, 500),
        (1, 500),
        (2, 1_000),
        (3, 2_000),
        (7, 30_000),
        (8, 30_000),
        (40, 30_000),
        (u32::MAX, 30_000),
    ];
    for (failures, ms) in cases {
        assert_eq!(
            b.delay(failures),
            Duration::from_millis(ms),
            "after {failures} failures"
        );
    }
}

#[tokio::test]
async fn an_ambient_pod_is_captured_added_and_then_annotated_enabled_only_after_sync() {
    let mut h = Harness::new();
    let web = pod("web", true);
    h.node.script(&web.uid, &[Answer::Captured(hns(1, 7))]);
    h.upsert(web.clone(), 0);
    h.upsert(pod("plain", false), 0);
    h.step(0).await;
    assert!(h.node.state().captures.is_empty(), "nothing before Synced");
    assert_eq!(h.d.next_due(), None);

    h.sync();
    h.step(0).await;
    assert_eq!(
        h.node.state().captures,
        vec![BTreeSet::from([web.uid.clone()])],
        "one listing for the wanted pods, none for the non-ambient one"
    );
    let adds = h.zt.state().adds.clone();
    assert_eq!(adds.len(), 1);
    assert_eq!(
        (adds[0].uid.as_str(), adds[0].name.as_str(), adds[0].hns),
        (web.uid.as_str(), "web", hns(1, 7))
    );
    assert_eq!(h.annotation("web").as_deref(), Some(ENABLED));
    assert_eq!(h.annotation("plain"), None);
    assert_eq!(h.phase("web"), Some(Phase::Enrolled));
    assert_eq!(h.d.next_due(), None, "nothing left to do");

    // An update of an enrolled pod changes nothing.
    h.upsert(web, 10);
    h.step(10).await;
    assert_eq!(h.zt.state().adds.len(), 1);
    assert_eq!(h.node.state().captures.len(), 1);
}

#[tokio::test]
async fn pods_running_at_start_are_captured_in_one_listing() {
    let mut h = Harness::new();
    let names = ["a", "b", "c"];
    for (i, n) in names.iter().enumerate() {
        let p = pod(n, true);
        h.node
            .script(&p.uid, &[Answer::Captured(hns(i as u128, 3))]);
        h.upsert(p, 0);
    }
    h.sync();
    h.step(0).await;
    assert_eq!(h.node.state().captures.len(), 1);
    for n in names {
        assert_eq!(h.annotation(n).as_deref(), Some(ENABLED), "{n}");
    }
}

/// How an enrolled pod stops being wanted, and whether its annotation must be removed.
#[tokio::test]
async fn a_pod_that_stops_being_wanted_gets_del_and_its_policies_removed() {
    struct Case {
        what: &'static str,
        change: fn(&mut Harness, &Pod),
        annotation_removed: bool,
    }
    let cases = [
        Case {
            what: "deleted",
            change: |h, p| h.delete(p, 5),
            annotation_removed: false,
        },
        Case {
            what: "un-labelled",
            change: |h, p| {
                let mut p = p.clone();
                p.labels.clear();
                h.upsert(p, 5);
            },
            annotation_removed: true,
        },
        Case {
            what: "terminal",
            change: |h, p| {
                let mut p = p.clone();
                p.phase = PodPhase::Succeeded;
                h.upsert(p, 5);
            },
            annotation_removed: true,
        },
        Case {
            what: "opted out (dataplane-mode none)",
            change: |h, p| {
                let mut p = p.clone();
                p.labels
                    .insert("istio.io/dataplane-mode".into(), "none".into());
                h.upsert(p, 5);
            },
            annotation_removed: true,
        },
    ];
    for case in cases {
        let mut h = Harness::new();
        let web = pod("web", true);
        h.node.script(&web.uid, &[Answer::Captured(hns(1, 7))]);
        h.upsert(web.clone(), 0);
        h.sync();
        h.step(0).await;
        assert_eq!(
            h.annotation("web").as_deref(),
            Some(ENABLED),
            "{}",
            case.what
        );
        let writes_before = h.source.local.annotation_log().len();

        (case.change)(&mut h, &web);
        assert_eq!(h.phase("web"), Some(Phase::Releasing), "{}", case.what);
        h.step(5).await;
        assert_eq!(h.zt.state().dels, vec![web.uid.clone()], "{}", case.what);
        assert_eq!(h.node.state().releases, vec![guid(1)], "{}", case.what);
        assert!(
            h.zt.snapshot().is_empty(),
            "{}: not in the next snapshot",
            case.what
        );
        let writes = h.source.local.annotation_log()[writes_before..].to_vec();
        if case.annotation_removed {
            assert_eq!(
                writes,
                vec![(NS.into(), "web".into(), None)],
                "{}",
                case.what
            );
        } else {
            assert!(writes.is_empty(), "{}: {writes:?}", case.what);
        }
        assert!(h.d.status().is_empty(), "{}: {:?}", case.what, h.d.status());
        assert_eq!(h.d.next_due(), None, "{}", case.what);
    }
}

#[tokio::test]
async fn a_release_that_fails_is_retried_with_backoff() {
    let mut h = Harness::new();
    let web = pod("web", true);
    h.node.script(&web.uid, &[Answer::Captured(hns(1, 7))]);
    h.upsert(web.clone(), 0);
    h.sync();
    h.step(0).await;
    h.node.state().release_fails = 2;
    h.delete(&web, 0);
    h.step(0).await;
    let st = h.d.status()[&web.uid].clone();
    assert_eq!((st.phase.clone(), st.failures), (Phase::Releasing, 1));
    assert!(
        st.last_error
            .as_deref()
            .is_some_and(|e| e.contains("demo/web") && e.contains(&guid(1).to_string())),
        "{st:?}"
    );
    assert_eq!(h.due_in_ms(), Some(500));
    h.step(499).await;
    assert_eq!(h.node.state().releases.len(), 1, "not before it is due");
    h.step(500).await;
    assert_eq!(h.due_in_ms(), Some(1_500), "500 ms, then 1 s");
    h.step(1_500).await;
    assert_eq!(h.node.state().releases.len(), 3);
    assert!(h.d.status().is_empty());
}

#[tokio::test]
async fn a_pod_without_its_namespace_yet_is_retried_with_bounded_backoff_until_deleted() {
    let mut h = Harness::new();
    let web = pod("web", true);
    let not_yet = Answer::Fails("no sandbox names an HNS namespace");
    h.node.script(&web.uid, &vec![not_yet; 20]);
    h.upsert(web.clone(), 0);
    h.sync();
    let mut at = 0u64;
    let mut delays = Vec::new();
    for _ in 0..10 {
        h.step(at).await;
        let due = h.due_in_ms().unwrap() as u64;
        // Not retried before it is due.
        let captures = h.node.state().captures.len();
        h.step(due - 1).await;
        assert_eq!(h.node.state().captures.len(), captures);
        delays.push(due - at);
        at = due;
    }
    assert_eq!(
        delays,
        [
            500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000, 30_000
        ]
    );
    let st = h.d.status()[&web.uid].clone();
    assert_eq!(st.phase, Phase::Capturing);
    assert!(
        st.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("pod demo/web: ") && e.contains("no sandbox")),
        "{st:?}"
    );
    assert!(h.zt.state().adds.is_empty());
    assert_eq!(
        h.annotation("web"),
        None,
        "never enabled, nothing to mark pending"
    );

    // Deleting it cancels the retry: nothing due, no capture, no Add ever after.
    h.delete(&web, at);
    h.step(at).await;
    let captures = h.node.state().captures.len();
    assert!(h.d.status().is_empty());
    assert_eq!(h.d.next_due(), None);
    h.step(at + 3_600_000).await;
    assert_eq!(h.node.state().captures.len(), captures);
    assert!(h.zt.state().adds.is_empty());
    assert!(
        h.node.state().releases.is_empty(),
        "no policies were put on"
    );
}

#[tokio::test]
async fn a_pod_that_becomes_ready_after_retries_is_enrolled_with_the_compartment_hns_has_now() {
    let mut h = Harness::new();
    let web = pod("web", true);
    h.node.script(
        &web.uid,
        &[
            Answer::Fails("no sandbox names an HNS namespace"),
            Answer::Captured(hns(1, 0)),
            Answer::Captured(hns(1, 9)),
        ],
    );
    h.zt.state().nacks.insert(web.uid.clone(), 1);
    h.upsert(web.clone(), 0);
    h.sync();
    h.step(0).await;
    assert_eq!(h.annotation("web"), None);
    h.step(500).await;
    // Policies on, ztunnel NACKed (no compartment yet): partially enrolled.
    assert_eq!(h.annotation("web").as_deref(), Some(PENDING));
    assert_eq!(h.due_in_ms(), Some(1_500));
    h.step(1_500).await;
    let adds: Vec<u32> =
        h.zt.state()
            .adds
            .iter()
            .map(|w| w.hns.compartment)
            .collect();
    assert_eq!(adds, vec![0, 9], "each attempt asks HNS again");
    assert_eq!(h.annotation("web").as_deref(), Some(ENABLED));
    assert_eq!(h.d.status()[&web.uid].last_error, None);
}

/// Every step that can fail: the pod is reported, retried, and never annotated `enabled`.
#[tokio::test]
async fn no_pod_is_annotated_enabled_unless_its_policies_and_zds_add_succeeded() {
    struct Case {
        what: &'static str,
        setup: fn(&mut Harness, &Pod),
        error: &'static str,
        annotation: Option<&'static str>,
    }
    let cases = [
        Case {
            what: "runtime unreachable",
            setup: |h, _| h.node.state().runtime_down = true,
            error: "container runtime: runtime down",
            annotation: None,
        },
        Case {
            what: "HNS namespace unreadable",
            setup: |h, p| {
                h.node
                    .script(&p.uid, &[Answer::Fails("HcnOpenNamespace: HRESULT")])
            },
            error: "HcnOpenNamespace",
            annotation: None,
        },
        Case {
            what: "policies not on every endpoint",
            setup: |h, p| {
                h.node
                    .script(&p.uid, &[Answer::Fails("endpoint E: HcnModifyEndpoint")])
            },
            error: "HcnModifyEndpoint",
            annotation: None,
        },
        Case {
            what: "ztunnel NACK",
            setup: |h, p| {
                h.node.script(&p.uid, &[Answer::Captured(hns(1, 7))]);
                h.zt.state().nacks.insert(p.uid.clone(), 1);
            },
            error: "ZDS Add of namespace",
            annotation: Some(PENDING),
        },
        Case {
            what: "stale enabled from an earlier agent, capture fails",
            setup: |h, p| {
                use futures_util::FutureExt;
                let write = h.source.local.annotate(NS, &p.name, Some(ENABLED));
                write.now_or_never().unwrap().unwrap();
                let stored = h.source.local.pod(NS, &p.name).unwrap();
                h.d.handle(PodEvent::Pod(stored), h.at(0));
            },
            error: "no sandbox",
            annotation: Some(PENDING),
        },
    ];
    for case in cases {
        let mut h = Harness::new();
        let web = pod("web", true);
        h.upsert(web.clone(), 0);
        (case.setup)(&mut h, &web);
        let before = h.source.local.annotation_log().len();
        h.sync();
        h.step(0).await;
        let st = h.d.status()[&web.uid].clone();
        assert_eq!(
            (st.phase.clone(), st.failures),
            (Phase::Capturing, 1),
            "{}",
            case.what
        );
        let error = st.last_error.unwrap_or_default();
        assert!(
            error.starts_with("pod demo/web: ") && error.contains(case.error),
            "{}: {error}",
            case.what
        );
        assert_eq!(
            h.annotation("web").as_deref(),
            case.annotation,
            "{}",
            case.what
        );
        let log = h.source.local.annotation_log()[before..].to_vec();
        assert!(
            !log.iter().any(|(_, _, v)| v.as_deref() == Some(ENABLED)),
            "{}: {log:?}",
            case.what
        );
        assert!(h.d.next_due().is_some(), "{}: retried", case.what);
    }
}

#[tokio::test]
async fn an_annotation_write_that_fails_is_retried_without_a_second_add() {
    let mut h = Harness::new();
    let web = pod("web", true);
    h.node.script(&web.uid, &[Answer::Captured(hns(1, 7))]);
    *h.source.failing.lock().unwrap() = 1;
    h.upsert(web.clone(), 0);
    h.sync();
    h.step(0).await;
    let st = h.d.status()[&web.uid].clone();
    assert_eq!(st.phase, Phase::Annotating);
    assert!(
        st.last_error
            .unwrap_or_default()
            .contains("annotating enabled")
    );
    assert_eq!(h.annotation("web"), None);
    h.step(500).await;
    assert_eq!(h.annotation("web").as_deref(), Some(ENABLED));
    assert_eq!(h.zt.state().adds.len(), 1);
    assert_eq!(h.node.state().captures.len(), 1);
}

#[tokio::test]
async fn a_ztunnel_reconnect_gets_the_snapshot_and_unacked_pods_are_retried_at_once() {
    let mut h = Harness::new();
    let (a, b, c) = (pod("a", true), pod("b", true), pod("c", true));
    h.node.script(&a.uid, &[Answer::Captured(hns(1, 1))]);
    h.node.script(&b.uid, &vec![Answer::Captured(hns(2, 2)); 2]);
    h.node.script(&c.uid, &[Answer::Captured(hns(3, 3))]);
    h.zt.state().nacks.insert(b.uid.clone(), 1);
    for p in [&a, &b, &c] {
        h.upsert(p.clone(), 0);
    }
    h.sync();
    h.step(0).await;
    h.delete(&c, 1);
    h.step(1).await;
    assert_eq!(h.annotation("a").as_deref(), Some(ENABLED));
    assert_eq!(h.annotation("b").as_deref(), Some(PENDING));
    assert_eq!(h.due_in_ms(), Some(500));

    // ztunnel reconnects: the snapshot holds exactly the live pods ztunnel was told about
    // (a enrolled, b unacked), not the deleted c; b is retried now, not at 500 ms.
    assert_eq!(
        h.zt.snapshot(),
        BTreeSet::from([a.uid.clone(), b.uid.clone()])
    );
    h.d.reconnected(h.at(3));
    assert_eq!(h.due_in_ms(), Some(3));
    h.step(3).await;
    assert_eq!(h.annotation("b").as_deref(), Some(ENABLED));
    assert_eq!(h.phase("a"), Some(Phase::Enrolled));
    assert_eq!(
        h.zt.state().adds.len(),
        4,
        "a, b, c, then b again; a only by the snapshot"
    );
}

#[tokio::test]
async fn a_pod_whose_namespace_labels_decide_waits_for_the_namespace() {
    let mut h = Harness::new();
    let mut web = pod("web", false);
    web.namespace = "late".into();
    h.source.local.upsert_pod(web.clone());
    h.d.handle(PodEvent::Pod(web.clone()), h.at(0));
    h.d.handle(PodEvent::Synced, h.at(0));
    assert!(h.d.status().is_empty(), "no namespace labels yet");
    h.d.handle(
        PodEvent::Namespace(Namespace {
            name: "late".into(),
            labels: [("istio.io/dataplane-mode".into(), "ambient".into())].into(),
        }),
        h.at(1),
    );
    assert_eq!(h.phase("web"), Some(Phase::Capturing));
    h.d.handle(PodEvent::NamespaceDeleted("late".into()), h.at(2));
    assert!(h.d.status().is_empty(), "{:?}", h.d.status());
}

#[tokio::test(start_paused = true)]
async fn run_enrols_from_the_watch_and_stops_on_shutdown() {
    let node = FakeNode::default();
    let zt = FakeZtunnel::default();
    let source = Source::default();
    let web = pod("web", true);
    node.script(
        &web.uid,
        &[Answer::Fails("not yet"), Answer::Captured(hns(1, 4))],
    );
    source.local.upsert_pod(web.clone());
    let enablement = Enablement {
        selectors: default_selectors(),
        exclude_namespaces: vec![],
        system_namespace: "istio-system".into(),
    };
    let d = Daemon::new(
        node,
        zt.clone(),
        source.clone(),
        enablement,
        Backoff::default(),
    );
    let (_snap_tx, snapshots) = watch::channel(0u64);
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(run(d, snapshots, shutdown));
    ambit_testkit::eventually("web enrolled", Duration::from_secs(10), || {
        source.local.redirection(NS, "web").as_deref() == Some(ENABLED)
    })
    .await;
    stop.send_replace(true);
    assert!(task.await.unwrap().is_ok());
    assert_eq!(zt.state().adds.len(), 1);
}
