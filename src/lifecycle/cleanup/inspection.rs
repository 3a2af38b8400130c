//! How cleanup inspects a worktree, as the daemon (or a command without one) was set up:
//! how long one inspection may take, and the mounted view to ask what git's fsmonitor
//! hook would answer. Passed to every entry point of cleanup; nothing of it is global.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::fsmonitor::FsmonitorAnswers;

/// How cleanup inspects.
#[derive(Clone)]
pub struct Inspection {
    /// How long one inspection may take before the worktree is retained for it
    /// (`mount --inspect-timeout`).
    pub timeout: Duration,
    /// How long one run of git for it may take (`mount --filter-timeout`).
    pub filter_timeout: Duration,
    /// The mounted view, while there is one: inspection then trusts the index entries git
    /// trusts (see `fsmonitor_valid`).
    answers: Option<Weak<dyn FsmonitorAnswers>>,
}

impl Inspection {
    /// The default of `mount --inspect-timeout`.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

    /// Inspections bounded by `timeout` (at least a millisecond), each run of git in them
    /// by `filter_timeout`, with no view to ask.
    pub fn new(timeout: Duration, filter_timeout: Duration) -> Inspection {
        Inspection {
            timeout: timeout.max(Duration::from_millis(1)),
            filter_timeout,
            answers: None,
        }
    }

    /// These inspections, asking `view` what its fsmonitor hook would answer for as long
    /// as it lives.
    pub fn asking<V: FsmonitorAnswers + 'static>(mut self, view: &Arc<V>) -> Inspection {
        let weak: Weak<dyn FsmonitorAnswers> = Arc::downgrade(view) as _;
        self.answers = Some(weak);
        self
    }

    pub(super) fn answers(&self) -> Option<Weak<dyn FsmonitorAnswers>> {
        self.answers.clone()
    }

    /// How long the daemon waits on a repository's files it reads as it serves a request
    /// (the making of a submodule's view): the inspection timeout, at most a minute (a
    /// FUSE worker waits meanwhile).
    pub fn request_timeout(&self) -> Duration {
        self.timeout.min(Duration::from_secs(60))
    }
}

impl Default for Inspection {
    fn default() -> Inspection {
        Inspection::new(
            Inspection::DEFAULT_TIMEOUT,
            crate::git::filters::DEFAULT_TIMEOUT,
        )
    }
}

impl std::fmt::Debug for Inspection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspection")
            .field("timeout", &self.timeout)
            .field("filter_timeout", &self.filter_timeout)
            .field("asking_a_view", &self.answers.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WorktreeId;

    struct Answers(Vec<Vec<u8>>);

    impl FsmonitorAnswers for Answers {
        fn changed_since(&self, _: WorktreeId, _: &str) -> Option<Vec<Vec<u8>>> {
            Some(self.0.clone())
        }
    }

    #[test]
    fn the_view_is_asked_while_it_lives_and_not_after() {
        let view = Arc::new(Answers(vec![b"a".to_vec()]));
        let how = Inspection::new(Duration::from_secs(5), Duration::from_secs(1)).asking(&view);
        let asked = how.answers().and_then(|w| w.upgrade()).unwrap();
        assert_eq!(
            asked.changed_since(WorktreeId(1), "t"),
            Some(vec![b"a".to_vec()])
        );
        drop(asked);
        drop(view);
        assert!(how.answers().and_then(|w| w.upgrade()).is_none());
        assert!(Inspection::default().answers().is_none());
    }

    #[test]
    fn a_request_waits_at_most_a_minute_and_a_zero_timeout_is_a_millisecond() {
        assert_eq!(
            Inspection::default().request_timeout(),
            Duration::from_secs(60)
        );
        assert_eq!(
            Inspection::new(Duration::from_secs(5), Duration::from_secs(1)).request_timeout(),
            Duration::from_secs(5)
        );
        assert_eq!(
            Inspection::new(Duration::ZERO, Duration::from_secs(1)).timeout,
            Duration::from_millis(1)
        );
    }
}
