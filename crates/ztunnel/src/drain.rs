//! Drain: the one shutdown primitive every long-lived task of the proxy obeys (§8.5).
//!
//! A [`DrainTrigger`] owns a drain; [`DrainWatcher`]s (cheap clones) are handed to listeners,
//! HBONE servers and connections. A drain has two steps:
//!
//! 1. **signaled** — [`DrainWatcher::signaled`] resolves: listeners stop accepting, HBONE
//!    servers send GOAWAY, idle HTTP connections close. In-flight work carries on.
//! 2. **forced** — [`DrainWatcher::forced`] resolves: whatever is still running is dropped.
//!    It fires at once for [`DrainMode::Immediate`], or when the graceful deadline
//!    (`CONNECTION_TERMINATION_DEADLINE`) passes for [`DrainMode::Graceful`].
//!
//! Every live watcher (and every [`DrainBlocker`]) keeps
//! [`DrainTrigger::start_drain_and_wait`] waiting: the drain is complete exactly when all of
//! them are dropped. So a task must drop its watcher when it is done, and nobody should keep a
//! "spare" watcher around (it would hold every drain until the deadline).
//!
//! Dropping a [`DrainTrigger`] without draining counts as an immediate, forced drain: tasks
//! never outlive the thing that owns them.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};

/// How long [`DrainTrigger::start_drain_and_wait`] still waits for holders after it forced
/// them. Forced tasks are expected to drop within microseconds; the bound keeps one stuck task
/// from wedging shutdown forever.
pub const FORCE_GRACE: Duration = Duration::from_secs(1);

/// How a drain treats in-flight work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainMode {
    /// Stop taking new work; let in-flight work finish until the deadline, then force.
    Graceful,
    /// Stop everything now (a deleted pod, a second Ctrl-C).
    Immediate,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every watcher and blocker was dropped before the deadline.
    Completed,
    /// The deadline passed (or the mode was immediate and holders remained past the deadline)
    /// and the remaining holders were forced; `stuck` of them were still alive
    /// [`FORCE_GRACE`] later.
    Forced { stuck: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Phase {
    /// `None` while running.
    mode: Option<DrainMode>,
    forced: bool,
}

const RUNNING: Phase = Phase {
    mode: None,
    forced: false,
};

#[derive(Debug)]
struct Shared {
    phase: watch::Sender<Phase>,
    holders: AtomicUsize,
    released: Notify,
}

impl Shared {
    /// Waits until no watcher or blocker is alive. Registers interest before checking the
    /// count so a release between the check and the await is not lost.
    async fn all_released(&self) {
        loop {
            let mut notified = pin!(self.released.notified());
            notified.as_mut().enable();
            if self.holders.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    fn force(&self, mode: DrainMode) {
        self.phase.send_modify(|p| {
            p.mode.get_or_insert(mode);
            p.forced = true;
        });
    }
}

/// One reference that keeps a drain waiting.
#[derive(Debug)]
struct Hold(Arc<Shared>);

impl Hold {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.holders.fetch_add(1, Ordering::AcqRel);
        Hold(shared.clone())
    }
}

impl Clone for Hold {
    fn clone(&self) -> Self {
        Hold::new(&self.0)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.0.holders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.released.notify_waiters();
        }
    }
}

/// Creates a drain and its first watcher.
pub fn new() -> (DrainTrigger, DrainWatcher) {
    let trigger = DrainTrigger::new();
    let watcher = trigger.watcher();
    (trigger, watcher)
}

/// The owner side of a drain. Not cloneable: exactly one place decides when to drain.
#[derive(Debug)]
pub struct DrainTrigger {
    shared: Arc<Shared>,
}

impl Default for DrainTrigger {
    fn default() -> Self {
        Self::new()
    }
}

impl DrainTrigger {
    /// A drain with no watchers yet.
    pub fn new() -> Self {
        let (phase, _) = watch::channel(RUNNING);
        DrainTrigger {
            shared: Arc::new(Shared {
                phase,
                holders: AtomicUsize::new(0),
                released: Notify::new(),
            }),
        }
    }

    /// A new watcher of this drain (it holds the drain until dropped).
    pub fn watcher(&self) -> DrainWatcher {
        DrainWatcher {
            hold: Hold::new(&self.shared),
            phase: self.shared.phase.subscribe(),
        }
    }

    /// Number of live watchers and blockers.
    pub fn holders(&self) -> usize {
        self.shared.holders.load(Ordering::Acquire)
    }

    /// Signals the drain, waits until every watcher and blocker is dropped or `deadline`
    /// passes, then forces whatever is left (waiting at most [`FORCE_GRACE`] more for it to
    /// go away). An immediate drain is forced from the start.
    pub async fn start_drain_and_wait(self, mode: DrainMode, deadline: Duration) -> DrainOutcome {
        let shared = self.shared.clone();
        match mode {
            DrainMode::Graceful => shared.phase.send_modify(|p| {
                p.mode.get_or_insert(mode);
            }),
            DrainMode::Immediate => shared.force(mode),
        }
        if tokio::time::timeout(deadline, shared.all_released())
            .await
            .is_ok()
        {
            return DrainOutcome::Completed;
        }
        tracing::debug!(
            holders = shared.holders.load(Ordering::Acquire),
            "drain deadline passed, forcing"
        );
        shared.force(mode);
        // A timeout here means some task ignores `forced()`; report it rather than hang.
        let _ = tokio::time::timeout(FORCE_GRACE, shared.all_released()).await;
        DrainOutcome::Forced {
            stuck: shared.holders.load(Ordering::Acquire),
        }
    }
}

impl Drop for DrainTrigger {
    fn drop(&mut self) {
        // Owned tasks must not outlive their owner: an abandoned drain is an immediate one.
        self.shared.force(DrainMode::Immediate);
    }
}

/// The task side of a drain. Cloning registers another holder.
#[derive(Debug, Clone)]
pub struct DrainWatcher {
    hold: Hold,
    phase: watch::Receiver<Phase>,
}

impl DrainWatcher {
    /// Resolves when the drain starts, with its mode. Cancel-safe: use it in `select!` loops.
    pub async fn signaled(&self) -> DrainMode {
        let mut rx = self.phase.clone();
        // The sender lives in `Shared`, which this watcher keeps alive: `wait_for` cannot fail.
        let phase = rx.wait_for(|p| p.mode.is_some()).await.map(|p| *p);
        phase
            .ok()
            .and_then(|p| p.mode)
            .unwrap_or(DrainMode::Immediate)
    }

    /// Resolves when in-flight work must stop now (immediate drain, or graceful deadline
    /// passed). Cancel-safe.
    pub async fn forced(&self) {
        let mut rx = self.phase.clone();
        let _ = rx.wait_for(|p| p.forced).await;
    }

    /// Whether the drain has started.
    pub fn is_draining(&self) -> bool {
        self.phase.borrow().mode.is_some()
    }

    /// A token that only keeps the drain waiting (for work that does not need the signals).
    pub fn blocker(&self) -> DrainBlocker {
        DrainBlocker {
            _hold: self.hold.clone(),
        }
    }

    /// Turns this watcher into a plain blocker.
    pub fn into_blocker(self) -> DrainBlocker {
        DrainBlocker { _hold: self.hold }
    }

    /// Runs `fut` (typically one proxied connection) while holding this watcher; drops it
    /// when the drain is forced. Returns `None` if it was cut short.
    pub async fn run_until_forced<F: Future>(self, fut: F) -> Option<F::Output> {
        tokio::select! {
            out = fut => Some(out),
            () = self.forced() => None,
        }
    }
}

/// Keeps a drain waiting until dropped; carries no signals.
#[derive(Debug)]
pub struct DrainBlocker {
    _hold: Hold,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn graceful_completes_when_watchers_drop() {
        let (trigger, watcher) = new();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let w = watcher.clone();
            tasks.spawn(async move {
                let mode = w.signaled().await;
                // A blocker outlives the watcher briefly: the drain must wait for it too.
                let b = w.blocker();
                drop(w);
                tokio::task::yield_now().await;
                drop(b);
                mode
            });
        }
        drop(watcher);
        let started = Instant::now();
        let outcome = trigger
            .start_drain_and_wait(DrainMode::Graceful, Duration::from_secs(30))
            .await;
        assert_eq!(outcome, DrainOutcome::Completed);
        assert!(started.elapsed() < Duration::from_secs(5));
        while let Some(mode) = tasks.join_next().await {
            assert_eq!(mode.unwrap(), DrainMode::Graceful);
        }
    }

    #[tokio::test]
    async fn deadline_forces_and_immediate_forces_at_once() {
        struct Case {
            mode: DrainMode,
            deadline: Duration,
            min_elapsed: Duration,
            expect: DrainOutcome,
        }
        let cases = [
            // The task ignores the graceful signal: only the deadline gets rid of it.
            Case {
                mode: DrainMode::Graceful,
                deadline: Duration::from_millis(200),
                min_elapsed: Duration::from_millis(200),
                expect: DrainOutcome::Forced { stuck: 0 },
            },
            // Immediate: forced from the start, so the task exits well before the deadline.
            Case {
                mode: DrainMode::Immediate,
                deadline: Duration::from_secs(30),
                min_elapsed: Duration::ZERO,
                expect: DrainOutcome::Completed,
            },
        ];
        for case in cases {
            let (trigger, watcher) = new();
            let task = tokio::spawn(watcher.run_until_forced(std::future::pending::<()>()));
            let started = Instant::now();
            let outcome = trigger.start_drain_and_wait(case.mode, case.deadline).await;
            assert_eq!(outcome, case.expect, "{:?}", case.mode);
            assert!(started.elapsed() >= case.min_elapsed);
            assert!(started.elapsed() < Duration::from_secs(10));
            assert_eq!(task.await.unwrap(), None, "connection was cut short");
        }
    }

    #[tokio::test]
    async fn stuck_holder_is_reported() {
        let (trigger, watcher) = new();
        let blocker = watcher.into_blocker();
        let outcome = trigger
            .start_drain_and_wait(DrainMode::Graceful, Duration::from_millis(10))
            .await;
        assert_eq!(outcome, DrainOutcome::Forced { stuck: 1 });
        drop(blocker);
    }

    #[tokio::test]
    async fn dropped_trigger_forces_watchers() {
        let (trigger, watcher) = new();
        assert!(!watcher.is_draining());
        drop(trigger);
        assert_eq!(watcher.signaled().await, DrainMode::Immediate);
        watcher.forced().await;
    }
}
