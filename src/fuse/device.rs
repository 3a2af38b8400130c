//! The FUSE connection's descriptor and what is sent on it outside a request's answer:
//! what INIT agreed, backing files registered for passthrough, notifications.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use zerocopy::IntoBytes;

use super::abi;
use super::reply::Answer;

/// The FUSE connection: the descriptor the mount was made with, and what INIT agreed.
pub struct Device {
    fd: OwnedFd,
    /// The protocol's minor version agreed at INIT (0 before).
    minor: AtomicU32,
    /// Requests come over io_uring (agreed at INIT, and no entry refused since).
    uring: AtomicBool,
}

impl Device {
    pub fn new(fd: OwnedFd) -> Device {
        Device {
            fd,
            minor: AtomicU32::new(0),
            uring: AtomicBool::new(false),
        }
    }

    pub fn minor(&self) -> u32 {
        self.minor.load(Ordering::Relaxed)
    }

    /// The minor version INIT agreed.
    pub(super) fn set_minor(&self, minor: u32) {
        self.minor.store(minor, Ordering::Relaxed);
    }

    /// Whether requests come over io_uring.
    pub fn uring(&self) -> bool {
        self.uring.load(Ordering::Relaxed)
    }

    pub(super) fn set_uring(&self, on: bool) {
        self.uring.store(on, Ordering::Relaxed);
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Registers `file` as a backing file for passthrough; the kernel then does the I/O
    /// of an open that names the id itself. Closed when the id is dropped.
    pub fn open_backing(self: &Arc<Self>, file: &std::fs::File) -> std::io::Result<BackingId> {
        let map = abi::BackingMap {
            fd: file.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: the ioctl reads a fuse_backing_map from the pointer, which outlives it.
        let id = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                abi::ioc::BACKING_OPEN as _,
                &map as *const abi::BackingMap,
            )
        };
        if id < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(BackingId {
            id,
            device: self.clone(),
        })
    }

    /// Sends the header and arguments of one message (a reply or a notification).
    pub(super) fn send(
        &self,
        fd: BorrowedFd<'_>,
        unique: u64,
        answer: &Answer,
    ) -> std::io::Result<()> {
        send(fd, &answer.header(unique), answer)
    }
}

/// Writes one message in one `writev`, as the kernel requires.
pub(super) fn send(
    fd: BorrowedFd<'_>,
    header: &abi::OutHeader,
    answer: &Answer,
) -> std::io::Result<()> {
    let [a, b] = answer.parts();
    let iov = [
        libc::iovec {
            iov_base: header.as_bytes().as_ptr() as *mut _,
            iov_len: std::mem::size_of::<abi::OutHeader>(),
        },
        libc::iovec {
            iov_base: a.as_ptr() as *mut _,
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_ptr() as *mut _,
            iov_len: b.len(),
        },
    ];
    // SAFETY: writev of buffers that outlive the call.
    let n = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), 3) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A backing file registered with the kernel, closed when dropped.
pub struct BackingId {
    id: i32,
    device: Arc<Device>,
}

impl BackingId {
    pub fn id(&self) -> i32 {
        self.id
    }
}

impl Drop for BackingId {
    fn drop(&mut self) {
        let id = self.id as u32;
        // SAFETY: the ioctl reads a u32 from the pointer, which outlives it.
        let rc = unsafe {
            libc::ioctl(
                self.device.fd.as_raw_fd(),
                abi::ioc::BACKING_CLOSE as _,
                &id as *const u32,
            )
        };
        if rc < 0 {
            tracing::debug!(
                "closing backing file {id}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

impl std::fmt::Debug for BackingId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BackingId({})", self.id)
    }
}

/// Sends notifications (cache invalidations) to the kernel.
#[derive(Clone)]
pub struct Notifier {
    device: Arc<Device>,
}

impl Notifier {
    /// Notifications on `device`.
    pub(super) fn on(device: Arc<Device>) -> Notifier {
        Notifier { device }
    }

    /// Drops the kernel's cached attributes and data of `ino`.
    pub fn inval_inode(&self, ino: u64) -> std::io::Result<()> {
        let out = abi::NotifyInvalInodeOut {
            ino,
            off: 0,
            len: 0,
        };
        self.notify(abi::notify::INVAL_INODE, out.as_bytes(), &[])
    }

    /// Drops the kernel's cached entry `name` in `parent`.
    pub fn inval_entry(&self, parent: u64, name: &std::ffi::OsStr) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let out = abi::NotifyInvalEntryOut {
            parent,
            namelen: name.len() as u32,
            flags: 0,
        };
        let mut rest = name.as_bytes().to_vec();
        rest.push(0);
        self.notify(abi::notify::INVAL_ENTRY, out.as_bytes(), &rest)
    }

    fn notify(&self, code: i32, out: &[u8], rest: &[u8]) -> std::io::Result<()> {
        let mut data = out.to_vec();
        data.extend_from_slice(rest);
        let answer = Answer::Data(data);
        let header = abi::OutHeader {
            len: (std::mem::size_of::<abi::OutHeader>() + answer.len()) as u32,
            error: code,
            unique: 0,
        };
        send(self.device.fd(), &header, &answer)
    }
}
