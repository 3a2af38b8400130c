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
    /// What runs a repository's teardown command before a removal, where a mount serves
    /// the worktree (the daemon's): none elsewhere (where a removal with a teardown
    /// waits for a mount, `awaiting_mount`, or is refused, `reclaim` with no daemon).
    teardowns: Option<crate::lifecycle::setup::Launcher>,
    /// The daemon's own mount, once made (none recorded elsewhere): what tells whether it
    /// has gone.
    own_mount: crate::mounttable::OwnMount,
    /// A removal that would run a teardown is left `deleting` for the sweeper to finish
    /// (teardown, then removal) rather than done now: for `rmdir`, which is answered
    /// while the kernel holds the lock the teardown's way in needs.
    defer_teardowns: bool,
    /// These inspections run where no mount serves the worktrees (boot reconcile, before
    /// the mount is up; the cleanup at its end, once it has gone): a removal that would
    /// run a teardown is left `deleting` for the sweeper of the next mount, which runs
    /// the teardown inside the worktree first.
    awaiting_mount: bool,
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
            teardowns: None,
            own_mount: Default::default(),
            defer_teardowns: false,
            awaiting_mount: false,
        }
    }

    /// These inspections, a removal with a teardown to run left to the sweeper.
    pub fn deferring_teardowns(mut self) -> Inspection {
        self.defer_teardowns = true;
        self
    }

    /// These inspections, run where no mount serves the worktrees: a removal with a
    /// teardown to run waits for one ([`Inspection::waits_for_mount`]).
    pub fn awaiting_mount(mut self) -> Inspection {
        self.awaiting_mount = true;
        self
    }

    /// Whether a removal of `row` found removable waits for the sweeper of the next
    /// mount: its repository has a teardown command (which runs inside the worktree), or
    /// may have (it cannot be read), and no mount serves it now (these inspections are
    /// made so, or the daemon's mount at `mountpoint` has gone: a lazy unmount during a
    /// cleanup round).
    pub(super) fn waits_for_mount(
        &self,
        store: &crate::store::Store,
        row: &crate::store::WorktreeRow,
        mountpoint: &std::path::Path,
    ) -> bool {
        let unserved = self.awaiting_mount || self.mount_gone(mountpoint);
        unserved
            && row.removal.is_none()
            && store
                .hooks_of(row.repo_id)
                .map_or(true, |h| h.on_remove.is_some())
    }

    /// Whether these are a mount's inspections (they run teardowns) and its mount at
    /// `mountpoint` has gone (a lazy unmount during a cleanup round).
    pub(super) fn mount_gone(&self, mountpoint: &std::path::Path) -> bool {
        self.teardowns.is_some() && self.own_mount_gone(mountpoint)
    }

    /// Whether the mount at `mountpoint` has gone, told by the device the daemon recorded
    /// for its own (a copy of it elsewhere, or another daemon's at the same path, is not
    /// it).
    pub fn own_mount_gone(&self, mountpoint: &std::path::Path) -> bool {
        self.own_mount.gone(mountpoint)
    }

    /// Whether a removal of `row` is left to the sweeper (it has a teardown to run, and
    /// these inspections defer them).
    pub(super) fn defers(
        &self,
        store: &crate::store::Store,
        row: &crate::store::WorktreeRow,
    ) -> bool {
        self.defer_teardowns && self.tears_down(store, row)
    }

    /// Whether a removal of `row` runs a teardown command here: its repository has one,
    /// and these inspections run them.
    pub(super) fn tears_down(
        &self,
        store: &crate::store::Store,
        row: &crate::store::WorktreeRow,
    ) -> bool {
        self.teardowns.is_some()
            && store
                .hooks_of(row.repo_id)
                .is_ok_and(|h| h.on_remove.is_some())
    }

    /// Whether worktree `id` runs its teardown command now, through these inspections'
    /// launcher.
    pub fn tearing_down(&self, id: crate::ids::WorktreeId) -> bool {
        self.teardowns
            .as_ref()
            .is_some_and(|l| l.runners.tearing_down(id))
    }

    /// These inspections, a mount's: teardown commands run through `launcher` before a
    /// removal, and the mount is `own_mount` (recorded once it is made).
    pub fn tearing_down_with(
        mut self,
        launcher: crate::lifecycle::setup::Launcher,
        own_mount: crate::mounttable::OwnMount,
    ) -> Inspection {
        self.teardowns = Some(launcher);
        self.own_mount = own_mount;
        self
    }

    /// Runs worktree `row`'s teardown command, if its repository has one and a mount
    /// serves it (see [`crate::lifecycle::setup::Launcher::tear_down`]), ended by `until`
    /// when given. Err: the command moved the worktree's HEAD or branch, and the removal
    /// must not go on (why).
    pub(super) fn tear_down(
        &self,
        store: &crate::store::Store,
        row: &crate::store::WorktreeRow,
        until: Option<std::time::Instant>,
    ) -> Result<(), String> {
        match &self.teardowns {
            Some(l) => l.tear_down(store, row, until),
            None => {
                if store
                    .hooks_of(row.repo_id)
                    .is_ok_and(|h| h.on_remove.is_some())
                {
                    tracing::info!(
                        "{}/{}: its teardown command is not run: nothing mounted serves it",
                        row.repo,
                        row.name
                    );
                }
                Ok(())
            }
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
            .field("tearing_down", &self.teardowns.is_some())
            .field("deferring_teardowns", &self.defer_teardowns)
            .field("awaiting_mount", &self.awaiting_mount)
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
