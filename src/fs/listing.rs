//! Directory listings: the merge of an upper directory and its base tree, and the
//! readdir offsets the kernel continues from.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::beneath;
use crate::ino;
use crate::layout::UpperDir;

use super::catalog::repo_ino;
use super::control::{is_control_dir, ControlDir, CONTROL_INO, CONTROL_NAME};
use super::error::{ErrorKind, FsError, FsResult};
use super::handles::HandleKind;
use super::inodes::{join_rel, ROOT_INO};
use super::nodes::{control_ino, NodeKind, NodeTable};
use super::place::{held, is_changing, stale_io};
use super::types::Fh;
use super::types::{DirEntry, FType, GITFILE_NAME};
use super::view::View;
use crate::ino::Ino;

impl View {
    pub(super) fn merged_listing(&self, t: &NodeTable, ino: Ino) -> FsResult<Vec<DirEntry>> {
        let (wt, ov, is_root) = t.wt_of(ino)?;
        if ov.ftype != FType::Dir {
            return Err(FsError::not_dir());
        }
        let rel = t.rel_path(ino)?;
        let child_ino = |name: &[u8]| ino::path_ino(wt.ident.ino_space, &join_rel(&rel, name));
        let mut names: BTreeMap<OsString, DirEntry> = BTreeMap::new();
        let mut upper = UpperDir::default();
        if t.get(ino).is_some_and(|n| n.is_unlinked()) {
            // A removed directory lists as empty, as on ext4.
            return Ok(Vec::new());
        }
        if ov.in_upper {
            let (_, rel, expect) = t.dir_spec(ino)?;
            let dir = beneath::dir(wt.upper.fd.as_fd(), &rel).and_then(|d| {
                if expect != 0 && beneath::fstat(d.as_fd())?.st_ino != expect {
                    return Err(stale_io());
                }
                Ok(d)
            });
            let listed = |e| {
                FsError::io(
                    format!(
                        "listing {}/{}",
                        wt.ident.name,
                        String::from_utf8_lossy(&rel)
                    ),
                    e,
                )
            };
            let dir = dir.map_err(listed)?;
            upper = UpperDir::read(dir.as_fd(), &wt.upper.whiteouts).map_err(listed)?;
            for e in &upper.entries {
                let name = &e.name;
                if is_root && name == GITFILE_NAME {
                    continue;
                }
                let kind = match e.d_type {
                    libc::DT_DIR => FType::Dir,
                    libc::DT_LNK => FType::Symlink,
                    libc::DT_FIFO => FType::Fifo,
                    libc::DT_SOCK => FType::Socket,
                    libc::DT_CHR => FType::CharDev,
                    libc::DT_BLK => FType::BlockDev,
                    libc::DT_REG => FType::File,
                    _ => beneath::stat_at(dir.as_fd(), name)
                        .map(|st| FType::from_mode(st.st_mode))
                        .map_err(listed)?,
                };
                names.insert(
                    name.clone(),
                    DirEntry {
                        ino: Ino(child_ino(name.as_bytes())),
                        kind,
                        name: name.clone(),
                    },
                );
            }
        }
        if let Some(listing) = wt.base.tree_of(&self.objects, &ov)? {
            for e in &listing.entries {
                if names.contains_key(&e.name) || upper.whiteouts.contains(&e.name) {
                    continue;
                }
                names.insert(
                    e.name.clone(),
                    DirEntry {
                        ino: Ino(child_ino(e.name.as_bytes())),
                        kind: FType::from_git_mode(e.mode),
                        name: e.name.clone(),
                    },
                );
            }
        }
        let mut out = Vec::with_capacity(names.len() + 1);
        let gitfile = DirEntry {
            ino: Ino(ino::path_ino(wt.ident.ino_space, b".git")),
            kind: FType::File,
            name: GITFILE_NAME.into(),
        };
        if is_root && !wt.is_submodule() {
            out.push(gitfile);
            out.extend(names.into_values());
        } else {
            out.extend(names.into_values());
            // A submodule's `.git` is listed last: `rm -r` and git remove in listing
            // order, so one cut short leaves it, and git inside still works.
            if is_root && !upper.whiteouts.contains(OsStr::new(GITFILE_NAME)) {
                out.push(gitfile);
            }
        }
        Ok(out)
    }

    pub(super) fn listing(&self, ino: Ino) -> FsResult<Vec<DirEntry>> {
        let kind = {
            let t = self.nodes.read();
            t.kind(ino).cloned().ok_or_else(|| FsError::stale(ino))?
        };
        match kind {
            NodeKind::Root => {
                self.refresh()?;
                let mut out = vec![DirEntry {
                    ino: CONTROL_INO,
                    kind: FType::Dir,
                    name: CONTROL_NAME.into(),
                }];
                for r in self.catalog.repos() {
                    out.push(DirEntry {
                        ino: repo_ino(r.id),
                        kind: FType::Dir,
                        name: r.name.clone().into(),
                    });
                }
                Ok(out)
            }
            NodeKind::Repo(repo_id) => {
                self.refresh()?;
                let mut out: Vec<DirEntry> = self
                    .catalog
                    .worktrees()
                    .iter()
                    .filter(|w| w.ident.repo_id == repo_id)
                    .map(|w| DirEntry {
                        ino: Ino(ino::path_ino(w.ident.ino_space, b"")),
                        kind: FType::Dir,
                        name: w.ident.name.clone().into(),
                    })
                    .collect();
                out.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(out)
            }
            NodeKind::ControlDir(dir) => {
                let names = self.control_names(dir)?;
                let t = self.nodes.read();
                Ok(names
                    .into_iter()
                    .map(|n| DirEntry {
                        // The inode stat gives: fixed under `.control` itself.
                        ino: (dir == ControlDir::Top)
                            .then(|| t.child(ino, OsStr::new(&n)))
                            .flatten()
                            .unwrap_or_else(|| control_ino(dir, OsStr::new(&n))),
                        kind: if dir == ControlDir::Top && is_control_dir(&n) {
                            FType::Dir
                        } else {
                            FType::File
                        },
                        name: n.into(),
                    })
                    .collect())
            }
            NodeKind::Wt { .. } => {
                let once = || {
                    let t = self.nodes.read();
                    self.merged_listing(&t, ino)
                };
                match once() {
                    // A rename of the directory or an ancestor in flight: listed again
                    // once it is done (the table's lock is not held while waiting).
                    Err(e) if is_changing(Some(e.errno())) && !held() => {
                        let _m = self.lock_changes(ino);
                        once()
                    }
                    other => other,
                }
            }
            _ => Err(FsError::not_dir()),
        }
    }

    /// Opens a directory listing. The flag says whether the kernel may keep the listing
    /// across opens: true inside worktrees, whose directories change only through requests
    /// the kernel makes (and then drops its copy), false at the top of the mount.
    pub fn opendir(&self, ino: Ino) -> FsResult<(Fh, bool)> {
        self.stats.opendirs.fetch_add(1, Ordering::Relaxed);
        let cacheable = matches!(self.nodes.read().kind(ino), Some(NodeKind::Wt { .. }));
        let entries = self.listing_with_dots(ino)?;
        Ok((self.add_handle(HandleKind::Dir(entries)), cacheable))
    }

    /// `.`, `..` and the directory's entries, in the order readdir offsets refer to.
    pub(super) fn listing_with_dots(&self, ino: Ino) -> FsResult<Vec<DirEntry>> {
        let mut entries = vec![
            DirEntry {
                ino,
                kind: FType::Dir,
                name: ".".into(),
            },
            DirEntry {
                ino: ROOT_INO,
                kind: FType::Dir,
                name: "..".into(),
            },
        ];
        entries.extend(self.listing(ino)?);
        Ok(entries)
    }

    /// Entries from `offset` on; each entry's offset for the next call is its index + 1.
    pub fn readdir(&self, fh: Fh, offset: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        self.stats.readdirs.fetch_add(1, Ordering::Relaxed);
        let h = self.handle(fh)?;
        match &*h {
            HandleKind::Dir(entries) => Ok(entries
                .iter()
                .enumerate()
                .skip(offset as usize)
                .map(|(i, e)| (i as u64 + 1, e.clone()))
                .collect()),
            _ => Err(FsError::new(ErrorKind::NotDir, "handle is not a directory")),
        }
    }

    /// Readdir without an open handle (the kernel skips opendir when the filesystem
    /// declines it, and caches listings itself). A pass starts at offset 0, which lists
    /// afresh; later offsets continue that listing.
    pub fn readdir_ino(&self, ino: Ino, offset: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        self.stats.readdirs.fetch_add(1, Ordering::Relaxed);
        let listing = {
            let cached = if offset > 0 {
                self.listings.continued(ino)
            } else {
                None
            };
            match cached {
                Some(l) => l,
                None => {
                    let l = Arc::new(self.listing_with_dots(ino)?);
                    self.listings.started(ino, l.clone());
                    l
                }
            }
        };
        if offset as usize >= listing.len() {
            self.listings.finished(ino);
        }
        Ok(listing
            .iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, e)| (i as u64 + 1, e.clone()))
            .collect())
    }
}
