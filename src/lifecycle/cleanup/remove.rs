//! The removal on disk and in git: a plan of steps, each of which can be undone, run by
//! a `Remover`; a failing step undoes the ones before it.

use std::fmt;
use std::fs::{self};
use std::os::fd::AsFd;
use std::path::Path;

use git2::{Oid, Repository};

use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::Store;

use super::reach::reachable_elsewhere;
use super::target::{Outcome, Target};
use crate::git::admin::AdminDirs;

/// Deletes `t`'s parked git entry in `removing`, when there is one and it is this
/// worktree's (checked as the entry was before it was parked; one from before that
/// check, or anything else there, is left, saying so).
/// Err's flag: what is there is not this worktree's entry (and is left).
fn delete_parked(t: &Target, removing: std::os::fd::BorrowedFd) -> Result<(), (String, bool)> {
    let parked = t.parked_admin();
    let name = parked.file_name().unwrap_or_default();
    let entry = match crate::git::Entry::open(removing, name) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err((format!("could not delete {}: {e}", parked.display()), false)),
    };
    entry
        .check(
            |b| b.starts_with(crate::git::admin::ADMIN_MARKER.as_bytes()),
            &t.repo_and_name(),
            t.uid,
        )
        .map_err(|why| (format!("{} {why}; not deleted", parked.display()), true))?;
    entry.remove(removing, name).map_err(|e| {
        (
            format!(
                "could not delete {}: {e} (deleted at the next mount)",
                parked.display()
            ),
            false,
        )
    })
}

/// Moves `entry`, checked already and found at `from` (a directory and a name in it),
/// to `to`; when what the name held by then was another directory (renamed there after
/// the check), that one goes back into `from`'s directory (see [`give_back`]) and the
/// move fails, saying so. `shown` are the paths
/// the messages name.
fn park_checked(
    entry: &crate::git::Entry,
    from: (std::os::fd::BorrowedFd, &std::ffi::OsStr),
    to: (std::os::fd::BorrowedFd, &std::ffi::OsStr),
    shown: (&Path, &Path),
) -> Result<(), String> {
    let (admin, parked) = shown;
    crate::beneath::rename_at(from.0, from.1, to.0, to.1, libc::RENAME_NOREPLACE)
        .map_err(|e| format!("rename {} -> {}: {e}", admin.display(), parked.display()))?;
    if entry.is_at(to.0, to.1) {
        return Ok(());
    }
    let kept = give_back(to, from.0, from.1, admin);
    Err(format!(
        "{} was replaced by another directory while it was being removed; that one is {kept}",
        admin.display()
    ))
}

/// Moves what is at `at` (a directory and a name in it: root's parking directory) back
/// into git's `worktrees` directory `dir`, as `name` when that is free, else under a
/// name of its own beside it (never kept where only root can reach it, nor where a
/// removal deletes). Says where it went. `shown` is the path `name` stands for.
fn give_back(
    at: (std::os::fd::BorrowedFd, &std::ffi::OsStr),
    dir: std::os::fd::BorrowedFd,
    name: &std::ffi::OsStr,
    shown: &Path,
) -> String {
    let mut last = None;
    for n in 0..100u32 {
        let mut to = name.to_os_string();
        if n > 0 {
            to.push(format!(".returned-{}-{n}", std::process::id()));
        }
        match crate::beneath::rename_at(at.0, at.1, dir, &to, libc::RENAME_NOREPLACE) {
            Ok(()) => return format!("put back as {}", shown.with_file_name(&to).display()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    format!(
        "not put back ({}) and left in worktreefs's parking directory, which nothing deletes it from: move it back into {} by hand",
        last.map(|e| e.to_string()).unwrap_or_default(),
        shown.parent().unwrap_or(shown).display()
    )
}

/// Whether `name` in `dir` is there at all (a symlink counts: it is not followed).
fn present(dir: std::os::fd::BorrowedFd, name: &std::ffi::OsStr) -> bool {
    crate::beneath::stat_at(dir, name).is_ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// git's `HEAD` and `index` copied beside the upper layer, the tip kept under a ref
    /// (`keep::keep`), so the removal can be undone later.
    Keep,
    /// `<state>/worktrees/<id>` out of the way (one rename into `<state>/removed`).
    ParkUpper,
    /// git's admin entry out of `worktrees/` (one rename), so git no longer lists it.
    ParkAdmin,
    /// The branch, when worktreefs created it and it is merged or pushed.
    DeleteBranch,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Keep => "keeping what it removes",
            Step::ParkUpper => "moving the upper layer away",
            Step::ParkAdmin => "removing git's worktree entry",
            Step::DeleteBranch => "deleting the branch",
        })
    }
}

pub fn plan(keep: bool, delete_branch: bool) -> Vec<Step> {
    let mut p = if keep { vec![Step::Keep] } else { Vec::new() };
    p.extend([Step::ParkUpper, Step::ParkAdmin]);
    if delete_branch {
        p.push(Step::DeleteBranch);
    }
    p
}

/// Carries out the steps of a removal, and takes each back.
pub trait Remover {
    fn run(&mut self, step: Step) -> Result<(), String>;
    fn undo(&mut self, step: Step) -> Result<(), String>;
}

/// Runs `plan`; on the first failing step, undoes the steps done, newest first, and says
/// which step failed and why. An undo that fails is part of the message.
pub fn execute(plan: &[Step], r: &mut dyn Remover) -> Result<(), String> {
    for (i, step) in plan.iter().enumerate() {
        if let Err(e) = r.run(*step) {
            let mut msg = format!("{step}: {e}");
            for done in plan[..i].iter().rev() {
                if let Err(u) = r.undo(*done) {
                    tracing::error!("undoing '{done}' after a failed cleanup: {u}");
                    msg.push_str(&format!(" (and undoing '{done}' failed: {u})"));
                }
            }
            return Err(msg);
        }
    }
    Ok(())
}

/// The removal on disk and in git. Every step also succeeds when it finds its work
/// already done, so a removal a dead daemon began can be run again to its end.
struct FsRemover<'a> {
    state: &'a StateDir,
    t: &'a Target,
    /// The branch tip, once the branch is deleted (to put it back).
    deleted_tip: Option<Oid>,
    /// Inspection found nothing staged: the index's objects are HEAD's.
    index_clean: bool,
}

/// How a removal recorded as `removal` (by [`run_removal`]) goes on.
pub(super) fn recorded(removal: &str) -> Removal {
    let parts: Vec<&str> = removal.split('+').collect();
    Removal {
        keep: parts.contains(&"keep"),
        delete_branch: parts.contains(&"branch"),
        what: if parts.contains(&"discard") {
            "discarded (carried on after a restart)".into()
        } else {
            "clean and pushed".into()
        },
        index_clean: false,
    }
}

impl Remover for FsRemover<'_> {
    fn run(&mut self, step: Step) -> Result<(), String> {
        match step {
            Step::Keep => super::keep::keep(self.state, self.t, self.index_clean),
            Step::ParkUpper => {
                let parked = self.t.parked_dir(self.state);
                if !self.t.dir.exists() && parked.exists() {
                    return Ok(());
                }
                // Parked by an older version, which parked in `trash/`.
                let legacy = self.state.trash().join(self.t.id.to_string());
                if !self.t.dir.exists() && legacy.exists() {
                    return fs::rename(&legacy, &parked).map_err(|e| {
                        format!("rename {} -> {}: {e}", legacy.display(), parked.display())
                    });
                }
                fs::rename(&self.t.dir, &parked).map_err(|e| {
                    format!(
                        "rename {} -> {}: {e}",
                        self.t.dir.display(),
                        parked.display()
                    )
                })
            }
            Step::ParkAdmin => {
                let (admin, parked) = (&self.t.admin, self.t.parked_admin());
                let name = admin.file_name().unwrap_or_default();
                let parked_name = parked.file_name().unwrap_or_default();
                let failed = |what: &str, e: std::io::Error| {
                    format!(
                        "{what} {}: {e} (reached through no symbolic link: the repository's owner may have made one)",
                        admin.display()
                    )
                };
                let dirs = AdminDirs::open(&self.t.gitdir).map_err(|e| {
                    format!("opening git directory {}: {e}", self.t.gitdir.display())
                })?;
                let worktrees = match dirs.worktrees(false) {
                    Ok(d) => d,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(failed("reaching", e)),
                };
                if !present(worktrees.as_fd(), name) {
                    return Ok(());
                }
                // Checked and moved as one directory, opened once: the repository's
                // owner can rename any entry there into this one's name, another
                // worktree's among them, before the check or between it and the move.
                let entry = crate::git::Entry::open(worktrees.as_fd(), name)
                    .map_err(|e| failed("opening", e))?;
                entry
                    .check(
                        |b| b.starts_with(crate::git::admin::ADMIN_MARKER.as_bytes()),
                        &self.t.repo_and_name(),
                        self.t.uid,
                    )
                    .map_err(|why| {
                        format!(
                            "{} {why}; left alone: if it is another worktree's, rename it back to that worktree's entry name",
                            admin.display()
                        )
                    })?;
                let removing = dirs
                    .removing(true)
                    .map_err(|e| format!("mkdir {}: {e}", parked.display()))?;
                // One parked before and never deleted (a removal put back, a crash);
                // anything else there goes back to git's directory.
                if let Err((e, not_ours)) = delete_parked(self.t, removing.as_fd()) {
                    if !not_ours {
                        return Err(e);
                    }
                    let kept = give_back(
                        (removing.as_fd(), parked_name),
                        worktrees.as_fd(),
                        parked_name,
                        admin,
                    );
                    tracing::warn!("{e}; {kept}");
                }
                park_checked(
                    &entry,
                    (worktrees.as_fd(), name),
                    (removing.as_fd(), parked_name),
                    (admin, &parked),
                )
            }
            Step::DeleteBranch => {
                let Some(branch) = &self.t.branch else {
                    return Ok(());
                };
                let repo = Repository::open(&self.t.gitdir).map_err(|e| e.to_string())?;
                let name = format!("refs/heads/{branch}");
                let Ok(r) = repo.find_reference(&name) else {
                    return Ok(());
                };
                let tip = r
                    .target()
                    .ok_or_else(|| format!("{name} is not a direct reference"))?;
                // Checked again now: the branch may have moved since inspection. Its tip is
                // on another ref, or its content is upstream (a squash or rebase merge).
                if !reachable_elsewhere(&repo, tip, Some(&name)).map_err(|e| e.to_string())?
                    && crate::git::integrated::integrated_as_owner(&self.t.gitdir, tip, &[])?
                        .is_none()
                {
                    return Err(format!(
                        "{name} now points at {tip}, which no other ref reaches and whose content is on no remote-tracking ref"
                    ));
                }
                // Through git, and only while it still names the tip checked.
                crate::git::ref_delete::delete_ref(&self.t.gitdir, &name, Some(tip))
                    .map_err(|e| format!("{e:#}"))?;
                self.deleted_tip = Some(tip);
                Ok(())
            }
        }
    }

    fn undo(&mut self, step: Step) -> Result<(), String> {
        match step {
            Step::Keep => super::keep::unkeep(self.t),
            Step::ParkUpper => {
                let parked = self.t.parked_dir(self.state);
                fs::rename(&parked, &self.t.dir).map_err(|e| e.to_string())
            }
            Step::ParkAdmin => {
                let parked = self.t.parked_admin();
                let name = self.t.admin.file_name().unwrap_or_default();
                let parked_name = parked.file_name().unwrap_or_default();
                let back = |e: std::io::Error| {
                    format!(
                        "putting {} back as {}: {e}",
                        parked.display(),
                        self.t.admin.display()
                    )
                };
                let dirs = AdminDirs::open(&self.t.gitdir).map_err(back)?;
                let removing = match dirs.removing(false) {
                    Ok(d) => d,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(back(e)),
                };
                if present(removing.as_fd(), parked_name) {
                    // `worktrees/` may have gone meanwhile (git prunes it once empty).
                    let worktrees = dirs.worktrees(true).map_err(back)?;
                    crate::beneath::rename_at(
                        removing.as_fd(),
                        parked_name,
                        worktrees.as_fd(),
                        name,
                        libc::RENAME_NOREPLACE,
                    )
                    .map_err(back)?;
                }
                Ok(())
            }
            Step::DeleteBranch => {
                let (Some(branch), Some(tip)) = (&self.t.branch, self.deleted_tip) else {
                    return Ok(());
                };
                let repo = Repository::open(&self.t.gitdir).map_err(|e| e.to_string())?;
                repo.reference(
                    &format!("refs/heads/{branch}"),
                    tip,
                    false,
                    "worktreefs: cleanup undone",
                )
                .map(|_| ())
                .map_err(|e| e.to_string())
            }
        }
    }
}

/// How a removal goes: whether it keeps (by the policy, else as recorded by a removal
/// carried on), whether the branch goes, and what it says of the worktree.
#[derive(Debug, Clone)]
pub(super) struct Removal {
    pub keep: bool,
    pub delete_branch: bool,
    /// "clean and pushed", or what `--discard` threw away.
    pub what: String,
    /// Inspection found nothing staged (so keeping needs no tree of the index).
    pub index_clean: bool,
}

/// Removes: records the decision, runs the steps, and records the outcome.
pub(super) fn run_removal(
    state: &StateDir,
    store: &mut Store,
    t: &Target,
    how: &Removal,
) -> LifecycleResult<Outcome> {
    let mut recorded = String::from("remove");
    if how.delete_branch {
        recorded.push_str("+branch");
    }
    if how.keep {
        recorded.push_str("+keep");
    }
    if how.what.starts_with("discarded") {
        recorded.push_str("+discard");
    }
    store.set_removal(t.id, &recorded)?;
    let mut r = FsRemover {
        state,
        t,
        deleted_tip: None,
        index_clean: how.index_clean,
    };
    match execute(&plan(how.keep, how.delete_branch), &mut r) {
        Ok(()) => {
            let branch = match (&t.branch, how.delete_branch) {
                (Some(b), true) => format!("; branch {b} deleted (nothing on it is only there)"),
                (Some(b), false) => format!("; branch {b} kept"),
                (None, _) => String::new(),
            };
            let why = store
                .last_event_reason(t.id, crate::lease::State::Deleting.as_str())?
                .unwrap_or_else(|| "cleanup".into());
            let kept = match how.keep {
                true => Some(super::keep::kept_record(state, t, &why)),
                false => None,
            };
            let detail = match &kept {
                Some(Ok(_)) => format!(
                    "{}{branch}; restorable with `worktreefs restore {}`",
                    how.what,
                    t.repo_and_name()
                ),
                Some(Err(why)) => format!("{}{branch}; not kept ({why})", how.what),
                None => format!("{}{branch}", how.what),
            };
            let keep = match &kept {
                Some(Ok(k)) => {
                    store.mark_removed_kept(t.id, &detail, k)?;
                    true
                }
                _ => {
                    if how.keep {
                        super::keep::drop_unkept(state, t);
                    }
                    store.mark_removed(t.id, &detail)?;
                    false
                }
            };
            crate::lifecycle::ports::release(state, store, t.id);
            purge(state, t, keep);
            tracing::info!(worktree = %t.path.display(), "removed: {detail}");
            Ok(Outcome::Removed(detail))
        }
        Err(e) => {
            let reason = format!("cleanup-error: {e}");
            store.retain(t.id, &t.path.to_string_lossy(), &reason)?;
            tracing::warn!(worktree = %t.path.display(), "retained: {reason}");
            Ok(Outcome::Retained(reason))
        }
    }
}

/// Deletes what a removal parked (its directory only when it is not kept), and the git
/// entries of its submodule views.
pub(super) fn purge(state: &StateDir, t: &Target, keep: bool) {
    crate::lifecycle::submodules::remove_admin_entries(
        state,
        &t.parked_dir(state),
        &t.repo_and_name(),
        t.uid,
    );
    if let Ok(dirs) = AdminDirs::open(&t.gitdir) {
        if let Ok(removing) = dirs.removing(false) {
            match delete_parked(t, removing.as_fd()) {
                Ok(()) => {}
                // Not this worktree's: back into git's directory.
                Err((e, true)) => {
                    let parked = t.parked_admin();
                    let name = parked.file_name().unwrap_or_default();
                    let kept = match dirs.worktrees(true) {
                        Ok(w) => give_back(
                            (removing.as_fd(), name),
                            w.as_fd(),
                            name,
                            &t.gitdir.join("worktrees").join(name),
                        ),
                        Err(w) => format!("left where it is ({w})"),
                    };
                    tracing::warn!("{e}; {kept}");
                }
                Err((e, false)) => tracing::warn!("{e}"),
            }
        }
    }
    for p in [t.parked_dir(state)].into_iter().filter(|_| !keep) {
        if p.exists() {
            if let Err(e) = fs::remove_dir_all(&p) {
                tracing::warn!(
                    "could not delete {}: {e} (deleted at the next mount)",
                    p.display()
                );
            }
        }
    }
}

/// The worktree's directory in the state dir was removed by hand: nothing is left to keep.
/// Its git entry goes too when worktreefs made it; the branch stays.
pub(super) fn gone_by_hand(
    state: &StateDir,
    store: &mut Store,
    t: &Target,
) -> LifecycleResult<Outcome> {
    let mut r = FsRemover {
        state,
        t,
        deleted_tip: None,
        index_clean: false,
    };
    if let Err(e) = r.run(Step::ParkAdmin) {
        tracing::warn!("{}: {e}", t.admin.display());
    }
    purge(state, t, false);
    // Its submodule views' records went with the directory: their entries are found by
    // name.
    if let Some(admin_name) = t.admin.file_name().and_then(|n| n.to_str()) {
        crate::lifecycle::submodules::remove_entries_by_name(
            state,
            &t.gitdir,
            admin_name,
            t.id,
            &t.repo_and_name(),
            &t.path,
            t.uid,
        );
    }
    let detail = format!(
        "its directory {} was removed by hand; branch kept",
        t.dir.display()
    );
    store.mark_removed(t.id, &detail)?;
    crate::lifecycle::ports::release(state, store, t.id);
    tracing::warn!(worktree = %t.path.display(), "{detail}");
    Ok(Outcome::Removed(detail))
}

impl Removal {
    /// The removal of a worktree found clean and pushed (or `integrated` upstream by
    /// content), kept by the policy.
    pub(super) fn clean(
        state: &StateDir,
        store: &Store,
        delete_branch: bool,
        integrated: Option<&str>,
        settled: Option<&str>,
    ) -> Removal {
        let mut what = match integrated.or(settled) {
            Some(how) => format!("clean; {how}"),
            None => String::from("clean and pushed"),
        };
        let keep = keeps_now(state, store, &mut what);
        // Commits whose content is upstream but which no other ref reaches stay on their
        // branch unless the removal keeps its tip (restorable): deleting it then would be
        // the only step nothing can undo.
        let delete_branch = delete_branch && (keep || integrated.is_none());
        if integrated.is_some() && !keep {
            what.push_str(" (its branch is kept: the removal keeps nothing)");
        }
        Removal {
            keep,
            delete_branch,
            what,
            index_clean: true,
        }
    }
}

/// Whether a removal now keeps: by the policy, and not while the disk is low (the copy
/// would be purged at once, and writing it could fill the disk); `what` then says so.
pub(super) fn keeps_now(state: &StateDir, store: &Store, what: &mut String) -> bool {
    let p = super::keep::KeepPolicy::of(store);
    match p.low_disk(&state.root) {
        Some(why) if p.keeps() => {
            tracing::warn!("removal keeps nothing: {why}");
            what.push_str(&format!(" (not kept: {why})"));
            false
        }
        _ => p.keeps(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parking moves the entry that was checked: another renamed into its name between
    /// the check and the move goes back, and the move fails saying so.
    #[test]
    fn parking_moves_only_the_entry_checked() {
        use std::ffi::OsStr;
        let d = tempfile::tempdir().unwrap();
        let (w, r) = (d.path().join("worktrees"), d.path().join("removing"));
        for name in ["mine", "theirs"] {
            fs::create_dir_all(w.join(name)).unwrap();
            fs::write(w.join(name).join("HEAD"), name).unwrap();
        }
        fs::create_dir(&r).unwrap();
        let wfd = crate::beneath::open_root(&w).unwrap();
        let rfd = crate::beneath::open_root(&r).unwrap();
        let shown = (w.join("mine"), r.join("1-mine"));
        let entry = crate::git::Entry::open(wfd.as_fd(), OsStr::new("mine")).unwrap();
        fs::rename(w.join("mine"), w.join("away")).unwrap();
        fs::rename(w.join("theirs"), w.join("mine")).unwrap();
        let err = park_checked(
            &entry,
            (wfd.as_fd(), OsStr::new("mine")),
            (rfd.as_fd(), OsStr::new("1-mine")),
            (&shown.0, &shown.1),
        )
        .unwrap_err();
        assert!(err.contains("was replaced by another directory"), "{err}");
        assert!(err.contains("put back"), "{err}");
        assert_eq!(fs::read(w.join("mine/HEAD")).unwrap(), b"theirs");
        assert_eq!(fs::read_dir(&r).unwrap().count(), 0);
        // Put back where it was, the one checked is parked.
        fs::rename(w.join("mine"), w.join("theirs")).unwrap();
        fs::rename(w.join("away"), w.join("mine")).unwrap();
        park_checked(
            &entry,
            (wfd.as_fd(), OsStr::new("mine")),
            (rfd.as_fd(), OsStr::new("1-mine")),
            (&shown.0, &shown.1),
        )
        .unwrap();
        assert_eq!(fs::read(r.join("1-mine/HEAD")).unwrap(), b"mine");
        // What goes back finds its name taken again: it goes back under a name of its
        // own, never kept in the parking directory.
        fs::create_dir_all(w.join("mine")).unwrap();
        fs::create_dir_all(r.join("9-x")).unwrap();
        fs::write(r.join("9-x/HEAD"), b"theirs").unwrap();
        let said = give_back(
            (rfd.as_fd(), OsStr::new("9-x")),
            wfd.as_fd(),
            OsStr::new("mine"),
            &shown.0,
        );
        assert!(said.contains(".returned-"), "{said}");
        assert!(!r.join("9-x").exists());
        let back = fs::read_dir(&w)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("mine.returned-")
            })
            .count();
        assert_eq!(back, 1);
    }

    /// Records what ran and was undone; fails at one step.
    struct Fake {
        fail_at: Option<Step>,
        log: Vec<String>,
    }

    impl Remover for Fake {
        fn run(&mut self, step: Step) -> Result<(), String> {
            if self.fail_at == Some(step) {
                return Err("disk full".into());
            }
            self.log.push(format!("run {step:?}"));
            Ok(())
        }
        fn undo(&mut self, step: Step) -> Result<(), String> {
            self.log.push(format!("undo {step:?}"));
            Ok(())
        }
    }

    #[test]
    fn a_failing_step_undoes_the_ones_before_it() {
        // (delete branch?, failing step, result, log)
        let rows: Vec<(bool, Option<Step>, bool, Vec<&str>)> = vec![
            (false, None, true, vec!["run ParkUpper", "run ParkAdmin"]),
            (
                true,
                None,
                true,
                vec!["run ParkUpper", "run ParkAdmin", "run DeleteBranch"],
            ),
            (true, Some(Step::ParkUpper), false, vec![]),
            (
                true,
                Some(Step::ParkAdmin),
                false,
                vec!["run ParkUpper", "undo ParkUpper"],
            ),
            (
                true,
                Some(Step::DeleteBranch),
                false,
                vec![
                    "run ParkUpper",
                    "run ParkAdmin",
                    "undo ParkAdmin",
                    "undo ParkUpper",
                ],
            ),
        ];
        for (db, fail_at, ok, log) in rows {
            let mut f = Fake {
                fail_at,
                log: Vec::new(),
            };
            let r = execute(&plan(false, db), &mut f);
            assert_eq!(r.is_ok(), ok, "{fail_at:?}");
            if let Err(e) = r {
                assert!(e.ends_with("disk full"), "{e}");
            }
            assert_eq!(f.log, log, "{fail_at:?}");
        }
    }
}
