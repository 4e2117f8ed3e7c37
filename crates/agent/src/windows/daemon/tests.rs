//! The daemon loop over fakes: a scripted runtime ([`FakeNode`]) over a fake HNS (namespaces,
//! endpoints and their policies, every read and write recorded; a capture and a verification
//! go through the same per-endpoint plan as on Windows), a ztunnel that acks or NACKs and
//! keeps the snapshot cache as the ZDS server does ([`FakeZtunnel`]), and the in-memory pod
//! source (annotations), with a switch to make annotation writes fail.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_netns::guid::Guid;
use ambit_netns::hns::HnsNamespace;
use ambit_redirect::hns::{
    EndpointError, HnsEndpoints, L4WfpProxySettings, POLICY_TYPE, WfpPolicyConfig, policies,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::*;
use crate::enrol::{Enablement, default_selectors};
use crate::pods::{LocalPodSource, Namespace, PodPhase, SourceError};
use crate::windows::running::{self, NamespaceLookup};

/// The health and metrics servers over this daemon.
mod monitoring;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
struct FakeError(String);

/// What the fake runtime answers for one pod's next capture.
#[derive(Debug, Clone)]
enum Answer {
    Captured(PodNamespace),
    Fails(&'static str),
}

/// One HNS call the fake answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HnsCall {
    /// Namespace properties read.
    Namespace(Guid),
    /// Endpoint properties read.
    Endpoint(Guid),
    /// `HcnModifyEndpoint` with this `RequestType` (`Add` / `Remove`).
    Modify(Guid, String),
}

/// HNS as far as the agent sees it: namespaces with their endpoints, and each endpoint's
/// policies as HNS would list them.
#[derive(Debug, Default)]
struct FakeHns {
    namespaces: BTreeMap<Guid, HnsNamespace>,
    policies: BTreeMap<Guid, Vec<Value>>,
    calls: Vec<HnsCall>,
    /// The next namespace reads that fail (not as "not found").
    namespace_fails: u32,
    /// Per endpoint, how many of its next property reads fail.
    endpoint_fails: BTreeMap<Guid, u32>,
    /// Per endpoint, how many of its next modifications fail.
    modify_fails: BTreeMap<Guid, u32>,
}

#[derive(Debug, Default)]
struct NodeState {
    /// Per pod UID, the answers still to give; an exhausted script keeps failing.
    script: BTreeMap<String, VecDeque<Answer>>,
    runtime_down: bool,
    release_fails: u32,
    /// Per pod UID, the namespace of the sandbox the runtime runs for it (for `locate`).
    sandboxes: BTreeMap<String, Guid>,
    /// The next `locate` calls that fail (a runtime that cannot describe the sandbox).
    locate_fails: u32,
    locates: Vec<String>,
    captures: Vec<BTreeSet<String>>,
    releases: Vec<Guid>,
    hns: FakeHns,
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
    /// HNS gets namespace `n` with `endpoints` (none carrying policies yet).
    fn hns_namespace(&self, n: u128, compartment: u32, endpoints: &[u128]) {
        let ns = HnsNamespace {
            id: guid(n),
            compartment: Some(compartment),
            endpoints: endpoints.iter().map(|&e| endpoint(e)).collect(),
        };
        let mut st = self.state();
        for &ep in &ns.endpoints {
            st.hns.policies.entry(ep).or_default();
        }
        st.hns.namespaces.insert(guid(n), ns);
    }
    /// The HNS calls answered so far.
    fn calls(&self) -> Vec<HnsCall> {
        self.state().hns.calls.clone()
    }
    /// The modifications among them, as (endpoint, request type).
    fn writes(&self) -> Vec<(Guid, String)> {
        (self.calls().into_iter())
            .filter_map(|c| match c {
                HnsCall::Modify(ep, kind) => Some((ep, kind)),
                _ => None,
            })
            .collect()
    }
    /// The endpoint's `L4WFPPROXY` settings as HNS holds them.
    fn settings_on(&self, ep: u128) -> Vec<L4WfpProxySettings> {
        let st = self.state();
        (st.hns.policies.get(&endpoint(ep)).into_iter().flatten())
            .map(|p| L4WfpProxySettings::deserialize(p["Settings"].clone()).unwrap())
            .collect()
    }
}

fn endpoint(n: u128) -> Guid {
    Guid::from_u128(0xe000 + n)
}

/// The settings a capture puts on every endpoint.
fn planned() -> Vec<L4WfpProxySettings> {
    policies(&WfpPolicyConfig::default()).to_vec()
}

#[derive(Debug, thiserror::Error)]
enum HnsError {
    #[error("HcnOpenNamespace: element not found")]
    NotFound,
    #[error("HcnQueryNamespaceProperties: RPC server unavailable")]
    Unavailable,
}

impl NamespaceLookup for FakeNode {
    type Error = HnsError;
    fn namespace(&self, guid: Guid) -> Result<HnsNamespace, HnsError> {
        let mut st = self.state();
        st.hns.calls.push(HnsCall::Namespace(guid));
        if st.hns.namespace_fails > 0 {
            st.hns.namespace_fails -= 1;
            return Err(HnsError::Unavailable);
        }
        st.hns
            .namespaces
            .get(&guid)
            .cloned()
            .ok_or(HnsError::NotFound)
    }
    fn is_gone(&self, e: &HnsError) -> bool {
        matches!(e, HnsError::NotFound)
    }
}

fn countdown(map: &mut BTreeMap<Guid, u32>, ep: Guid) -> bool {
    match map.get_mut(&ep).filter(|n| **n > 0) {
        Some(n) => {
            *n -= 1;
            true
        }
        None => false,
    }
}

impl HnsEndpoints for FakeNode {
    fn properties(&self, ep: Guid) -> Result<String, EndpointError> {
        let mut st = self.state();
        st.hns.calls.push(HnsCall::Endpoint(ep));
        if countdown(&mut st.hns.endpoint_fails, ep) {
            return Err(EndpointError::Failed {
                call: "query",
                endpoint: ep,
                message: "HRESULT 0x800706ba".into(),
            });
        }
        let policies = st.hns.policies.get(&ep).ok_or(EndpointError::Gone(ep))?;
        Ok(json!({"ID": ep.to_string(), "Policies": policies}).to_string())
    }

    fn modify(&self, ep: Guid, settings: &str) -> Result<(), EndpointError> {
        let req: Value = serde_json::from_str(settings).unwrap();
        let kind = req["RequestType"].as_str().unwrap().to_owned();
        let mut st = self.state();
        st.hns.calls.push(HnsCall::Modify(ep, kind.clone()));
        if countdown(&mut st.hns.modify_fails, ep) {
            return Err(EndpointError::Failed {
                call: "modify",
                endpoint: ep,
                message: "HRESULT 0x80070005".into(),
            });
        }
        let have = st
            .hns
            .policies
            .get_mut(&ep)
            .ok_or(EndpointError::Gone(ep))?;
        let sent = req["Settings"]["Policies"].as_array().unwrap();
        match kind.as_str() {
            "Add" => have.extend(sent.iter().cloned()),
            "Remove" => have.retain(|p| !sent.contains(p)),
            other => panic!("unexpected request type {other}"),
        }
        Ok(())
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
                    // A namespace HNS knows gets the policies as on Windows.
                    Some(Answer::Captured(ns)) if st.hns.namespaces.contains_key(&ns.guid) => {
                        let found = st.hns.namespaces[&ns.guid].clone();
                        drop(st);
                        let applied = running::capture(&*self, &found, &WfpPolicyConfig::default());
                        st = self.state();
                        applied.map(|_| ns).map_err(|e| FakeError(e.to_string()))
                    }
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
    fn verify(&mut self, ns: &PodNamespace) -> Check<FakeError> {
        running::verify_namespace(&*self, &*self, ns.guid, &WfpPolicyConfig::default())
            .map_err(|e| FakeError(e.to_string()))
    }
    fn locate(
        &mut self,
        uid: &str,
    ) -> impl Future<Output = Result<Option<PodNamespace>, FakeError>> + Send {
        let mut st = self.state();
        st.locates.push(uid.to_owned());
        let out = if st.runtime_down {
            Err(FakeError("runtime down".into()))
        } else if st.locate_fails > 0 {
            st.locate_fails -= 1;
            Err(FakeError("sandbox s1: PodSandboxStatus: deadline".into()))
        } else {
            Ok(st.sandboxes.get(uid).map(|&guid| PodNamespace {
                guid,
                compartment: ambit_contract::windows::NO_COMPARTMENT,
            }))
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

/// A daemon over the fakes (default selectors, `kube-system` excluded), verifying every
/// `interval`.
fn daemon(
    node: &FakeNode,
    zt: &FakeZtunnel,
    source: &Source,
    interval: Option<Duration>,
) -> Daemon<FakeNode, FakeZtunnel, Source> {
    let enablement = Enablement {
        selectors: default_selectors(),
        exclude_namespaces: vec!["kube-system".into()],
        system_namespace: "istio-system".into(),
    };
    Daemon::new(
        node.clone(),
        zt.clone(),
        source.clone(),
        enablement,
        Backoff::default(),
    )
    .with_verification(interval)
}

struct Harness {
    node: FakeNode,
    zt: FakeZtunnel,
    source: Source,
    d: Daemon<FakeNode, FakeZtunnel, Source>,
    t0: Instant,
}

/// The verification period of [`Harness::verifying`].
const PERIOD_MS: u64 = 10_000;

impl Harness {
    fn new() -> Self {
        Self::with_verification(None)
    }

    /// Verifying every [`PERIOD_MS`].
    fn verifying() -> Self {
        Self::with_verification(Some(Duration::from_millis(PERIOD_MS)))
    }

    fn with_verification(interval: Option<Duration>) -> Self {
        let node = FakeNode::default();
        let zt = FakeZtunnel::default();
        let source = Source::default();
        source.local.upsert_namespace(Namespace {
            name: NS.into(),
            labels: BTreeMap::new(),
        });
        let d = daemon(&node, &zt, &source, interval);
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

    /// The API server's copy of pod `name` gets the redirection annotation `value` (as an
    /// earlier agent wrote it); the daemon is not told.
    fn annotate_stored(&self, name: &str, value: &str) {
        use futures_util::FutureExt;
        let write = self.source.local.annotate(NS, name, Some(value));
        write.now_or_never().unwrap().unwrap();
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
                h.annotate_stored(&p.name, ENABLED);
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
    let d = daemon(&node, &zt, &source, None);
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

// ---- Verification passes ----

/// Enrols each `(name, namespace, endpoints)` at 0 (HNS holding the namespace, the capture
/// putting the policies on) and forgets the HNS calls the captures made.
async fn enrol_all(h: &mut Harness, pods: &[(&str, u128, &[u128])]) -> Vec<Pod> {
    let mut out = Vec::new();
    for &(name, n, eps) in pods {
        let p = pod(name, true);
        h.node.hns_namespace(n, n as u32, eps);
        h.node.script(&p.uid, &[Answer::Captured(hns(n, n as u32))]);
        h.upsert(p.clone(), 0);
        out.push(p);
    }
    h.sync();
    h.step(0).await;
    for &(name, ..) in pods {
        assert_eq!(h.phase(name), Some(Phase::Enrolled), "{name}");
    }
    h.node.state().hns.calls.clear();
    out
}

/// Steps at `ms` until a pass completes there (one pod per step); how many steps it took.
async fn pass_at(h: &mut Harness, ms: u64) -> usize {
    let before = h.d.verification().passes;
    for steps in 1..=100 {
        h.step(ms).await;
        if h.d.verification().passes > before {
            assert_eq!(h.d.verification().passes, before + 1);
            return steps;
        }
    }
    panic!("no pass completed at {ms} ms");
}

fn l4(ep: u128, at: &FakeNode) -> Vec<Value> {
    at.state().hns.policies[&endpoint(ep)].clone()
}

/// Changes endpoint `ep`'s policies in HNS out of band.
fn edit_policies(n: &FakeNode, ep: u128, edit: impl FnOnce(&mut Vec<Value>)) {
    edit(n.state().hns.policies.get_mut(&endpoint(ep)).unwrap());
}

/// Out-of-band changes to an enrolled pod's HNS state, and what one pass must write (only on
/// the endpoint that differs) and report.
#[tokio::test]
async fn a_pass_repairs_only_the_endpoints_that_differ_from_the_plan() {
    use RepairKind::{PoliciesAdded as Added, PoliciesReplaced as Replaced};
    type Change = fn(&FakeNode);
    // (what, the change, the repairs (endpoint, kind), the namespace's endpoints after it).
    type Case = (
        &'static str,
        Change,
        &'static [(u128, RepairKind)],
        &'static [u128],
    );
    // An endpoint that lacked the policies gets them added; one whose policies differ has
    // them removed and added again.
    let writes_of = |kind| match kind {
        Added => &["Add"][..],
        _ => &["Remove", "Add"][..],
    };
    let cases: [Case; 7] = [
        ("unchanged", |_| {}, &[], &[1, 2]),
        (
            "both policies removed out of band from one endpoint",
            |n| edit_policies(n, 2, Vec::clear),
            &[(2, Added)],
            &[1, 2],
        ),
        (
            "one of the two policies removed",
            |n| edit_policies(n, 1, |p| p.truncate(1)),
            &[(1, Replaced)],
            &[1, 2],
        ),
        (
            "stale settings (another inbound port)",
            |n| {
                edit_policies(n, 2, |p| {
                    p[1]["Settings"]["InboundProxyPort"] = json!("15007")
                })
            },
            &[(2, Replaced)],
            &[1, 2],
        ),
        (
            "a policy of another type added (not ours to judge)",
            |n| {
                edit_policies(n, 1, |p| {
                    p.push(json!({"Type": "ACL", "Settings": {"Action": "Allow"}}))
                })
            },
            &[],
            &[1, 2],
        ),
        (
            "an endpoint joined the namespace",
            |n| {
                let mut st = n.state();
                st.hns.policies.insert(endpoint(3), Vec::new());
                let ns = st.hns.namespaces.get_mut(&guid(1)).unwrap();
                ns.endpoints.push(endpoint(3));
            },
            &[(3, Added)],
            &[1, 2, 3],
        ),
        (
            "an endpoint vanished (still listed)",
            |n| drop(n.state().hns.policies.remove(&endpoint(2))),
            &[],
            &[1],
        ),
    ];
    for (what, change, case_repairs, endpoints) in cases {
        let mut h = Harness::verifying();
        enrol_all(&mut h, &[("web", 1, &[1, 2])]).await;
        change(&h.node);
        pass_at(&mut h, PERIOD_MS).await;

        let calls = h.node.calls();
        assert_eq!(calls[0], HnsCall::Namespace(guid(1)), "{what}: re-read");
        let read: Vec<Guid> = (calls.iter())
            .filter_map(|c| match c {
                HnsCall::Endpoint(ep) => Some(*ep),
                _ => None,
            })
            .collect();
        let listed: Vec<Guid> = h.node.state().hns.namespaces[&guid(1)].endpoints.clone();
        assert_eq!(read, listed, "{what}: every endpoint HNS lists is read");
        let want: Vec<(Guid, String)> = (case_repairs.iter())
            .flat_map(|&(ep, kind)| {
                writes_of(kind)
                    .iter()
                    .map(move |w| (endpoint(ep), (*w).to_owned()))
            })
            .collect();
        assert_eq!(h.node.writes(), want, "{what}");
        let repairs: Vec<Repair> = (case_repairs.iter())
            .map(|&(ep, kind)| Repair {
                pod: "demo/web".into(),
                namespace: guid(1),
                endpoint: Some(endpoint(ep)),
                kind,
            })
            .collect();
        assert_eq!(h.d.last_pass().repairs, repairs, "{what}");
        for r in &repairs {
            let line = r.to_string();
            assert!(
                line.contains("demo/web") && line.contains(&r.endpoint.unwrap().to_string()),
                "{what}: the log line names pod and endpoint: {line}"
            );
        }
        assert_eq!(
            h.d.verification(),
            VerifyCounters {
                passes: 1,
                repairs: repairs.len() as u64,
                unprotected: 0
            },
            "{what}"
        );
        for &ep in endpoints {
            let ours: Vec<L4WfpProxySettings> = (l4(ep, &h.node).into_iter())
                .filter(|p| p["Type"] == POLICY_TYPE)
                .map(|p| L4WfpProxySettings::deserialize(p["Settings"].clone()).unwrap())
                .collect();
            assert_eq!(ours, planned(), "{what}: endpoint {ep} as planned");
        }
        assert_eq!(h.phase("web"), Some(Phase::Enrolled), "{what}");
        assert_eq!(h.annotation("web").as_deref(), Some(ENABLED), "{what}");
        assert_eq!(
            h.zt.state().adds.len(),
            1,
            "{what}: ztunnel is not told again"
        );

        // The repair holds: the next pass writes nothing.
        h.node.state().hns.calls.clear();
        pass_at(&mut h, 2 * PERIOD_MS).await;
        assert_eq!(h.node.writes(), vec![], "{what}: second pass");
        assert!(!h.node.calls().is_empty(), "{what}: second pass reads");
        assert_eq!(h.d.last_pass(), &PassReport::default(), "{what}");
        assert_eq!(h.d.verification().repairs, repairs.len() as u64, "{what}");
    }
}

#[tokio::test]
async fn a_pod_whose_namespace_vanished_is_captured_again_and_the_pass_goes_on() {
    let mut h = Harness::verifying();
    let pods = enrol_all(&mut h, &[("a", 1, &[1]), ("b", 2, &[2]), ("c", 3, &[3])]).await;
    let b = &pods[1];
    // b's sandbox was re-created: HNS forgot namespace 2 and has namespace 4 for it; c lost
    // its policies out of band.
    h.node.script(&b.uid, &[Answer::Captured(hns(4, 5))]);
    {
        let mut st = h.node.state();
        st.hns.namespaces.remove(&guid(2));
        st.hns.policies.remove(&endpoint(2));
        st.hns.policies.get_mut(&endpoint(3)).unwrap().clear();
    }
    h.node.hns_namespace(4, 5, &[4]);
    let annotations = h.source.local.annotation_log().len();

    pass_at(&mut h, PERIOD_MS).await;
    let report = h.d.last_pass().clone();
    assert_eq!(
        report.repairs,
        vec![
            Repair {
                pod: "demo/b".into(),
                namespace: guid(2),
                endpoint: None,
                kind: RepairKind::Recapture,
            },
            Repair {
                pod: "demo/c".into(),
                namespace: guid(3),
                endpoint: Some(endpoint(3)),
                kind: RepairKind::PoliciesAdded,
            },
        ],
        "c is still checked after b's namespace was found gone"
    );
    assert_eq!(
        report.unprotected.keys().collect::<Vec<_>>(),
        [&b.uid],
        "{report:?}"
    );
    let why = &report.unprotected[&b.uid];
    assert!(
        why.contains("demo/b") && why.contains(&guid(2).to_string()) && why.contains("gone"),
        "{why}"
    );
    assert_eq!(
        h.d.verification(),
        VerifyCounters {
            passes: 1,
            repairs: 2,
            unprotected: 1
        }
    );
    // b's re-capture (the step after its check, before c's check) and c's repair.
    assert_eq!(
        h.node.writes(),
        vec![
            (endpoint(4), "Add".to_owned()),
            (endpoint(3), "Add".to_owned())
        ]
    );

    // b was captured again (the runtime asked, the new namespace's endpoint given the
    // policies, ztunnel sent the new namespace), and still says enabled: no writes.
    let adds = h.zt.state().adds.clone();
    let last = adds.last().unwrap();
    assert_eq!((last.uid.as_str(), last.hns), (b.uid.as_str(), hns(4, 5)));
    assert_eq!(h.node.settings_on(4), planned());
    assert_eq!(h.phase("b"), Some(Phase::Enrolled));
    assert_eq!(h.source.local.annotation_log().len(), annotations);

    // The next pass checks b's new namespace and finds all three as planned.
    h.node.state().hns.calls.clear();
    pass_at(&mut h, 2 * PERIOD_MS).await;
    assert!(h.node.calls().contains(&HnsCall::Namespace(guid(4))));
    assert!(!h.node.calls().contains(&HnsCall::Namespace(guid(2))));
    assert_eq!(h.node.writes(), vec![]);
    assert_eq!(h.d.verification().unprotected, 0);
}

#[tokio::test]
async fn a_pod_whose_namespace_vanished_and_has_no_new_sandbox_is_marked_pending() {
    let mut h = Harness::verifying();
    enrol_all(&mut h, &[("web", 1, &[1])]).await;
    h.node.state().hns.namespaces.remove(&guid(1));
    pass_at(&mut h, PERIOD_MS).await;
    // The re-capture runs on the next step; the runtime names no sandbox now.
    h.step(PERIOD_MS).await;
    let st = h.d.status()["uid-web"].clone();
    assert_eq!((st.phase, st.failures), (Phase::Capturing, 1));
    assert_eq!(h.annotation("web").as_deref(), Some(PENDING));
}

/// HNS failing during a pass: the pod is reported and counted unprotected, not written to
/// blindly, left enrolled, and checked again (and repaired) on the next pass, not before.
#[tokio::test]
async fn an_hns_failure_leaves_the_pod_unprotected_until_the_next_pass() {
    struct Case {
        what: &'static str,
        fail: fn(&FakeNode),
        error: &'static str,
        /// Writes of the failing pass.
        writes: &'static [(u128, &'static str)],
        /// Repairs it made all the same (on the endpoints that answered).
        repairs: &'static [u128],
        /// Repairs of the next pass.
        then: &'static [u128],
    }
    let cases = [
        Case {
            what: "namespace unreadable",
            fail: |n| n.state().hns.namespace_fails = 1,
            error: "RPC server unavailable",
            writes: &[],
            repairs: &[],
            then: &[],
        },
        Case {
            what: "one endpoint unreadable",
            fail: |n| {
                n.state().hns.endpoint_fails.insert(endpoint(2), 1);
                edit_policies(n, 1, Vec::clear);
            },
            error: "query on endpoint",
            // The other endpoint is still checked and repaired.
            writes: &[(1, "Add")],
            repairs: &[1],
            then: &[],
        },
        Case {
            what: "repair refused",
            fail: |n| {
                edit_policies(n, 1, Vec::clear);
                n.state().hns.modify_fails.insert(endpoint(1), 1);
            },
            error: "modify on endpoint",
            writes: &[(1, "Add")],
            repairs: &[],
            then: &[1],
        },
    ];
    for case in cases {
        let what = case.what;
        let mut h = Harness::verifying();
        let web = enrol_all(&mut h, &[("web", 1, &[1, 2])]).await.remove(0);
        (case.fail)(&h.node);
        pass_at(&mut h, PERIOD_MS).await;
        let want: Vec<(Guid, String)> = (case.writes.iter())
            .map(|&(ep, kind)| (endpoint(ep), kind.to_owned()))
            .collect();
        assert_eq!(h.node.writes(), want, "{what}");
        let repaired = |h: &Harness| -> Vec<Guid> {
            (h.d.last_pass().repairs.iter())
                .map(|r| r.endpoint.unwrap())
                .collect()
        };
        let eps = |e: &[u128]| -> Vec<Guid> { e.iter().map(|&e| endpoint(e)).collect() };
        assert_eq!(repaired(&h), eps(case.repairs), "{what}");
        assert_eq!(h.d.verification().repairs, case.repairs.len() as u64);
        assert_eq!(h.d.verification().unprotected, 1, "{what}");
        let why = h.d.last_pass().unprotected.get(&web.uid).cloned();
        assert!(
            why.as_deref()
                .is_some_and(|w| w.starts_with("pod demo/web: ") && w.contains(case.error)),
            "{what}: {why:?}"
        );
        let st = h.d.status()[&web.uid].clone();
        assert_eq!(st.phase, Phase::Enrolled, "{what}");
        assert_eq!(st.last_error, why, "{what}");
        assert_eq!(h.annotation("web").as_deref(), Some(ENABLED), "{what}");
        assert_eq!(h.due_in_ms(), Some(2 * PERIOD_MS as u128), "{what}");
        let calls = h.node.calls().len();
        h.step(2 * PERIOD_MS - 1).await;
        assert_eq!(h.node.calls().len(), calls, "{what}: not retried early");

        pass_at(&mut h, 2 * PERIOD_MS).await;
        assert!(h.node.calls().len() > calls, "{what}: retried");
        assert_eq!(repaired(&h), eps(case.then), "{what}: next pass");
        assert_eq!(h.d.verification().unprotected, 0, "{what}");
        assert_eq!(h.d.status()[&web.uid].last_error, None, "{what}");
        for ep in [1, 2] {
            assert_eq!(h.node.settings_on(ep), planned(), "{what}: endpoint {ep}");
        }
    }
}

#[tokio::test]
async fn passes_start_one_period_after_the_last_ended_never_early_and_none_skipped() {
    let mut h = Harness::verifying();
    enrol_all(&mut h, &[("web", 1, &[1])]).await;
    let namespace_reads = |h: &Harness| {
        (h.node.calls().iter())
            .filter(|c| matches!(c, HnsCall::Namespace(_)))
            .count()
    };
    // On time, five times over; then late, and the next one is a period after that.
    let mut at = 0;
    for pass in 1..=5 {
        assert_eq!(
            h.due_in_ms(),
            Some(at as u128 + PERIOD_MS as u128),
            "pass {pass}"
        );
        at += PERIOD_MS;
        h.step(at - 1).await;
        assert_eq!(namespace_reads(&h), pass - 1, "pass {pass} not early");
        assert_eq!(pass_at(&mut h, at).await, 1, "one pod, one step");
        assert_eq!(namespace_reads(&h), pass, "pass {pass}");
    }
    let late = at + PERIOD_MS + 2_345;
    pass_at(&mut h, late).await;
    assert_eq!(namespace_reads(&h), 6);
    assert_eq!(h.due_in_ms(), Some((late + PERIOD_MS) as u128));
    assert_eq!(h.d.verification().passes, 6);

    // Off (AMBIT_VERIFY_INTERVAL=0): nothing is ever due, nothing read.
    let mut off = Harness::new();
    enrol_all(&mut off, &[("web", 1, &[1])]).await;
    assert_eq!(off.d.next_due(), None);
    off.step(3_600_000).await;
    assert!(off.node.calls().is_empty());
    assert_eq!(off.d.verification(), VerifyCounters::default());
}

#[tokio::test]
async fn a_pass_over_no_pods_completes_and_the_next_is_a_period_later() {
    let mut h = Harness::verifying();
    h.sync();
    assert_eq!(h.due_in_ms(), Some(PERIOD_MS as u128));
    h.step(PERIOD_MS).await;
    assert_eq!(h.d.verification().passes, 1);
    assert_eq!(h.due_in_ms(), Some(2 * PERIOD_MS as u128));
    assert!(h.node.calls().is_empty());
}

#[tokio::test]
async fn a_new_pod_waits_for_at_most_one_pods_check_of_a_pass() {
    let mut h = Harness::verifying();
    enrol_all(&mut h, &[("a", 1, &[1]), ("b", 2, &[2]), ("c", 3, &[3])]).await;
    let checked = |h: &Harness| -> Vec<Guid> {
        (h.node.calls().iter())
            .filter_map(|c| match c {
                HnsCall::Namespace(g) => Some(*g),
                _ => None,
            })
            .collect()
    };
    h.step(PERIOD_MS).await;
    assert_eq!(checked(&h), [guid(1)], "one pod per step");
    assert_eq!(
        h.due_in_ms(),
        Some(PERIOD_MS as u128),
        "the pass goes on at once"
    );

    // A new pod arrives mid-pass: the next step enrols it, and checks only one more pod.
    let d = pod("d", true);
    h.node.hns_namespace(4, 4, &[4]);
    h.node.script(&d.uid, &[Answer::Captured(hns(4, 4))]);
    h.upsert(d, PERIOD_MS);
    h.step(PERIOD_MS).await;
    assert_eq!(h.annotation("d").as_deref(), Some(ENABLED));
    assert_eq!(checked(&h), [guid(1), guid(2)]);
    h.step(PERIOD_MS).await;
    assert_eq!(checked(&h), [guid(1), guid(2), guid(3)]);
    assert_eq!(h.d.verification().passes, 1, "d joins the next pass");
    pass_at(&mut h, 2 * PERIOD_MS).await;
    assert!(checked(&h).contains(&guid(4)));
}

#[tokio::test]
async fn a_pod_released_during_a_pass_is_not_checked() {
    let mut h = Harness::verifying();
    let pods = enrol_all(&mut h, &[("a", 1, &[1]), ("b", 2, &[2])]).await;
    h.step(PERIOD_MS).await;
    h.delete(&pods[1], PERIOD_MS);
    h.step(PERIOD_MS).await;
    assert_eq!(h.d.verification().passes, 1);
    assert!(!h.node.calls().contains(&HnsCall::Namespace(guid(2))));
    assert_eq!(h.node.state().releases, vec![guid(2)]);
}

#[tokio::test(start_paused = true)]
async fn run_repairs_policies_removed_out_of_band_on_the_next_pass() {
    let node = FakeNode::default();
    let zt = FakeZtunnel::default();
    let source = Source::default();
    let web = pod("web", true);
    node.hns_namespace(1, 1, &[1, 2]);
    node.script(&web.uid, &[Answer::Captured(hns(1, 1))]);
    source.local.upsert_pod(web.clone());
    let d = daemon(&node, &zt, &source, Some(Duration::from_secs(10)));
    let (_snap_tx, snapshots) = watch::channel(0u64);
    let (stop, shutdown) = watch::channel(false);
    let started = Instant::now();
    let task = tokio::spawn(run(d, snapshots, shutdown));
    ambit_testkit::eventually("web enrolled", Duration::from_secs(10), || {
        source.local.redirection(NS, "web").as_deref() == Some(ENABLED)
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    node.state().hns.calls.clear();
    edit_policies(&node, 2, Vec::clear);
    ambit_testkit::eventually("endpoint 2 repaired", Duration::from_secs(60), || {
        node.settings_on(2) == planned()
    })
    .await;
    let repaired = started.elapsed();
    assert!(
        repaired >= Duration::from_secs(10) && repaired < Duration::from_secs(11),
        "on the first pass, one period after the sync: {repaired:?}"
    );
    assert_eq!(node.writes(), vec![(endpoint(2), "Add".to_owned())]);
    stop.send_replace(true);
    assert!(task.await.unwrap().is_ok());
}

/// A pod an earlier agent enrolled (its annotation says so) that is no longer wanted when
/// this agent starts (un-labelled, or its namespace opted out, while no agent ran): its
/// namespace is asked of the runtime, the policies come off, then the annotation; a pod
/// the runtime no longer runs only loses the annotation; a runtime that cannot say is
/// asked again after the backoff, the annotation staying meanwhile (the policies may still
/// be on). A pod that is wanted, or was never enrolled, is not touched.
#[tokio::test]
async fn a_pod_unlabelled_while_no_agent_ran_is_released_through_the_runtime() {
    struct Case {
        what: &'static str,
        /// The pod's label and annotation as the API server has them at start.
        ambient: bool,
        annotation: Option<&'static str>,
        /// The runtime's sandbox namespace for it, and how many lookups fail first.
        sandbox: Option<u128>,
        locate_fails: u32,
        /// Expected after the first step, then (if a lookup failed) after the retry.
        locates: usize,
        released: Vec<Guid>,
        annotation_after: Option<&'static str>,
    }
    let cases = [
        Case {
            what: "enabled, un-labelled, sandbox running",
            ambient: false,
            annotation: Some(ENABLED),
            sandbox: Some(1),
            locate_fails: 0,
            locates: 1,
            released: vec![guid(1)],
            annotation_after: None,
        },
        Case {
            what: "pending, un-labelled, sandbox running",
            ambient: false,
            annotation: Some(PENDING),
            sandbox: Some(2),
            locate_fails: 0,
            locates: 1,
            released: vec![guid(2)],
            annotation_after: None,
        },
        Case {
            what: "enabled, un-labelled, no sandbox any more",
            ambient: false,
            annotation: Some(ENABLED),
            sandbox: None,
            locate_fails: 0,
            locates: 1,
            released: vec![],
            annotation_after: None,
        },
        Case {
            what: "enabled, un-labelled, the runtime cannot say at first",
            ambient: false,
            annotation: Some(ENABLED),
            sandbox: Some(3),
            locate_fails: 1,
            locates: 2,
            released: vec![guid(3)],
            annotation_after: None,
        },
        Case {
            what: "never enrolled, not wanted",
            ambient: false,
            annotation: None,
            sandbox: Some(4),
            locate_fails: 0,
            locates: 0,
            released: vec![],
            annotation_after: None,
        },
    ];
    for case in cases {
        let mut h = Harness::new();
        let web = pod("web", case.ambient);
        if let Some(guid_n) = case.sandbox {
            h.node
                .state()
                .sandboxes
                .insert(web.uid.clone(), guid(guid_n));
        }
        h.node.state().locate_fails = case.locate_fails;
        h.source.local.upsert_pod(web.clone());
        if let Some(value) = case.annotation {
            h.annotate_stored(&web.name, value);
        }
        let stored = h.source.local.pod(NS, &web.name).unwrap();
        h.d.handle(PodEvent::Pod(stored), h.at(0));
        h.sync();
        h.step(0).await;
        if case.locate_fails > 0 {
            assert_eq!(h.node.state().locates.len(), 1, "{}", case.what);
            assert!(h.node.state().releases.is_empty(), "{}", case.what);
            assert_eq!(
                h.annotation("web").as_deref(),
                case.annotation,
                "{}: kept while the policies may be on",
                case.what
            );
            // Not before the backoff, then again.
            h.step(100).await;
            assert_eq!(
                h.node.state().locates.len(),
                1,
                "{}: retried early",
                case.what
            );
            h.step(60_000).await;
        }
        let st = h.node.state();
        assert_eq!(st.locates.len(), case.locates, "{}", case.what);
        assert_eq!(st.releases, case.released, "{}", case.what);
        assert!(st.captures.is_empty(), "{}: captured", case.what);
        drop(st);
        assert_eq!(
            h.annotation("web").as_deref(),
            case.annotation_after,
            "{}",
            case.what
        );
        assert!(h.zt.state().adds.is_empty(), "{}", case.what);
    }
}

/// A pod seen before its namespace is not wanted yet: the release that schedules is
/// cancelled when the namespace makes the pod wanted, before any step runs (steps wait for
/// the initial sync), so an enrolled pod is never released by the order of the events.
#[tokio::test]
async fn a_pod_seen_before_its_ambient_namespace_is_not_released() {
    let mut h = Harness::new();
    let web = pod("web", false);
    h.node.script(&web.uid, &[Answer::Captured(hns(1, 7))]);
    h.node.state().sandboxes.insert(web.uid.clone(), guid(1));
    h.source.local.upsert_pod(web.clone());
    h.annotate_stored(&web.name, ENABLED);
    let stored = h.source.local.pod(NS, &web.name).unwrap();
    h.d.handle(PodEvent::Pod(stored), h.at(0));
    let ambient = Namespace {
        name: NS.into(),
        labels: BTreeMap::from([("istio.io/dataplane-mode".into(), "ambient".into())]),
    };
    h.d.handle(PodEvent::Namespace(ambient), h.at(0));
    h.d.handle(PodEvent::Synced, h.at(0));
    h.step(0).await;
    let st = h.node.state();
    assert!(
        st.locates.is_empty() && st.releases.is_empty(),
        "{:?}",
        st.releases
    );
    assert_eq!(st.captures.len(), 1);
    drop(st);
    assert_eq!(h.annotation("web").as_deref(), Some(ENABLED));
}
