//! Beyond upstream — repair on change: each enrolled pod's namespace has a
//! [`RulesetWatch`] (nf_tables change notifications), and any notification queues that pod
//! for an immediate verification and repair, instead of waiting for the next periodic pass.
//!
//! Bounds: the queue holds each pod at most once (a burst of notifications for a pod is one
//! entry) and at most [`MAX_QUEUED`] pods (past that it collapses into one full pass); a
//! watcher reads at most [`MAX_PER_WAKE`] datagrams before yielding; the reactor verifies
//! one pod at a time in arrival order, and a pod verified less than [`MIN_GAP`] ago goes
//! back to the end of the queue, so a pod whose ruleset changes without pause costs at most
//! one verification per `MIN_GAP` and cannot starve the others.
//!
//! Notifications can be lost (`ENOBUFS`: the pod is queued), a socket can fail (the pod is
//! queued once and then left to the periodic pass), and iptables-legacy sends none at all:
//! the periodic pass stays the backstop and, for legacy, the only detector.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::os::fd::{AsFd, OwnedFd};

use ambit_netns::{NetnsFd, register_async};
use ambit_redirect::RulesetWatch;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Pods queued at once before the queue collapses into "verify every pod".
pub(crate) const MAX_QUEUED: usize = 4096;
/// Datagrams one watcher reads before it yields to other tasks.
pub(crate) const MAX_PER_WAKE: usize = 64;
/// Least time between two change-driven verifications of one pod. Our own repair is a
/// ruleset change too: the pod is verified once more after each repair, this long later.
pub(crate) const MIN_GAP: Duration = Duration::from_millis(50);

/// What the reactor does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Verify this pod.
    One(String),
    /// The queue overflowed: verify every pod.
    All,
}

#[derive(Debug, Default)]
struct Queue {
    order: VecDeque<String>,
    queued: HashSet<String>,
    all: bool,
}

/// The bounded, de-duplicated queue of pods whose ruleset changed.
#[derive(Debug, Default)]
pub(crate) struct Dirty {
    queue: Mutex<Queue>,
    notify: Notify,
}

impl Dirty {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `uid` (no-op when it is already queued).
    pub(crate) fn mark(&self, uid: &str) {
        {
            let mut q = self.lock();
            if q.all || q.queued.contains(uid) {
                return;
            }
            if q.order.len() >= MAX_QUEUED {
                q.all = true;
                q.order.clear();
                q.queued.clear();
            } else {
                q.order.push_back(uid.to_string());
                q.queued.insert(uid.to_string());
            }
        }
        self.notify.notify_one();
    }

    /// Whether nothing is queued.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        let q = self.lock();
        !q.all && q.order.is_empty()
    }

    /// The next pod (or all), waiting for one.
    pub(crate) async fn next(&self) -> Next {
        loop {
            let notified = self.notify.notified();
            {
                let mut q = self.lock();
                if q.all {
                    q.all = false;
                    return Next::All;
                }
                if let Some(uid) = q.order.pop_front() {
                    q.queued.remove(&uid);
                    return Next::One(uid);
                }
            }
            notified.await;
        }
    }
}

/// A pod's watcher task; aborted when dropped (with the pod's slot).
#[derive(Debug)]
pub(crate) struct WatchHandle(JoinHandle<()>);

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Subscribes to `netns`'s ruleset changes and queues `uid` on each one. `None` (logged)
/// when the socket cannot be had: the periodic pass still covers the pod.
pub(crate) fn spawn(uid: &str, netns: &NetnsFd, dirty: &Arc<Dirty>) -> Option<WatchHandle> {
    let watch = RulesetWatch::open(netns).and_then(|w| {
        // Readiness through a duplicate of the socket's descriptor; reads go through `w`.
        let io = |source| ambit_redirect::KernelError::Io {
            what: "register with the reactor",
            source,
        };
        let dup = w.as_fd().try_clone_to_owned().map_err(io)?;
        Ok((w, register_async(dup).map_err(io)?))
    });
    let (w, fd) = match watch {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!(uid, error = %e, "no ruleset notifications for this pod; periodic verification only");
            return None;
        }
    };
    let (uid, dirty) = (uid.to_string(), dirty.clone());
    Some(WatchHandle(tokio::spawn(run(uid, w, fd, dirty))))
}

async fn run(uid: String, mut w: RulesetWatch, fd: AsyncFd<OwnedFd>, dirty: Arc<Dirty>) {
    loop {
        let mut ready = match fd.readable().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(uid, error = %e, "ruleset notifications failed; periodic verification only");
                dirty.mark(&uid);
                return;
            }
        };
        let more = match w.drain(MAX_PER_WAKE) {
            Ok(d) => {
                if d.lost {
                    tracing::debug!(uid, "ruleset notifications lost (ENOBUFS)");
                }
                if d.changed() {
                    dirty.mark(&uid);
                }
                d.more
            }
            Err(e) => {
                tracing::warn!(uid, error = %e, "ruleset notifications failed; periodic verification only");
                dirty.mark(&uid);
                return;
            }
        };
        if more {
            drop(ready);
            tokio::task::yield_now().await;
        } else {
            ready.clear_ready();
        }
    }
}

/// What the reactor needs of the agent: verify and repair some pods (or all).
pub(crate) trait Verifier {
    /// Verifies and repairs the pods with these UIDs (those still enrolled).
    fn verify_some(&self, uids: &[String]) -> impl std::future::Future<Output = ()> + Send;
    /// A full pass.
    fn verify_every(&self) -> impl std::future::Future<Output = ()> + Send;
}

/// Takes pods off `dirty` one at a time and verifies them (see the module docs). A pod
/// verified less than [`MIN_GAP`] ago waits, without holding back the others, until its
/// gap has passed.
pub(crate) async fn react<V: Verifier>(v: &V, dirty: &Dirty, mut stop: watch::Receiver<bool>) {
    let mut last: HashMap<String, Instant> = HashMap::new();
    // Pods held back by their gap, with when they are due (each at most once).
    let mut deferred: Vec<(String, Instant)> = Vec::new();
    loop {
        let due = deferred.iter().map(|(_, t)| *t).min();
        let next = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            n = dirty.next() => n,
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                let i = deferred
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, (_, t))| *t)
                    .map_or(0, |(i, _)| i);
                Next::One(deferred.swap_remove(i).0)
            }
        };
        match next {
            Next::All => v.verify_every().await,
            Next::One(uid) => {
                if let Some(at) = last.get(&uid).copied()
                    && at.elapsed() < MIN_GAP
                {
                    if !deferred.iter().any(|(u, _)| *u == uid) {
                        deferred.push((uid, at + MIN_GAP));
                    }
                    continue;
                }
                deferred.retain(|(u, _)| *u != uid);
                v.verify_some(std::slice::from_ref(&uid)).await;
                last.insert(uid, Instant::now());
                if last.len() > MAX_QUEUED {
                    last.retain(|_, at| at.elapsed() < MIN_GAP);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn queue_dedupes_and_collapses_when_full() {
        let d = Dirty::default();
        d.mark("a");
        d.mark("b");
        d.mark("a");
        assert_eq!(d.next().await, Next::One("a".into()));
        assert_eq!(d.next().await, Next::One("b".into()));
        assert!(d.is_empty());
        for i in 0..=MAX_QUEUED {
            d.mark(&i.to_string());
        }
        assert_eq!(d.next().await, Next::All);
        assert!(d.is_empty());
    }

    /// A pod whose ruleset changes without pause is verified at most once per MIN_GAP and
    /// does not hold the others back.
    #[tokio::test(start_paused = true)]
    async fn a_storm_does_not_starve_other_pods() {
        #[derive(Default)]
        struct Rec(Mutex<Vec<(String, Instant)>>);
        impl Verifier for Arc<(Rec, Arc<Dirty>)> {
            async fn verify_some(&self, uids: &[String]) {
                let mut seen = self.0.0.lock().unwrap();
                for u in uids {
                    seen.push((u.clone(), Instant::now()));
                    // The storm: every verification of "storm" is followed by a change.
                    if u == "storm" {
                        self.1.mark("storm");
                    }
                }
            }
            async fn verify_every(&self) {}
        }
        let dirty = Arc::new(Dirty::default());
        let v = Arc::new((Rec::default(), dirty.clone()));
        let (stop_tx, stop) = watch::channel(false);
        dirty.mark("storm");
        let t0 = Instant::now();
        let task = {
            let (v, dirty) = (v.clone(), dirty.clone());
            tokio::spawn(async move { react(&v, &dirty, stop).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        dirty.mark("quiet");
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop_tx.send(true).unwrap();
        task.await.unwrap();
        let seen = v.0.0.lock().unwrap().clone();
        let storm: Vec<Instant> = seen
            .iter()
            .filter(|(u, _)| u == "storm")
            .map(|(_, t)| *t)
            .collect();
        let quiet: Vec<Instant> = seen
            .iter()
            .filter(|(u, _)| u == "quiet")
            .map(|(_, t)| *t)
            .collect();
        assert_eq!(quiet.len(), 1, "{seen:?}");
        assert!(
            quiet[0] - t0 < MIN_GAP,
            "quiet pod waited {:?}",
            quiet[0] - t0
        );
        assert!(
            storm.len() <= 500 / MIN_GAP.as_millis() as usize + 1,
            "{}",
            storm.len()
        );
        for w in storm.windows(2) {
            assert!(w[1] - w[0] >= MIN_GAP, "{:?}", w[1] - w[0]);
        }
    }
}
