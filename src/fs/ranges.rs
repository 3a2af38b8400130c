//! Operations on a range of an open file: `fallocate`, `lseek` to data or a hole, and
//! `copy_file_range`. A file open for writing is already in the upper layer (an open for
//! writing copies a base file up), so each is the upper filesystem's own call on it, and
//! its answer, errno included, is that filesystem's; a base file read from is its blob in
//! the cache, all data.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::error::{FsError, FsResult};
use super::handles::HandleKind;
use super::types::Fh;
use super::view::View;

impl View {
    /// `fallocate(2)` on handle `fh` (open for writing: the kernel sends it for no other).
    /// Every mode is the upper filesystem's to answer (ext4: allocate, keep the size, punch
    /// a hole, zero a range; EOPNOTSUPP for what it lacks).
    pub fn fallocate(&self, fh: Fh, offset: u64, length: u64, mode: u32) -> FsResult<()> {
        let h = self.handle(fh)?;
        let HandleKind::File {
            ino, file, on_base, ..
        } = &*h
        else {
            return Err(FsError::bad_handle(
                "fallocate of a handle that is not a file",
            ));
        };
        if on_base.load(Ordering::Acquire) {
            return Err(FsError::bad_handle(
                "fallocate of a file not open for writing",
            ));
        }
        let f = super::handles::opened(file)?;
        // SAFETY: fallocate on a descriptor the handle holds open.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                mode as i32,
                offset as libc::off_t,
                length as libc::off_t,
            )
        };
        if rc != 0 {
            return Err(FsError::io("fallocate", io::Error::last_os_error()));
        }
        drop(f);
        self.note_node(*ino);
        Ok(())
    }

    /// `lseek(2)` with SEEK_DATA or SEEK_HOLE (the kernel answers the other whences
    /// itself): where the next data or hole at or after `offset` is, ENXIO past the end.
    pub fn lseek(&self, fh: Fh, offset: u64, whence: u32) -> FsResult<u64> {
        let whence = whence as i32;
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(FsError::invalid(format!("lseek whence {whence}")));
        }
        let h = self.handle(fh)?;
        match &*h {
            HandleKind::File {
                ino,
                file,
                on_base,
                seen_copy_ups,
                blob,
                ..
            } => {
                if on_base.load(Ordering::Acquire) {
                    let epoch = self.handles.copy_up_epoch();
                    if seen_copy_ups.swap(epoch, Ordering::AcqRel) != epoch {
                        self.follow_copy_up(*ino, file, on_base)?;
                    }
                }
                let f = self.read_file(file, blob.as_ref())?;
                // SAFETY: lseek on a descriptor the handle holds open (its offset is not
                // used: reads and writes here are positional).
                let at = unsafe { libc::lseek(f.as_raw_fd(), offset as libc::off_t, whence) };
                if at < 0 {
                    return Err(FsError::io("lseek", io::Error::last_os_error()));
                }
                Ok(at as u64)
            }
            // Generated content (a `.control` file, a submodule's `.git`): all data.
            HandleKind::Memory(data) => memory_seek(data.len() as u64, offset, whence),
            HandleKind::GitFileWrite(wt) => {
                memory_seek(wt.ident.gitfile.len() as u64, offset, whence)
            }
            HandleKind::Dir(_) => Err(FsError::is_dir()),
        }
    }

    /// `copy_file_range(2)` from handle `fh_in` at `off_in` to handle `fh_out` (open for
    /// writing, so in the upper layer) at `off_out`: the upper filesystem copies (a
    /// reflink or a copy in the kernel); how many bytes it copied.
    pub fn copy_file_range(
        &self,
        fh_in: Fh,
        off_in: u64,
        fh_out: Fh,
        off_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let input = self.handle(fh_in)?;
        let output = self.handle(fh_out)?;
        let (
            HandleKind::File {
                ino: ino_in,
                file: file_in,
                on_base: base_in,
                seen_copy_ups,
                blob,
                ..
            },
            HandleKind::File {
                ino: ino_out,
                file: file_out,
                on_base: base_out,
                ..
            },
        ) = (&*input, &*output)
        else {
            // Generated content: the kernel copies it through read and write instead.
            return Err(FsError::io(
                "copy_file_range of generated content",
                io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            ));
        };
        if base_out.load(Ordering::Acquire) {
            return Err(FsError::bad_handle(
                "copy_file_range into a file not open for writing",
            ));
        }
        if base_in.load(Ordering::Acquire) {
            let epoch = self.handles.copy_up_epoch();
            if seen_copy_ups.swap(epoch, Ordering::AcqRel) != epoch {
                self.follow_copy_up(*ino_in, file_in, base_in)?;
            }
        }
        let src = self.read_file(file_in, blob.as_ref())?;
        let dst = super::handles::opened(file_out)?;
        let mut off_in = off_in as libc::loff_t;
        let mut off_out = off_out as libc::loff_t;
        let len = len.min(isize::MAX as u64) as usize;
        // SAFETY: copy_file_range between two descriptors the handles hold open, with
        // offsets of our own.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                len,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            // Across filesystems (the blob cache and the upper layer apart) the kernel
            // copies through read and write instead: EOPNOTSUPP says so.
            let e = match e.raw_os_error() {
                Some(libc::EXDEV | libc::ENOSYS) => io::Error::from_raw_os_error(libc::EOPNOTSUPP),
                _ => e,
            };
            return Err(FsError::io("copy_file_range", e));
        }
        drop((src, dst));
        self.note_node(*ino_out);
        Ok(n as u64)
    }
}

/// SEEK_DATA or SEEK_HOLE in content of `size` bytes, all data.
fn memory_seek(size: u64, offset: u64, whence: i32) -> FsResult<u64> {
    if offset >= size {
        return Err(FsError::io(
            "lseek past the end",
            io::Error::from_raw_os_error(libc::ENXIO),
        ));
    }
    Ok(if whence == libc::SEEK_DATA {
        offset
    } else {
        size
    })
}
