//! The Windows node agent's loop (`spec/windows.md` §1.3–§1.4, §2.3): pod events in, effects
//! out. For each pod of this node that the enrolment predicate wants ([`crate::enrol`]):
//! the runtime names its sandbox's HNS namespace, both `L4WFPPROXY` policies go on every
//! endpoint, ztunnel is sent `Add` with the namespace, and only then is the pod annotated
//! `ambient.istio.io/redirection: enabled`, which releases the init container that holds it
//! (`crate::hold`). A pod that stops being wanted (deleted, un-labelled, terminal) gets `Del`
//! and its policies removed; an un-labelled pod also loses the annotation.
//!
//! Fail closed: `enabled` is written only after the policies are on every endpoint and
//! ztunnel acked the `Add` of this very attempt. When policies are on but ztunnel did not ack,
//! the pod is annotated `pending` (upstream's partially enrolled), and a pod that still says
//! `enabled` from an earlier agent while its capture fails is set back to `pending`.
//!
//! Retries: every failure (no sandbox or namespace yet, HNS, policies, ztunnel's NACK,
//! the annotation write, a release) is retried from the start of its step with a bounded
//! backoff ([`Backoff`]: doubling, capped), reported per pod ([`Daemon::status`] and a log
//! line naming the pod), and cancelled when the pod is deleted or no longer wanted. A capture
//! always starts again at the runtime: ztunnel is sent the compartment HNS has now.
//!
//! At start the source replays every pod of the node before [`PodEvent::Synced`]; nothing is
//! captured before that, and then all wanted pods are captured in one runtime listing
//! (the pods that already run). A ztunnel that (re)connects gets the snapshot from the ZDS
//! server's cache, which this loop keeps true (an `Add` caches the pod, a `Del` forgets
//! it); pods whose `Add` failed are retried at once, without waiting for their backoff.
//!
//! Verification (beyond upstream, whose reconcile is off on Windows): every
//! `AMBIT_VERIFY_INTERVAL` (the Linux agent's variable and default, 10 s; `0` turns it off)
//! a pass re-checks every enrolled pod ([`Node::verify`]): HNS is asked again for the pod's
//! namespace, its endpoints and their policies, and only an endpoint that differs from the
//! plan is written to (policies added to an endpoint that lacks them, e.g. one that joined
//! the namespace, replaced where their settings differ). Each repair is logged naming the
//! pod and the endpoint and counted ([`Daemon::verification`]); a pod whose namespace
//! vanished (its sandbox went or was re-created) is captured again from the runtime; a pod
//! HNS would not answer for, or that could not be repaired, is counted unprotected and
//! checked again on the next pass. The pass checks one pod per [`Daemon::step`] after the
//! step's captures, so a new pod waits for at most one pod's check; the next pass is due one
//! interval after the previous one ended.
//!
//! Health and metrics: after every event and step the daemon publishes whether the initial
//! sync is done, its verification counters and its pod-event counts to a
//! [`WindowsMonitor`] ([`Daemon::with_monitor`]), which the agent's `/readyz` and `/metrics`
//! read (`super::monitor`).
//!
//! Platform-neutral: the runtime, HNS and policies are behind [`Node`], ztunnel behind
//! [`Ztunnel`], the pods and annotations behind [`PodSource`]; the Windows build implements
//! them with the CRI client, the HCN calls and the ZDS server (`super::node`), the tests here
//! with fakes. The loop is a state machine driven with explicit instants ([`Daemon::handle`],
//! [`Daemon::step`], [`Daemon::next_due`]); [`run`] is the thin async shell around it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ambit_netns::guid::Guid;
use ambit_redirect::hns::EndpointOutcome;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};

use super::HnsPodNamespace as PodNamespace;
use super::monitor::WindowsMonitor;
pub use super::running::Check;
use crate::enrol::Enablement;
use crate::pods::{ENABLED, PENDING, Pod, PodEvent, PodSource};

/// Per pod UID: its HNS namespace with the policies on, or why not.
pub type Captures<E> = BTreeMap<String, Result<PodNamespace, E>>;

/// The runtime, HNS and the policies: what captures and releases a pod's namespace.
pub trait Node: Send {
    /// Why a pod (or all of them) could not be captured or released.
    type Error: std::error::Error + Send + Sync + 'static;
    /// For each pod UID of `uids`: its sandbox's HNS namespace with both policies on every
    /// endpoint, or why not. `Err` when the runtime cannot be asked at all.
    fn capture(
        &mut self,
        uids: &BTreeSet<String>,
    ) -> impl Future<Output = Result<Captures<Self::Error>, Self::Error>> + Send;
    /// The HNS namespace of the pod `uid`'s sandbox as the runtime reports it, touching no
    /// policy (`None`: the runtime runs no sandbox of it); `Err` when the runtime cannot be
    /// asked or cannot say (a sandbox it lists but does not describe). For a pod an earlier
    /// agent enrolled and this one never captured, so that its release can find the
    /// policies.
    fn locate(
        &mut self,
        uid: &str,
    ) -> impl Future<Output = Result<Option<PodNamespace>, Self::Error>> + Send;
    /// Takes the policies off the namespace's endpoints; a namespace that is gone is done.
    fn release(&mut self, ns: &PodNamespace) -> Result<(), Self::Error>;
    /// Re-reads an enrolled pod's namespace (its endpoints now) and each endpoint's
    /// policies, and repairs per endpoint what differs from the plan, writing nothing to an
    /// endpoint that is as planned (`super::running::verify_namespace`).
    fn verify(&mut self, ns: &PodNamespace) -> Check<Self::Error>;
}

/// One enrolled pod as ztunnel is told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Pod UID.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace (Kubernetes).
    pub namespace: String,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// Its HNS namespace.
    pub hns: PodNamespace,
}

/// ztunnel over ZDS (the ZDS server on Windows): `Add` waits for ztunnel's ack.
pub trait Ztunnel: Send + Sync {
    /// Why ztunnel did not take a request.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Sends `Add` (caching the pod for later snapshots) and waits for the ack.
    fn add(&self, w: Workload) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// Forgets the pod and sends `Del` to every connected ztunnel.
    fn del(&self, uid: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Retry pacing per pod: `first`, doubling each failure, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub first: Duration,
    /// The cap.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The delay after `failures` failures in a row (1 = the first).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }
}

/// Where a pod stands, as [`Daemon::status`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Wanted, not captured yet (or retrying).
    Capturing,
    /// Captured and acked; the `enabled` annotation is still to be written.
    Annotating,
    /// Policies on, ztunnel acked, annotated `enabled`.
    Enrolled,
    /// No longer wanted; `Del`, policy removal or annotation removal still to finish.
    Releasing,
}

/// One pod's state as [`Daemon::status`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodStatus {
    /// `namespace/name`.
    pub pod: String,
    /// Where it stands.
    pub phase: Phase,
    /// Failures in a row of the current step.
    pub failures: u32,
    /// The last failure, naming the pod and what failed.
    pub last_error: Option<String>,
}

/// What a verification pass repaired on one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepairKind {
    /// The endpoint had no `L4WFPPROXY` policy (it joined the namespace after the capture,
    /// or lost them out of band): both were added.
    PoliciesAdded,
    /// The endpoint's `L4WFPPROXY` policies were not the planned ones: replaced.
    PoliciesReplaced,
    /// The pod's namespace is gone: the pod is captured again from the runtime.
    Recapture,
}

/// One repair of a verification pass, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// `namespace/name`.
    pub pod: String,
    /// Its HNS namespace (as enrolled).
    pub namespace: Guid,
    /// The endpoint repaired (none for a re-capture).
    pub endpoint: Option<Guid>,
    /// What was done.
    pub kind: RepairKind,
}

impl std::fmt::Display for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (pod, ns) = (&self.pod, self.namespace);
        match (self.kind, self.endpoint) {
            (RepairKind::Recapture, _) | (_, None) => write!(
                f,
                "pod {pod}: HNS namespace {ns} is gone; capturing the pod again"
            ),
            (RepairKind::PoliciesAdded, Some(ep)) => write!(
                f,
                "pod {pod}: endpoint {ep} of HNS namespace {ns} had no L4WFPPROXY policies; added"
            ),
            (RepairKind::PoliciesReplaced, Some(ep)) => write!(
                f,
                "pod {pod}: endpoint {ep} of HNS namespace {ns} had other L4WFPPROXY policies; replaced"
            ),
        }
    }
}

/// The verification counters; `repairs` and `unprotected` are exported under the Linux
/// agent's metric names with the same meaning (`super::monitor`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyCounters {
    /// Passes completed.
    pub passes: u64,
    /// `ambit_pod_repairs_total`: repairs made by verification, one per endpoint whose
    /// policies were re-applied and one per pod captured again because its namespace was
    /// gone (Linux: one per pod whose rules were re-applied or whose ztunnel was re-added).
    pub repairs: u64,
    /// `ambit_enrolled_unprotected_pods`: enrolled pods that were not protected after the
    /// last completed pass and its repairs (HNS did not answer, a repair failed, or the
    /// namespace was gone).
    pub unprotected: u64,
}

/// Pod events taken from the source, by the type the Linux agent counts them under
/// (`nodeagent_reconcile_events_total{type}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodEventCounts {
    /// A pod seen for the first time.
    pub add: u64,
    /// A pod seen again (changed, or replayed by a re-list).
    pub update: u64,
    /// A pod deleted.
    pub delete: u64,
}

/// What the last completed pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// The repairs, in the order made.
    pub repairs: Vec<Repair>,
    /// Per pod UID left unprotected, why (naming the pod).
    pub unprotected: BTreeMap<String, String>,
}

/// A verification pass in progress.
#[derive(Debug)]
struct Pass {
    /// When it was due (what [`Daemon::next_due`] reports while pods are left).
    due: Instant,
    /// The enrolled pods still to check.
    queue: VecDeque<String>,
    report: PassReport,
}

#[derive(Debug, Clone)]
enum State {
    /// Capture (runtime, HNS, policies, `Add`) due at `due`; `applied` is the namespace the
    /// policies went on in an earlier attempt, removed if the pod is let go.
    Capturing {
        applied: Option<PodNamespace>,
    },
    /// `Add` acked; `enabled` to be written.
    Annotating(PodNamespace),
    Enrolled(PodNamespace),
}

#[derive(Debug, Clone)]
struct Tracked {
    pod: Pod,
    state: State,
    due: Option<Instant>,
    failures: u32,
    last_error: Option<String>,
}

/// A pod being let go: `Del`, then the policies off, then (pod still there) the annotation.
#[derive(Debug, Clone)]
struct Release {
    pod: Pod,
    hns: Option<PodNamespace>,
    /// The namespace is to be asked of the runtime first: an earlier agent enrolled the pod
    /// (its annotation says so) and this one never captured it.
    locate: bool,
    /// Whether the pod still exists (un-labelled), so its annotation is removed.
    unannotate: bool,
    due: Instant,
    failures: u32,
    last_error: Option<String>,
}

/// The Windows agent's state machine. Effects run in [`Self::step`], one pod at a time, each
/// bounded by its own deadline (CRI and ZDS calls have theirs).
#[derive(Debug)]
pub struct Daemon<N, Z, S> {
    node: N,
    ztunnel: Z,
    source: S,
    enablement: Enablement,
    backoff: Backoff,
    /// Every live pod of the node, by UID (wanted or not).
    pods: BTreeMap<String, Pod>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    tracked: BTreeMap<String, Tracked>,
    releases: BTreeMap<String, Release>,
    synced: bool,
    /// The verification period (`None`: no passes).
    verify_interval: Option<Duration>,
    /// When the next pass starts (set once synced, and when a pass ends).
    next_pass: Option<Instant>,
    pass: Option<Pass>,
    counters: VerifyCounters,
    last_pass: PassReport,
    events: PodEventCounts,
    /// Told the state after every event and step (health and metrics servers).
    monitor: Option<Arc<WindowsMonitor>>,
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace, pod.name)
}

impl<N: Node, Z: Ztunnel, S: PodSource> Daemon<N, Z, S> {
    /// A daemon with nothing seen yet.
    pub fn new(node: N, ztunnel: Z, source: S, enablement: Enablement, backoff: Backoff) -> Self {
        Self {
            node,
            ztunnel,
            source,
            enablement,
            backoff,
            pods: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            tracked: BTreeMap::new(),
            releases: BTreeMap::new(),
            synced: false,
            verify_interval: None,
            next_pass: None,
            pass: None,
            counters: VerifyCounters::default(),
            last_pass: PassReport::default(),
            events: PodEventCounts::default(),
            monitor: None,
        }
    }

    /// Publishes readiness and the counters to `monitor` after every event and step.
    pub fn with_monitor(mut self, monitor: Arc<WindowsMonitor>) -> Self {
        self.monitor = Some(monitor);
        self.publish();
        self
    }

    fn publish(&self) {
        if let Some(m) = &self.monitor {
            m.publish(self.synced, self.counters, self.events);
        }
    }

    /// Whether the source's initial sync is done (nothing is captured before).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The pod events taken so far.
    pub fn pod_events(&self) -> PodEventCounts {
        self.events
    }

    /// Verifies every enrolled pod each `interval` (`None`: never), the first pass one
    /// interval after the source's initial sync.
    pub fn with_verification(mut self, interval: Option<Duration>) -> Self {
        self.verify_interval = interval;
        self
    }

    /// The verification counters.
    pub fn verification(&self) -> VerifyCounters {
        self.counters
    }

    /// What the last completed verification pass repaired and left unprotected.
    pub fn last_pass(&self) -> &PassReport {
        &self.last_pass
    }

    /// Every pod in flight or enrolled, by UID.
    pub fn status(&self) -> BTreeMap<String, PodStatus> {
        let tracked = self.tracked.iter().map(|(uid, t)| {
            let phase = match t.state {
                State::Capturing { .. } => Phase::Capturing,
                State::Annotating(_) => Phase::Annotating,
                State::Enrolled(_) => Phase::Enrolled,
            };
            let st = PodStatus {
                pod: key(&t.pod),
                phase,
                failures: t.failures,
                last_error: t.last_error.clone(),
            };
            (uid.clone(), st)
        });
        let releasing = self.releases.iter().map(|(uid, r)| {
            let st = PodStatus {
                pod: key(&r.pod),
                phase: Phase::Releasing,
                failures: r.failures,
                last_error: r.last_error.clone(),
            };
            (uid.clone(), st)
        });
        releasing.chain(tracked).collect()
    }

    /// The earliest instant [`Self::step`] has something to do, if any.
    pub fn next_due(&self) -> Option<Instant> {
        if !self.synced {
            return None;
        }
        let tracked = self.tracked.values().filter_map(|t| t.due);
        let releases = self.releases.values().map(|r| r.due);
        let pass = match &self.pass {
            Some(p) => Some(p.due),
            None => self.next_pass,
        };
        tracked.chain(releases).chain(pass).min()
    }

    fn wanted(&self, pod: &Pod) -> bool {
        if pod.phase.is_terminal() {
            return false;
        }
        match self.namespaces.get(&pod.namespace) {
            Some(labels) => self.enablement.should_enrol(pod, labels),
            // Undecidable until the namespace is known: not wanted yet.
            None if self.enablement.needs_namespace(pod) => false,
            None => self.enablement.should_enrol(pod, &BTreeMap::new()),
        }
    }

    /// Takes one event from the pod source.
    pub fn handle(&mut self, ev: PodEvent, now: Instant) {
        self.handle_event(ev, now);
        self.publish();
    }

    fn handle_event(&mut self, ev: PodEvent, now: Instant) {
        match ev {
            PodEvent::Pod(pod) => {
                match self.pods.insert(pod.uid.clone(), pod.clone()) {
                    None => self.events.add += 1,
                    Some(_) => self.events.update += 1,
                }
                self.reconsider(&pod.uid, now);
            }
            PodEvent::PodDeleted(pod) => {
                self.events.delete += 1;
                self.pods.remove(&pod.uid);
                self.reconsider(&pod.uid, now);
            }
            PodEvent::Namespace(ns) => {
                let name = ns.name.clone();
                self.namespaces.insert(ns.name, ns.labels);
                self.reconsider_namespace(&name, now);
            }
            PodEvent::NamespaceDeleted(name) => {
                self.namespaces.remove(&name);
                self.reconsider_namespace(&name, now);
            }
            PodEvent::Synced => {
                if !self.synced {
                    self.next_pass = self.verify_interval.map(|i| now + i);
                }
                self.synced = true;
            }
        }
    }

    fn reconsider_namespace(&mut self, name: &str, now: Instant) {
        let uids: Vec<String> = self
            .pods
            .values()
            .filter(|p| p.namespace == name)
            .map(|p| p.uid.clone())
            .collect();
        for uid in uids {
            self.reconsider(&uid, now);
        }
    }

    /// Brings one pod's tracking in line with whether it is (still) wanted.
    fn reconsider(&mut self, uid: &str, now: Instant) {
        let live = self.pods.get(uid).cloned();
        match live {
            Some(pod) if self.wanted(&pod) => {
                // A release in flight is cancelled: the capture re-applies idempotently.
                let applied = self.releases.remove(uid).and_then(|r| r.hns);
                match self.tracked.get_mut(uid) {
                    Some(t) => t.pod = pod,
                    None => {
                        let t = Tracked {
                            pod,
                            state: State::Capturing { applied },
                            due: Some(now),
                            failures: 0,
                            last_error: None,
                        };
                        self.tracked.insert(uid.to_owned(), t);
                    }
                }
            }
            live => {
                let Some(t) = self.tracked.remove(uid) else {
                    match live {
                        // A deleted pod's annotation needs no removal.
                        None => {
                            if let Some(r) = self.releases.get_mut(uid) {
                                r.unannotate = false;
                            }
                        }
                        // Un-labelled (or opted out) while no agent ran: the earlier agent's
                        // policies may still be on its endpoints, redirecting its traffic
                        // to a ztunnel that no longer serves it. Found through the runtime,
                        // released, and only then un-annotated. A pod whose namespace is
                        // not known yet is not wanted yet either: the release is cancelled
                        // when the namespace makes it wanted, and none runs before the
                        // source's initial sync.
                        Some(pod)
                            if pod.redirection().is_some() && !self.releases.contains_key(uid) =>
                        {
                            let release = Release {
                                pod,
                                hns: None,
                                locate: true,
                                unannotate: true,
                                due: now,
                                failures: 0,
                                last_error: None,
                            };
                            self.releases.insert(uid.to_owned(), release);
                        }
                        Some(_) => {}
                    }
                    return;
                };
                let hns = match t.state {
                    State::Capturing { applied } => applied,
                    State::Annotating(ns) | State::Enrolled(ns) => Some(ns),
                };
                let unannotate = live.as_ref().is_some_and(|p| p.redirection().is_some());
                if hns.is_none() && !unannotate {
                    // No policies were put on and no Add was sent (Add follows the
                    // policies): nothing to undo.
                    return;
                }
                let release = Release {
                    pod: live.unwrap_or(t.pod),
                    hns,
                    locate: false,
                    unannotate,
                    due: now,
                    failures: 0,
                    last_error: None,
                };
                self.releases.insert(uid.to_owned(), release);
            }
        }
    }

    /// A ztunnel (re)connected and got the snapshot: pods whose `Add` failed are retried now.
    pub fn reconnected(&mut self, now: Instant) {
        for t in self.tracked.values_mut() {
            if matches!(t.state, State::Capturing { applied: Some(_) }) {
                t.due = Some(now);
                t.failures = 0;
            }
        }
    }

    /// Does what is due at `now`: releases, then one runtime listing for every pod due for
    /// capture, then `Add` and annotations, then (a pass being due) one enrolled pod's check.
    pub async fn step(&mut self, now: Instant) {
        if !self.synced {
            return;
        }
        self.step_releases(now).await;
        self.step_captures(now).await;
        self.step_annotations(now).await;
        self.step_verification(now);
        self.publish();
    }

    /// Starts a pass when one is due, checks its next enrolled pod, and ends it when none is
    /// left (then the next is due one interval later).
    fn step_verification(&mut self, now: Instant) {
        if self.pass.is_none() {
            match self.next_pass {
                Some(due) if due <= now => {
                    let queue = (self.tracked.iter())
                        .filter(|(_, t)| matches!(t.state, State::Enrolled(_)))
                        .map(|(uid, _)| uid.clone())
                        .collect();
                    self.next_pass = None;
                    self.pass = Some(Pass {
                        due,
                        queue,
                        report: PassReport::default(),
                    });
                }
                _ => return,
            }
        }
        let Some(mut pass) = self.pass.take() else {
            return;
        };
        while let Some(uid) = pass.queue.pop_front() {
            // A pod released or being captured again since the pass began is not checked.
            if self.verify_pod(&uid, now, &mut pass.report) {
                break;
            }
        }
        if !pass.queue.is_empty() {
            self.pass = Some(pass);
            return;
        }
        self.counters.passes += 1;
        self.counters.unprotected = pass.report.unprotected.len() as u64;
        if !pass.report.unprotected.is_empty() {
            tracing::warn!(
                unprotected = pass.report.unprotected.len(),
                "verification pass left enrolled pods unprotected"
            );
        }
        self.last_pass = pass.report;
        self.next_pass = self.verify_interval.map(|i| now + i);
    }

    /// Checks (and repairs) one enrolled pod; `false` when it is no longer enrolled (nothing
    /// was asked).
    fn verify_pod(&mut self, uid: &str, now: Instant, report: &mut PassReport) -> bool {
        let Some(t) = self.tracked.get(uid) else {
            return false;
        };
        let State::Enrolled(hns) = t.state else {
            return false;
        };
        let pod = key(&t.pod);
        let check = self.node.verify(&hns);
        let Some(t) = self.tracked.get_mut(uid) else {
            return true;
        };
        let repaired = |done: &[(Guid, EndpointOutcome)], report: &mut PassReport| {
            let mut n = 0u64;
            for (ep, outcome) in done {
                let kind = match outcome {
                    EndpointOutcome::Added => RepairKind::PoliciesAdded,
                    EndpointOutcome::Replaced => RepairKind::PoliciesReplaced,
                    _ => continue,
                };
                let r = Repair {
                    pod: pod.clone(),
                    namespace: hns.guid,
                    endpoint: Some(*ep),
                    kind,
                };
                tracing::warn!(pod = %r.pod, uid, guid = %hns.guid, endpoint = %ep, "{r}");
                report.repairs.push(r);
                n += 1;
            }
            n
        };
        match check {
            Check::Protected(done) => {
                self.counters.repairs += repaired(&done, report);
                t.failures = 0;
                t.last_error = None;
            }
            Check::Unprotected { done, error } => {
                self.counters.repairs += repaired(&done, report);
                t.failures += 1;
                let why = format!("pod {pod}: verification: {error}");
                tracing::warn!(uid, error = %why, "enrolled pod unprotected; checked again next pass");
                t.last_error = Some(why.clone());
                report.unprotected.insert(uid.to_owned(), why);
            }
            Check::Gone => {
                let r = Repair {
                    pod: pod.clone(),
                    namespace: hns.guid,
                    endpoint: None,
                    kind: RepairKind::Recapture,
                };
                tracing::warn!(pod = %r.pod, uid, guid = %hns.guid, "{r}");
                self.counters.repairs += 1;
                report.repairs.push(r);
                let why = format!(
                    "pod {pod}: verification: HNS namespace {} is gone",
                    hns.guid
                );
                report.unprotected.insert(uid.to_owned(), why.clone());
                // Nothing is left to release on the vanished namespace; the capture asks the
                // runtime for the pod's sandbox now, and marks the pod `pending` if it fails.
                t.state = State::Capturing { applied: None };
                t.due = Some(now);
                t.failures = 0;
                t.last_error = Some(why);
            }
        }
        true
    }

    async fn step_releases(&mut self, now: Instant) {
        let due: Vec<String> = (self.releases.iter())
            .filter(|(_, r)| r.due <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in due {
            let Some(mut r) = self.releases.remove(&uid) else {
                continue;
            };
            match self.release_once(&uid, &mut r).await {
                Ok(()) => tracing::info!(pod = %key(&r.pod), uid, "released"),
                Err(e) => {
                    r.failures += 1;
                    r.due = now + self.backoff.delay(r.failures);
                    tracing::warn!(pod = %key(&r.pod), uid, error = %e, "release failed; retrying");
                    r.last_error = Some(e);
                    self.releases.insert(uid, r);
                }
            }
        }
    }

    /// One release attempt; what succeeded is not repeated.
    async fn release_once(&mut self, uid: &str, r: &mut Release) -> Result<(), String> {
        let pod = key(&r.pod);
        self.ztunnel
            .del(uid)
            .await
            .map_err(|e| format!("pod {pod}: ZDS Del: {e}"))?;
        if r.locate {
            r.hns = self
                .node
                .locate(uid)
                .await
                .map_err(|e| format!("pod {pod}: finding its HNS namespace: {e}"))?;
            r.locate = false;
        }
        if let Some(ns) = &r.hns {
            self.node
                .release(ns)
                .map_err(|e| format!("pod {pod}: removing policies of {}: {e}", ns.guid))?;
            r.hns = None;
        }
        if r.unannotate {
            match self
                .source
                .annotate(&r.pod.namespace, &r.pod.name, None)
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_pod_gone() => {}
                Err(e) => return Err(format!("pod {pod}: removing annotation: {e}")),
            }
            r.unannotate = false;
        }
        Ok(())
    }

    fn due_in(&self, now: Instant, capturing: bool) -> Vec<String> {
        self.tracked
            .iter()
            .filter(|(_, t)| t.due.is_some_and(|d| d <= now))
            .filter(|(_, t)| matches!(t.state, State::Capturing { .. }) == capturing)
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    async fn step_captures(&mut self, now: Instant) {
        let due: BTreeSet<String> = self.due_in(now, true).into_iter().collect();
        if due.is_empty() {
            return;
        }
        let mut outcomes = match self.node.capture(&due).await {
            Ok(o) => o,
            Err(e) => {
                let why = format!("container runtime: {e}");
                for uid in &due {
                    self.capture_failed(uid, why.clone(), false, now).await;
                }
                return;
            }
        };
        for uid in due {
            match outcomes.remove(&uid) {
                Some(Ok(hns)) => self.add(&uid, hns, now).await,
                Some(Err(e)) => self.capture_failed(&uid, e.to_string(), false, now).await,
                None => {
                    let why = "the capture did not answer for it".to_owned();
                    self.capture_failed(&uid, why, false, now).await
                }
            }
        }
    }

    /// Policies are on `hns`: `Add` to ztunnel, then the annotation.
    async fn add(&mut self, uid: &str, hns: PodNamespace, now: Instant) {
        let Some(t) = self.tracked.get_mut(uid) else {
            return;
        };
        t.state = State::Capturing { applied: Some(hns) };
        let w = Workload {
            uid: uid.to_owned(),
            name: t.pod.name.clone(),
            namespace: t.pod.namespace.clone(),
            service_account: t.pod.service_account.clone(),
            hns,
        };
        match self.ztunnel.add(w).await {
            Ok(()) => {
                if let Some(t) = self.tracked.get_mut(uid) {
                    t.state = State::Annotating(hns);
                    t.failures = 0;
                    t.due = Some(now);
                }
                self.annotate(uid, now).await;
            }
            Err(e) => {
                let why = format!("ZDS Add of namespace {}: {e}", hns.guid);
                self.capture_failed(uid, why, true, now).await;
            }
        }
    }

    /// Records a failed capture (`policies_on`: only ztunnel's ack is missing) and marks the
    /// pod `pending` where its annotation would otherwise claim more (or nothing, with the
    /// policies on).
    async fn capture_failed(&mut self, uid: &str, why: String, policies_on: bool, now: Instant) {
        let Some(t) = self.tracked.get_mut(uid) else {
            return;
        };
        t.failures += 1;
        t.due = Some(now + self.backoff.delay(t.failures));
        let pod = t.pod.clone();
        let why = format!("pod {}: {why}", key(&pod));
        tracing::warn!(uid, error = %why, failures = t.failures, "capture failed; retrying");
        t.last_error = Some(why);
        let mark = match pod.redirection() {
            Some(ENABLED) => true,
            Some(PENDING) => false,
            _ => policies_on,
        };
        if mark {
            match self
                .source
                .annotate(&pod.namespace, &pod.name, Some(PENDING))
                .await
            {
                Ok(()) => {
                    if let Some(t) = self.tracked.get_mut(uid) {
                        (t.pod.annotations).insert(
                            crate::pods::REDIRECTION_ANNOTATION.to_owned(),
                            PENDING.to_owned(),
                        );
                    }
                }
                Err(e) => tracing::warn!(pod = %key(&pod), error = %e, "annotating pending"),
            }
        }
    }

    async fn step_annotations(&mut self, now: Instant) {
        for uid in self.due_in(now, false) {
            self.annotate(&uid, now).await;
        }
    }

    async fn annotate(&mut self, uid: &str, now: Instant) {
        let Some(t) = self.tracked.get(uid) else {
            return;
        };
        let State::Annotating(hns) = t.state else {
            return;
        };
        let pod = t.pod.clone();
        let result = if pod.redirection() == Some(ENABLED) {
            Ok(())
        } else {
            (self.source)
                .annotate(&pod.namespace, &pod.name, Some(ENABLED))
                .await
        };
        let Some(t) = self.tracked.get_mut(uid) else {
            return;
        };
        match result {
            Ok(()) => {
                t.state = State::Enrolled(hns);
                t.due = None;
                t.failures = 0;
                t.last_error = None;
                tracing::info!(pod = %key(&pod), uid, guid = %hns.guid, compartment = hns.compartment, "enrolled");
            }
            Err(e) if e.is_pod_gone() => t.due = None,
            Err(e) => {
                t.failures += 1;
                t.due = Some(now + self.backoff.delay(t.failures));
                let why = format!("pod {}: annotating enabled: {e}", key(&pod));
                tracing::warn!(uid, error = %why, "annotation failed; retrying");
                t.last_error = Some(why);
            }
        }
    }
}

/// Why [`run`] stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The pod source's watch ended.
    #[error("the pod source stopped")]
    SourceEnded,
}

/// Runs the daemon until `shutdown` turns true: events from the source's watch, a retry when
/// one is due, and a retry of unacked pods after each ZDS snapshot (`snapshots` counts them,
/// [`crate::zds::ZdsServer::snapshots`]).
pub async fn run<N: Node, Z: Ztunnel, S: PodSource>(
    mut daemon: Daemon<N, Z, S>,
    mut snapshots: watch::Receiver<u64>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RunError> {
    let mut events: mpsc::UnboundedReceiver<PodEvent> = daemon.source.watch();
    loop {
        daemon.step(Instant::now()).await;
        let due = daemon.next_due();
        tokio::select! {
            // Events first: a pod event waits for at most the step in flight (one pod's
            // check of a verification pass), never for a whole pass.
            biased;
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
            ev = events.recv() => match ev {
                Some(ev) => daemon.handle(ev, Instant::now()),
                None => return Err(RunError::SourceEnded),
            },
            Ok(()) = snapshots.changed() => daemon.reconnected(Instant::now()),
            () = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {}
        }
    }
}

#[cfg(test)]
mod tests;
