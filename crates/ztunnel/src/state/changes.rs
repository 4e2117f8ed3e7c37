//! What each authorization-relevant change touched, so the connection tracker re-checks only
//! the open connections a change can affect instead of every one on every workload update.
//!
//! Every change gets the next generation (the value on the state's watch channel) and an
//! entry in a bounded log. A reader remembers the last generation it handled and asks for
//! what came after; once the log has dropped entries the reader has not seen, the answer is
//! "everything" (fail closed: a lost entry means a full re-check, never a skipped one).

use std::collections::VecDeque;

use ambit_model::names::{PolicyKey, WorkloadUid};

/// Entries kept; a reader further behind re-checks everything.
pub(super) const LOG_CAPACITY: usize = 1024;

/// The connections a change can affect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Affected {
    /// Connections to this workload (the record was added, replaced or removed).
    Workload(WorkloadUid),
    /// Connections to workloads this namespace- or selector-scoped policy applies to: those
    /// whose namespace is the policy's, and those whose record names the policy.
    Policy(PolicyKey),
    /// Every connection (a global policy, a local config reload).
    All,
}

/// What happened after a generation, for one reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// Exactly these changes (possibly none).
    Changes(Vec<Affected>),
    /// The log no longer reaches back that far: treat every connection as affected.
    Everything,
}

/// The bounded log.
#[derive(Debug, Default)]
pub(super) struct ChangeLog {
    /// The generation of the newest entry (0 before any change).
    generation: u64,
    entries: VecDeque<(u64, Affected)>,
}

impl ChangeLog {
    /// Records a change; returns its generation.
    pub(super) fn push(&mut self, affected: Affected) -> u64 {
        self.generation = self.generation.wrapping_add(1);
        if self.entries.len() == LOG_CAPACITY {
            self.entries.pop_front();
        }
        self.entries.push_back((self.generation, affected));
        self.generation
    }

    #[cfg(test)]
    fn generation(&self) -> u64 {
        self.generation
    }

    /// The changes after generation `seen`, and the generation they bring the reader to.
    pub(super) fn since(&self, seen: u64) -> (Since, u64) {
        let behind = self.generation.wrapping_sub(seen);
        if behind == 0 {
            return (Since::Changes(Vec::new()), self.generation);
        }
        if behind > self.entries.len() as u64 {
            return (Since::Everything, self.generation);
        }
        // The last `behind` entries are exactly the unseen ones.
        let skip = self.entries.len() - behind as usize;
        let changes = self.entries.iter().skip(skip).map(|(_, a)| a.clone());
        (Since::Changes(changes.collect()), self.generation)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn w(name: &str) -> Affected {
        Affected::Workload(WorkloadUid::new(format!("Kubernetes//Pod/default/{name}")).unwrap())
    }

    #[test]
    fn a_reader_gets_what_it_has_not_seen_or_everything_once_the_log_dropped_it() {
        let mut log = ChangeLog::default();
        assert_eq!(log.since(0), (Since::Changes(vec![]), 0));
        let g1 = log.push(w("a"));
        let g2 = log.push(Affected::All);
        assert_eq!(
            log.since(0),
            (Since::Changes(vec![w("a"), Affected::All]), g2)
        );
        assert_eq!(log.since(g1), (Since::Changes(vec![Affected::All]), g2));
        assert_eq!(log.since(g2), (Since::Changes(vec![]), g2));
        for i in 0..LOG_CAPACITY {
            log.push(w(&format!("p{i}")));
        }
        let newest = log.generation();
        // g1 and g2 fell out: a reader that saw only g1 must re-check everything.
        assert_eq!(log.since(g1), (Since::Everything, newest));
        // A reader exactly at the oldest kept entry's predecessor still gets the list.
        match log.since(g2) {
            (Since::Changes(c), g) => {
                assert_eq!(c.len(), LOG_CAPACITY);
                assert_eq!(g, newest);
            }
            other => panic!("{other:?}"),
        }
    }
}
