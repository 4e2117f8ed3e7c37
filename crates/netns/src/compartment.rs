//! Entering a Windows network compartment (`spec/windows.md` §1.5), written against
//! [`CompartmentOps`] so the rules are tested on Linux with a fake: a thread is moved into a
//! pod's compartment only for a closure, always moved back to the compartment it was in
//! before (read first, never assumed to be the host's), also when the closure panics, and
//! the work runs on one dedicated OS thread ([`CompartmentThread`]) so no runtime worker
//! ever changes compartment. A socket keeps the compartment it was created in, so only
//! `socket()` needs to run there (as on Linux, where the namespace plays that part).
//!
//! Windows implements the trait with `GetCurrentThreadCompartmentId` /
//! `SetCurrentThreadCompartmentId` (`SystemCompartments`).

use std::sync::{Arc, mpsc};
use std::thread;

/// HNS's "no compartment yet" (`ambit_contract::windows::NO_COMPARTMENT`).
pub const NO_COMPARTMENT: u32 = 0;

/// Reading and changing the calling thread's network compartment.
pub trait CompartmentOps: Send + Sync + 'static {
    /// The calling thread's compartment.
    fn current(&self) -> Result<u32, CompartmentError>;
    /// Moves the calling thread into `id`.
    fn set(&self, id: u32) -> Result<(), CompartmentError>;
}

/// Why work could not run in a compartment; names the compartment.
#[derive(Debug, thiserror::Error)]
pub enum CompartmentError {
    /// HNS has no compartment for the namespace yet (id 0).
    #[error("the namespace has no network compartment yet")]
    NoCompartment,
    /// Reading the thread's compartment failed.
    #[error("reading the thread's network compartment: {0}")]
    Current(std::io::Error),
    /// Entering the compartment failed.
    #[error("entering network compartment {id}: {source}")]
    Enter {
        /// The compartment.
        id: u32,
        /// The OS error.
        source: std::io::Error,
    },
    /// The system calls are not available (not Windows, or an `iphlpapi.dll` without them).
    #[error("network compartments are not available here: {0}")]
    Unavailable(String),
    /// The dedicated compartment thread is gone or could not be started.
    #[error("the network compartment thread: {0}")]
    Thread(String),
    /// The work panicked inside the compartment (the thread was moved back and lives on).
    #[error("work inside network compartment {0} panicked")]
    Panicked(u32),
}

/// Runs `f` on the calling thread inside compartment `target` and moves the thread back to
/// the compartment it was in before, also when `f` panics. `target` 0 (no compartment yet)
/// is refused before anything changes.
///
/// # Aborts
///
/// If moving back fails the process aborts: a thread left in a pod's compartment would
/// create later sockets there, which is worse than a crash (as `in_netns` on Linux).
pub fn in_compartment<O: CompartmentOps + ?Sized, R>(
    ops: &O,
    target: u32,
    f: impl FnOnce() -> R,
) -> Result<R, CompartmentError> {
    if target == NO_COMPARTMENT {
        return Err(CompartmentError::NoCompartment);
    }
    let previous = ops.current()?;
    if previous == target {
        return Ok(f());
    }
    ops.set(target)?;
    let _restore = Restore { ops, previous };
    Ok(f())
}

struct Restore<'a, O: CompartmentOps + ?Sized> {
    ops: &'a O,
    previous: u32,
}

impl<O: CompartmentOps + ?Sized> Drop for Restore<'_, O> {
    fn drop(&mut self) {
        if let Err(e) = self.ops.set(self.previous) {
            eprintln!(
                "ambit-netns: cannot move the thread back to network compartment {}: {e}; aborting",
                self.previous
            );
            std::process::abort();
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// One dedicated OS thread that runs work inside compartments, one job at a time; cheap to
/// clone (all clones share the thread, which ends when the last clone is dropped).
#[derive(Clone)]
pub struct CompartmentThread {
    ops: Arc<dyn CompartmentOps>,
    jobs: mpsc::SyncSender<Job>,
}

impl std::fmt::Debug for CompartmentThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompartmentThread").finish_non_exhaustive()
    }
}

/// Jobs waiting for the compartment thread; a caller blocks while it is full.
const QUEUE: usize = 64;

impl CompartmentThread {
    /// Starts the thread.
    pub fn spawn(ops: Arc<dyn CompartmentOps>) -> Result<Self, CompartmentError> {
        let (jobs, rx) = mpsc::sync_channel::<Job>(QUEUE);
        thread::Builder::new()
            .name("compartment".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .map_err(|e| CompartmentError::Thread(e.to_string()))?;
        Ok(Self { ops, jobs })
    }

    /// Runs `f` inside compartment `id` on the dedicated thread and waits for its result
    /// (a blocking wait: meant for short work such as creating a socket). A panic in `f` is
    /// returned as [`CompartmentError::Panicked`] after the thread moved back.
    pub fn run<R: Send + 'static>(
        &self,
        id: u32,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, CompartmentError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let ops = self.ops.clone();
        let job: Job = Box::new(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                in_compartment(ops.as_ref(), id, f)
            }))
            .unwrap_or(Err(CompartmentError::Panicked(id)));
            let _ = tx.send(result);
        });
        self.jobs
            .send(job)
            .map_err(|_| CompartmentError::Thread("stopped".into()))?;
        rx.recv()
            .map_err(|_| CompartmentError::Thread("stopped before answering".into()))?
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::thread::ThreadId;

    use super::*;

    /// Per-thread compartments like Windows, starting in `start`; records every call.
    struct Fake {
        start: u32,
        threads: Mutex<HashMap<ThreadId, u32>>,
        calls: Mutex<Vec<(ThreadId, &'static str, u32)>>,
        refuse: Option<u32>,
    }

    impl Fake {
        fn new(start: u32) -> Self {
            Self {
                start,
                threads: Mutex::default(),
                calls: Mutex::default(),
                refuse: None,
            }
        }
        fn sets(&self) -> Vec<u32> {
            let calls = self.calls.lock().unwrap();
            calls.iter().filter(|c| c.1 == "set").map(|c| c.2).collect()
        }
        fn now(&self) -> u32 {
            self.current().unwrap()
        }
    }

    impl CompartmentOps for Fake {
        fn current(&self) -> Result<u32, CompartmentError> {
            let me = thread::current().id();
            let id = *self.threads.lock().unwrap().get(&me).unwrap_or(&self.start);
            self.calls.lock().unwrap().push((me, "get", id));
            Ok(id)
        }
        fn set(&self, id: u32) -> Result<(), CompartmentError> {
            let me = thread::current().id();
            self.calls.lock().unwrap().push((me, "set", id));
            if self.refuse == Some(id) {
                return Err(CompartmentError::Enter {
                    id,
                    source: std::io::ErrorKind::PermissionDenied.into(),
                });
            }
            self.threads.lock().unwrap().insert(me, id);
            Ok(())
        }
    }

    #[test]
    fn enters_then_restores_the_previous_compartment_not_the_host() {
        // The thread starts in compartment 5, not the host's 1: restoring must go to 5.
        let fake = Fake::new(5);
        let seen = in_compartment(&fake, 9, || fake.now()).unwrap();
        assert_eq!(seen, 9);
        assert_eq!(fake.sets(), [9, 5]);
        assert_eq!(fake.now(), 5);
    }

    #[test]
    fn already_there_changes_nothing() {
        let fake = Fake::new(9);
        assert_eq!(in_compartment(&fake, 9, || 1).unwrap(), 1);
        assert_eq!(fake.sets(), Vec::<u32>::new());
    }

    #[test]
    fn a_panic_still_restores() {
        let fake = Fake::new(1);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = in_compartment(&fake, 4, || panic!("boom"));
        }));
        assert!(caught.is_err());
        assert_eq!(fake.sets(), [4, 1]);
        assert_eq!(fake.now(), 1);
    }

    #[test]
    fn refusals_run_nothing() {
        let fake = Fake::new(1);
        let ran = std::cell::Cell::new(false);
        let no = in_compartment(&fake, NO_COMPARTMENT, || ran.set(true));
        assert!(matches!(no, Err(CompartmentError::NoCompartment)));
        assert!(fake.calls.lock().unwrap().is_empty(), "not even read");
        let fake = Fake {
            refuse: Some(3),
            ..Fake::new(1)
        };
        let err = in_compartment(&fake, 3, || ran.set(true)).unwrap_err();
        assert!(
            matches!(err, CompartmentError::Enter { id: 3, .. }),
            "{err}"
        );
        assert!(!ran.get());
        assert_eq!(fake.sets(), [3], "a failed enter is not 'restored'");
        assert_eq!(fake.now(), 1);
    }

    #[test]
    fn the_dedicated_thread_does_the_work_and_survives_panics() {
        let fake = Arc::new(Fake::new(1));
        let ct = CompartmentThread::spawn(fake.clone()).unwrap();
        let caller = thread::current().id();
        let f2 = fake.clone();
        let (thread_id, seen) = ct
            .run(7, move || (thread::current().id(), f2.now()))
            .unwrap();
        assert_ne!(thread_id, caller, "work ran on the dedicated thread");
        assert_eq!(seen, 7);
        assert_eq!(fake.now(), 1, "the caller never moved");
        let err = ct.run(8, || -> u32 { panic!("boom") }).unwrap_err();
        assert!(matches!(err, CompartmentError::Panicked(8)), "{err}");
        let f3 = fake.clone();
        let (again, seen) = ct
            .run(6, move || (thread::current().id(), f3.now()))
            .unwrap();
        assert_eq!((again, seen), (thread_id, 6), "same thread, still serving");
        let on_thread: Vec<u32> = fake
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == thread_id && c.1 == "set")
            .map(|c| c.2)
            .collect();
        assert_eq!(on_thread, [7, 1, 8, 1, 6, 1]);
    }
}
