//! [`TaskSet`]: the tasks one owner spawns and answers for (an accept loop's connections,
//! an HBONE connection's streams).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use slab::Slab;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Tasks spawned on the current runtime for one owner: dropping the set (or
/// [`TaskSet::abort_all`]) aborts those still running, and [`TaskSet::wait`] resolves once
/// none is left.
///
/// Unlike a `JoinSet`, a task that finishes wakes nobody: it takes itself out of the set.
/// A `JoinSet` keeps finished tasks until its owner reaps them, so the owner is woken for
/// every one. For an accept loop that is a wake-up of an otherwise idle task per
/// connection, and tokio's scheduler passed most of them on to the other worker thread
/// (the client's ztunnel made 3.3–3.7 `futex` calls per connection with a `JoinSet`, 1.8–2.0
/// with this; BENCHMARKS.md, "A finished connection wakes nobody").
#[derive(Debug, Default)]
pub struct TaskSet {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// One slot per live task. The handle is filled in right after the spawn; a task that
    /// finished first has freed its slot already.
    live: Mutex<Slab<Option<AbortHandle>>>,
    /// Signalled when the last task leaves.
    emptied: Notify,
}

impl Shared {
    fn live(&self) -> MutexGuard<'_, Slab<Option<AbortHandle>>> {
        // Nothing panics while the lock is held (slab operations only), and the slab is
        // consistent between operations either way.
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Held by a task of the set (inside its future): takes the task's slot back when the
/// future finishes or is dropped (aborted, or the runtime shut down).
struct Member {
    shared: Arc<Shared>,
    key: usize,
}

impl Drop for Member {
    fn drop(&mut self) {
        let emptied = {
            let mut live = self.shared.live();
            live.try_remove(self.key);
            live.is_empty()
        };
        if emptied {
            self.shared.emptied.notify_waiters();
        }
    }
}

pin_project_lite::pin_project! {
    /// A task of the set with its member. A struct rather than an `async` block wrapping
    /// `task`: the block kept the unstarted future and the running one apart (rustc does
    /// not overlap them), doubling the task's size, ~1 KiB more per open connection in each
    /// proxy (BENCHMARKS.md, "A finished connection wakes nobody").
    struct Tracked<F> {
        #[pin]
        task: F,
        _member: Member,
    }
}

/// What [`TaskSet::spawn`] runs: `task` holding `member` until it is done or dropped.
fn track<F: Future<Output = ()>>(task: F, member: Member) -> impl Future<Output = ()> {
    Tracked {
        task,
        _member: member,
    }
}

impl<F: Future<Output = ()>> Future for Tracked<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.project().task.poll(cx)
    }
}

impl TaskSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Tasks that have not finished yet.
    pub fn len(&self) -> usize {
        self.shared.live().len()
    }

    pub fn is_empty(&self) -> bool {
        self.shared.live().is_empty()
    }

    /// Spawns `task` on the current runtime as a member of the set.
    ///
    /// # Panics
    /// Outside a tokio runtime, like `tokio::spawn`.
    pub fn spawn<F>(&mut self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let key = self.shared.live().insert(None);
        let member = Member {
            shared: self.shared.clone(),
            key,
        };
        // Not under the lock: a runtime that is shutting down drops the future inside
        // `spawn`, and with it the member, which takes the lock.
        let handle = tokio::spawn(track(task, member));
        // The task may have finished on another worker already and freed its slot. Slots
        // are only taken here, and `&mut self` makes this call the only one running, so a
        // slot that is still there is this task's.
        if let Some(slot) = self.shared.live().get_mut(key) {
            *slot = Some(handle.abort_handle());
        }
    }

    /// Aborts every task still running. They leave the set as the runtime drops them;
    /// [`TaskSet::wait`] tells when.
    pub fn abort_all(&mut self) {
        let handles: Vec<AbortHandle> = self
            .shared
            .live()
            .iter_mut()
            .filter_map(|(_, h)| h.take())
            .collect();
        for h in handles {
            h.abort();
        }
    }

    /// Resolves once no task is left.
    pub async fn wait(&self) {
        loop {
            let emptied = self.shared.emptied.notified();
            let mut emptied = std::pin::pin!(emptied);
            // Registered before the check, so a last task leaving in between is not missed.
            emptied.as_mut().enable();
            if self.is_empty() {
                return;
            }
            emptied.await;
        }
    }
}

impl Drop for TaskSet {
    fn drop(&mut self) {
        self.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    const DEADLINE: Duration = Duration::from_secs(10);

    /// Counts the drops of the futures that hold one (finished or aborted alike).
    #[derive(Clone, Default)]
    struct Drops(Arc<AtomicUsize>);
    struct Held(Drops);
    impl Drop for Held {
        fn drop(&mut self) {
            self.0.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    impl Drops {
        fn hold(&self) -> Held {
            Held(self.clone())
        }
        fn count(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn runtime(workers: usize) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_time()
            .build()
            .unwrap()
    }

    async fn until(what: &str, mut ok: impl FnMut() -> bool) {
        let end = tokio::time::Instant::now() + DEADLINE;
        while !ok() {
            assert!(
                tokio::time::Instant::now() < end,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// A finished task leaves the set by itself: nobody polls the set (a `JoinSet` would
    /// keep every one of them until its owner joined it). Ready tasks on a multi-thread
    /// runtime also finish before `spawn` has filled in their handle.
    #[test]
    fn finished_tasks_leave_the_set_without_the_owner() {
        for (workers, tasks) in [(1, 1), (1, 500), (2, 1), (2, 5_000), (4, 5_000)] {
            let rt = runtime(workers);
            rt.block_on(async {
                let mut set = TaskSet::new();
                let drops = Drops::default();
                for _ in 0..tasks {
                    let held = drops.hold();
                    set.spawn(async move {
                        drop(held);
                    });
                }
                until("every task to finish", || drops.count() == tasks).await;
                until("the set to empty", || set.is_empty()).await;
                tokio::time::timeout(DEADLINE, set.wait())
                    .await
                    .expect("wait on an empty set resolves");
            });
        }
    }

    /// Dropping the set and `abort_all` cut the tasks still running (also one spawned
    /// after many finished ones had freed and reused slots), and `wait` resolves only
    /// once they are gone.
    #[test]
    fn running_tasks_are_aborted_by_drop_and_abort_all() {
        for drop_set in [false, true] {
            let rt = runtime(2);
            rt.block_on(async {
                let mut set = TaskSet::new();
                let finished = Drops::default();
                for _ in 0..1_000 {
                    let held = finished.hold();
                    set.spawn(async move { drop(held) });
                }
                let running = Drops::default();
                for _ in 0..3 {
                    let held = running.hold();
                    set.spawn(async move {
                        let _held = held;
                        std::future::pending::<()>().await
                    });
                }
                until("the ready tasks to finish", || finished.count() == 1_000).await;
                until("only the running tasks to be left", || set.len() == 3).await;
                let waited = tokio::time::timeout(Duration::from_millis(50), set.wait()).await;
                assert!(waited.is_err(), "wait resolved with tasks running");
                assert_eq!(running.count(), 0);
                if drop_set {
                    drop(set);
                    until("the dropped set's tasks to be aborted", || {
                        running.count() == 3
                    })
                    .await;
                } else {
                    set.abort_all();
                    tokio::time::timeout(DEADLINE, set.wait())
                        .await
                        .expect("wait resolves once the aborted tasks are gone");
                    assert_eq!(running.count(), 3);
                    assert!(set.is_empty());
                }
            });
        }
    }

    /// `wait` resolves when the last task finishes on its own, whichever thread it ran on.
    #[test]
    fn wait_resolves_when_the_last_task_finishes() {
        let rt = runtime(2);
        rt.block_on(async {
            let mut set = TaskSet::new();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            set.spawn(async move {
                let _ = rx.await;
            });
            let waiter = {
                let set = &set;
                async move { set.wait().await }
            };
            let mut waiter = std::pin::pin!(waiter);
            assert!(
                tokio::time::timeout(Duration::from_millis(50), waiter.as_mut())
                    .await
                    .is_err(),
                "wait resolved with a task running"
            );
            tx.send(()).unwrap();
            tokio::time::timeout(DEADLINE, waiter)
                .await
                .expect("wait resolves after the last task");
        });
    }

    /// A runtime that shuts down drops the set's tasks; the set is still usable and its
    /// drop does not hang.
    /// The set's wrapper adds its member (a pointer and a key) to a task, not a second copy
    /// of the task's future.
    #[test]
    fn a_task_costs_its_future_and_the_member() {
        let held = [0u8; 1024];
        let task = async move {
            tokio::task::yield_now().await;
            std::hint::black_box(&held);
        };
        let plain = std::mem::size_of_val(&task);
        let member = Member {
            shared: Arc::default(),
            key: 0,
        };
        let wrapped = track(task, member);
        assert_eq!(
            std::mem::size_of_val(&wrapped),
            plain + std::mem::size_of::<Member>()
        );
    }

    #[test]
    fn a_runtime_shutdown_empties_the_set() {
        let rt = runtime(2);
        let running = Drops::default();
        let set = rt.block_on(async {
            let mut set = TaskSet::new();
            for _ in 0..10 {
                let held = running.hold();
                set.spawn(async move {
                    let _held = held;
                    std::future::pending::<()>().await
                });
            }
            set
        });
        drop(rt);
        assert_eq!(running.count(), 10);
        assert!(set.is_empty());
        drop(set);
    }
}
