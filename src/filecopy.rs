//! Copying a file's data the cheapest way the filesystem offers: a reflink, else its data
//! ranges by `copy_file_range` (holes stay holes), else reads and writes. A leaf: it
//! names nothing of the crate but `beneath`'s fstat.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

use crate::beneath;

/// Copies all of `from` into the empty `to`: a reflink (`FICLONE`) where the filesystem
/// shares extents, else its data ranges (holes stay holes: a sparse terabyte a user made
/// costs the copy nothing) by `copy_file_range` (which the kernel may do as a reflink
/// too), else by reads and writes. How many bytes of data.
pub fn clone_or_copy(from: &fs::File, to: &fs::File) -> io::Result<u64> {
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: two valid descriptors.
    if unsafe { libc::ioctl(to.as_raw_fd(), FICLONE as _, from.as_raw_fd()) } == 0 {
        // Shared extents: count what the file holds, not its holes.
        let st = beneath::fstat(from.as_fd())?;
        return Ok((st.st_blocks as u64 * 512).min(st.st_size as u64));
    }
    let size = beneath::fstat(from.as_fd())?.st_size;
    let seek = |off: i64, whence: i32| {
        // SAFETY: a valid descriptor.
        let r = unsafe { libc::lseek(from.as_raw_fd(), off, whence) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    let mut copied = 0;
    let mut at = 0i64;
    while at < size {
        let start = match seek(at, libc::SEEK_DATA) {
            Ok(s) => s,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break, // a hole to the end
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => at,   // no hole support
            Err(e) => return Err(e),
        };
        let end = seek(start, libc::SEEK_HOLE).unwrap_or(size).min(size);
        if end <= start {
            break;
        }
        copy_range(from, to, start as u64, end as u64)?;
        copied += (end - start) as u64;
        at = end;
    }
    to.set_len(size as u64)?;
    Ok(copied)
}

/// Copies bytes `start..end` of `from` to the same place in `to`.
/// Whether `copy_file_range` failing with `errno` means the kernel will not copy these
/// files for us (not here, not between these filesystems, or a seccomp profile that
/// answers EPERM for the call), so plain reads and writes do it: as std's `io::copy`
/// decides. A full disk or a failed read is an error either way.
fn reads_and_writes_instead(errno: Option<i32>) -> bool {
    matches!(
        errno,
        Some(libc::EXDEV | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP | libc::EPERM)
    )
}

fn copy_range(from: &fs::File, to: &fs::File, start: u64, end: u64) -> io::Result<()> {
    let mut done = start;
    while done < end {
        let mut off_in = done as libc::loff_t;
        let mut off_out = done as libc::loff_t;
        // SAFETY: valid descriptors and offsets.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut off_in,
                to.as_raw_fd(),
                &mut off_out,
                (end - done) as usize,
                0,
            )
        };
        if n == 0 {
            return Ok(()); // the file shrank: the status check after the copy sees it
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if reads_and_writes_instead(e.raw_os_error()) {
                break;
            }
            return Err(e);
        }
        done += n as u64;
    }
    // Plain reads and writes, from where the kernel's copy stopped.
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; (1 << 20).min((end - done) as usize)];
    while done < end {
        let want = buf.len().min((end - done) as usize);
        let n = from.read_at(&mut buf[..want], done)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all_at(&buf[..n], done)?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;

    /// The kernel's refusals of the call, a seccomp profile's EPERM among them, fall back
    /// to reads and writes; a full disk, an I/O error or a bad descriptor do not.
    #[test]
    fn a_refused_copy_falls_back_and_a_failed_one_does_not() {
        for errno in [
            libc::EXDEV,
            libc::ENOSYS,
            libc::EINVAL,
            libc::EOPNOTSUPP,
            libc::EPERM,
        ] {
            assert!(reads_and_writes_instead(Some(errno)), "{errno}");
        }
        for errno in [libc::ENOSPC, libc::EIO, libc::EBADF, libc::EDQUOT] {
            assert!(!reads_and_writes_instead(Some(errno)), "{errno}");
        }
        assert!(!reads_and_writes_instead(None));
    }

    /// A new file opened for writing only (as a copy-up makes it), in `dir`.
    fn target(dir: &std::path::Path, name: &str) -> fs::File {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(name))
            .unwrap()
    }

    /// A file with a hole, and an in-memory one (as the blob cache serves a blob when its
    /// disk is full) whose offset is at its end, are each copied whole, to their size.
    #[test]
    fn a_copy_is_whole_from_a_sparse_file_and_from_memory() {
        let d = tempfile::tempdir().unwrap();
        let sparse = d.path().join("sparse");
        let f = fs::File::create(&sparse).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", 8 << 20).unwrap();
        f.set_len((8 << 20) + 100).unwrap();
        let want = fs::read(&sparse).unwrap();
        let data =
            clone_or_copy(&fs::File::open(&sparse).unwrap(), &target(d.path(), "a")).unwrap();
        assert_eq!(fs::read(d.path().join("a")).unwrap(), want);
        assert!(data <= want.len() as u64, "{data}");

        // SAFETY: a NUL-terminated name; the descriptor returned is ours.
        let fd = unsafe { libc::memfd_create(c"filecopy-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd was just created and is owned by nothing else.
        let mem = unsafe { fs::File::from_raw_fd(fd) };
        io::Write::write_all(&mut &mem, b"in memory").unwrap();
        clone_or_copy(&mem, &target(d.path(), "b")).unwrap();
        assert_eq!(fs::read(d.path().join("b")).unwrap(), b"in memory");
    }
}
