//! Extended attributes: the `user.` namespace on regular files and directories of a
//! worktree, kept on their upper-layer entries (a base entry is copied up to get one, and
//! has none before). Every other namespace is answered as for a file that has none of
//! it, and never set: the daemon runs as root, and a caller must not get `trusted.` or
//! `security.` attributes written with the daemon's rights. Whether the caller may write
//! the file was checked by the kernel (the mount has `default_permissions`).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;

use super::error::{ErrorKind, FsError, FsResult};
use super::nodes::NodeKind;
use super::types::FType;
use super::view::View;
use crate::ino::Ino;

/// What a GETXATTR or LISTXATTR is answered with: the size asked for (size 0), or the
/// bytes.
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// The one namespace served.
const USER: &[u8] = b"user.";

fn os_error(context: &str, errno: i32) -> FsError {
    FsError::io(context.to_string(), io::Error::from_raw_os_error(errno))
}

/// The answer for a file without the attribute.
fn no_data(name: &OsStr) -> FsError {
    FsError::new(
        ErrorKind::Os(libc::ENODATA),
        format!("no attribute {:?}", name),
    )
}

impl View {
    /// Whether `ino` is an entry of a worktree, and its type.
    fn xattr_target(&self, ino: Ino) -> FsResult<FType> {
        let t = self.nodes.read();
        match t.kind(ino) {
            Some(NodeKind::Wt { .. }) => {}
            _ => return Err(os_error("extended attributes here", libc::EOPNOTSUPP)),
        }
        let (_, ov, _) = t.wt_of(ino)?;
        Ok(ov.ftype)
    }

    /// The upper entry of `ino`, opened for its attributes (None: it has none in the
    /// upper layer, so no attributes).
    fn xattr_file(&self, ino: Ino, ftype: FType) -> FsResult<Option<std::fs::File>> {
        let in_upper = self.nodes.read().wt_of(ino)?.1.in_upper;
        if !in_upper {
            return Ok(None);
        }
        let flags = match ftype {
            FType::Dir => libc::O_RDONLY | libc::O_DIRECTORY,
            _ => libc::O_RDONLY | libc::O_NONBLOCK,
        };
        self.at_place(ino, "open for attributes", |p| p.open(flags))
            .map(Some)
    }

    pub fn getxattr(&self, ino: Ino, name: &OsStr, size: u32) -> FsResult<Xattr> {
        let ftype = self.xattr_target(ino)?;
        if !name.as_bytes().starts_with(USER) || !matches!(ftype, FType::File | FType::Dir) {
            return Err(no_data(name));
        }
        let Some(f) = self.xattr_file(ino, ftype)? else {
            return Err(no_data(name));
        };
        let c = CString::new(name.as_bytes()).map_err(|_| FsError::invalid("name with NUL"))?;
        let mut buf = vec![0u8; size.min(1 << 16) as usize];
        // SAFETY: fgetxattr into a buffer of that length (none for a size query).
        let n = unsafe {
            libc::fgetxattr(
                f.as_raw_fd(),
                c.as_ptr(),
                if size == 0 {
                    std::ptr::null_mut()
                } else {
                    buf.as_mut_ptr().cast()
                },
                buf.len(),
            )
        };
        if n < 0 {
            return Err(FsError::io("getxattr", io::Error::last_os_error()));
        }
        if size == 0 {
            return Ok(Xattr::Size(n as u32));
        }
        buf.truncate(n as usize);
        Ok(Xattr::Data(buf))
    }

    /// The `user.` names of `ino`, each NUL-terminated.
    pub fn listxattr(&self, ino: Ino, size: u32) -> FsResult<Xattr> {
        let ftype = self.xattr_target(ino)?;
        let mut names = Vec::new();
        if matches!(ftype, FType::File | FType::Dir) {
            if let Some(f) = self.xattr_file(ino, ftype)? {
                // SAFETY: a size query, then flistxattr into a buffer of that length.
                let want = unsafe { libc::flistxattr(f.as_raw_fd(), std::ptr::null_mut(), 0) };
                if want < 0 {
                    return Err(FsError::io("listxattr", io::Error::last_os_error()));
                }
                let mut all = vec![0u8; want as usize];
                let n =
                    unsafe { libc::flistxattr(f.as_raw_fd(), all.as_mut_ptr().cast(), all.len()) };
                if n < 0 {
                    return Err(FsError::io("listxattr", io::Error::last_os_error()));
                }
                all.truncate(n as usize);
                for name in all.split(|&b| b == 0).filter(|n| n.starts_with(USER)) {
                    names.extend_from_slice(name);
                    names.push(0);
                }
            }
        }
        if size == 0 {
            return Ok(Xattr::Size(names.len() as u32));
        }
        if names.len() > size as usize {
            return Err(os_error("listxattr", libc::ERANGE));
        }
        Ok(Xattr::Data(names))
    }

    pub fn setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], flags: u32) -> FsResult<()> {
        let ftype = self.xattr_target(ino)?;
        self.writable_namespace(name, ftype)?;
        let _m = self.lock_changes(ino);
        self.copy_up(ino, true)?;
        self.keep_node_attrs(ino)?;
        let f = self
            .xattr_file(ino, ftype)?
            .ok_or_else(|| FsError::internal("copied up, yet not in the upper layer"))?;
        let c = CString::new(name.as_bytes()).map_err(|_| FsError::invalid("name with NUL"))?;
        // SAFETY: fsetxattr of a value that outlives the call.
        let rc = unsafe {
            libc::fsetxattr(
                f.as_raw_fd(),
                c.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags as i32,
            )
        };
        if rc != 0 {
            return Err(FsError::io("setxattr", io::Error::last_os_error()));
        }
        drop(f);
        self.note_node(ino);
        Ok(())
    }

    pub fn removexattr(&self, ino: Ino, name: &OsStr) -> FsResult<()> {
        let ftype = self.xattr_target(ino)?;
        self.writable_namespace(name, ftype)?;
        let _m = self.lock_changes(ino);
        let Some(f) = self.xattr_file(ino, ftype)? else {
            return Err(no_data(name));
        };
        self.keep_node_attrs(ino)?;
        let c = CString::new(name.as_bytes()).map_err(|_| FsError::invalid("name with NUL"))?;
        // SAFETY: fremovexattr of a NUL-terminated name.
        if unsafe { libc::fremovexattr(f.as_raw_fd(), c.as_ptr()) } != 0 {
            return Err(FsError::io("removexattr", io::Error::last_os_error()));
        }
        drop(f);
        self.note_node(ino);
        Ok(())
    }

    /// Whether attribute `name` may be written on an entry of type `ftype`: `user.` on a
    /// regular file or a directory (EPERM on anything else, as ext4 answers); never
    /// another namespace (EPERM for `trusted.` and `security.`, which only root may
    /// write and the daemon would write as root; EOPNOTSUPP for the rest).
    fn writable_namespace(&self, name: &OsStr, ftype: FType) -> FsResult<()> {
        let n = name.as_bytes();
        if n.starts_with(USER) {
            if matches!(ftype, FType::File | FType::Dir) {
                return Ok(());
            }
            return Err(FsError::not_permitted(
                "user. attributes go on regular files and directories only",
            ));
        }
        if n.starts_with(b"trusted.") || n.starts_with(b"security.") {
            return Err(FsError::not_permitted(format!(
                "{:?}: a worktree keeps no trusted. or security. attributes (they would be written with the daemon's rights)",
                name
            )));
        }
        Err(os_error(
            &format!("{name:?}: only user. attributes are kept"),
            libc::EOPNOTSUPP,
        ))
    }
}
