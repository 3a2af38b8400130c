//! The connection to the kernel over `/dev/fuse`: the INIT handshake, worker threads
//! that each read requests from a descriptor of their own (cloned from the mount's) and
//! write the answers back, notifications, and passthrough's backing files.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use zerocopy::IntoBytes;

use super::abi::{self, init};
use super::reply::Answer;
use super::request::{self, Header, Op};
use super::uring::{self, Rings};
use super::{Filesystem, KernelInit, Uring};

/// The largest write (and read) the kernel is told to send over `/dev/fuse`.
pub const MAX_WRITE: u32 = 1 << 20;

/// A buffer for one request: the largest write and its headers (well within a page).
pub const BUFFER_SIZE: usize = MAX_WRITE as usize + 4096;

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
    fn send(&self, fd: BorrowedFd<'_>, unique: u64, answer: &Answer) -> std::io::Result<()> {
        send(fd, &answer.header(unique), answer)
    }
}

/// Writes one message in one `writev`, as the kernel requires.
fn send(fd: BorrowedFd<'_>, header: &abi::OutHeader, answer: &Answer) -> std::io::Result<()> {
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

/// A mounted connection, served by `run`.
pub struct Session<F: Filesystem> {
    fs: Arc<F>,
    device: Arc<Device>,
    threads: usize,
    uring: Uring,
}

/// How a read of `/dev/fuse` ended.
enum Read {
    /// A request of this many bytes.
    Request(usize),
    /// Nothing (interrupted, or the request was withdrawn): read again.
    Again,
    /// The connection is gone (unmounted).
    Gone,
}

fn read_request(fd: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<Read> {
    // SAFETY: read into a buffer of that length.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Ok(Read::Request(n as usize));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        // ENOENT: the request was interrupted before it was read.
        Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => Ok(Read::Again),
        Some(libc::ENODEV) => Ok(Read::Gone),
        _ => Err(e),
    }
}

impl<F: Filesystem> Session<F> {
    /// A session over the mount's descriptor `fd`, served by `threads` threads reading
    /// `/dev/fuse` and, as `uring` says, by io_uring's queues.
    pub fn new(fs: F, fd: OwnedFd, threads: usize, uring: Uring) -> Session<F> {
        Session {
            fs: Arc::new(fs),
            device: Arc::new(Device::new(fd)),
            threads: threads.max(1),
            uring,
        }
    }

    pub fn notifier(&self) -> Notifier {
        Notifier {
            device: self.device.clone(),
        }
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Answers INIT, then serves requests until the connection ends (unmounted).
    pub fn run(self) -> std::io::Result<()> {
        let mut buf = vec![0u8; BUFFER_SIZE];
        let rings = match self.handshake(&mut buf)? {
            Some(rings) => rings,
            None => {
                self.fs.destroy();
                return Ok(());
            }
        };
        drop(buf);
        // The queues register at once: once INIT is answered with io_uring, the kernel
        // holds every request until each queue has an entry.
        let failed = Arc::new(AtomicBool::new(false));
        let (queues, stop) = match rings {
            Some(r) => {
                let (threads, stop) = r.start(self.fs.clone(), self.device.clone(), failed)?;
                (threads, Some(stop))
            }
            None => (Vec::new(), None),
        };
        let mut workers = Vec::new();
        for i in 0..self.threads {
            let fs = self.fs.clone();
            let device = self.device.clone();
            // Each thread reads a descriptor of its own (one queue of requests in
            // progress each); the first uses the mount's.
            let own = if i == 0 { None } else { clone_device(&device) };
            workers.push(
                std::thread::Builder::new()
                    .name(format!("fuse-{i}"))
                    .spawn(move || serve_loop(&*fs, &device, own))?,
            );
        }
        let mut result = Ok(());
        for w in workers {
            match w.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(std::io::Error::other("a FUSE thread panicked")),
            }
        }
        // `/dev/fuse` is gone: so is the connection. The queues' threads have heard it
        // from the kernel (ENOTCONN); the stop wakes any that has not.
        if let Some(stop) = stop {
            stop.now();
        }
        for q in queues {
            if q.join().is_err() {
                result = Err(std::io::Error::other("a FUSE queue thread panicked"));
            }
        }
        self.fs.destroy();
        result
    }

    /// Whether to ask for io_uring, given what the kernel offers: the rings made ready
    /// when so (None: `/dev/fuse` alone); Err when `uring=on` cannot be had.
    fn rings(&self, offered: u64) -> std::io::Result<Option<Rings>> {
        let unavailable = |why: String| -> std::io::Result<Option<Rings>> {
            if self.uring == Uring::On {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!("FUSE over io_uring was asked for (--uring on) but {why}"),
                ));
            }
            tracing::info!("FUSE transport: /dev/fuse ({why})");
            Ok(None)
        };
        if self.uring == Uring::Off {
            tracing::info!("FUSE transport: /dev/fuse (--uring off)");
            return Ok(None);
        }
        if offered & init::OVER_IO_URING == 0 {
            return unavailable(uring::not_offered_reason());
        }
        let queues = match uring::possible_cpus() {
            Ok(n) => n,
            Err(e) => return unavailable(format!("the possible CPUs cannot be read: {e}")),
        };
        match Rings::prepare(
            queues,
            uring::payload_size(uring::MAX_WRITE, uring::page_size()),
        ) {
            Ok(r) => {
                tracing::info!(
                    "FUSE transport: io_uring ({queues} queues of {} entries, {} KiB reserved per CPU, touched as used)",
                    uring::PER_QUEUE,
                    uring::memory_per_cpu() >> 10
                );
                Ok(Some(r))
            }
            Err(e) => unavailable(format!("its rings could not be made: {e}")),
        }
    }

    /// Reads and answers INIT: None when the connection ended before it, else the rings
    /// of io_uring if it was agreed.
    fn handshake(&self, buf: &mut [u8]) -> std::io::Result<Option<Option<Rings>>> {
        loop {
            let n = match read_request(self.device.fd(), buf)? {
                Read::Request(n) => n,
                Read::Again => continue,
                Read::Gone => return Ok(None),
            };
            let (h, fixed, rest) = request::split(&buf[..n])
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
            let Ok(Op::Init(i)) = request::decode(&h, fixed, rest) else {
                self.device
                    .send(self.device.fd(), h.unique, &Answer::Error(libc::EIO))?;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("FUSE request {} before INIT", h.opcode),
                ));
            };
            if i.major > abi::KERNEL_VERSION {
                // A newer major version: say ours and wait for the kernel's next INIT.
                let out = abi::InitOut {
                    major: abi::KERNEL_VERSION,
                    minor: abi::KERNEL_MINOR_VERSION,
                    ..Default::default()
                };
                self.device
                    .send(self.device.fd(), h.unique, &Answer::Init(out, 8))?;
                continue;
            }
            if i.major < abi::KERNEL_VERSION || i.minor < abi::OLDEST_MINOR_VERSION {
                self.device
                    .send(self.device.fd(), h.unique, &Answer::Error(libc::EPROTO))?;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!(
                        "the kernel speaks FUSE {}.{}; worktreefs needs 7.{} or later (Linux 4.20)",
                        i.major,
                        i.minor,
                        abi::OLDEST_MINOR_VERSION
                    ),
                ));
            }
            let minor = i.minor.min(abi::KERNEL_MINOR_VERSION);
            let offered = if i.flags as u64 & init::INIT_EXT != 0 {
                i.flags as u64 | (i.flags2 as u64) << 32
            } else {
                i.flags as u64
            };
            let kernel = KernelInit {
                minor,
                flags: offered,
                max_readahead: i.max_readahead,
            };
            let choice = self.fs.init(&kernel);
            let rings = match self.rings(offered) {
                Ok(r) => r,
                Err(e) => {
                    self.device
                        .send(self.device.fd(), h.unique, &Answer::Error(libc::EPROTO))?;
                    return Err(e);
                }
            };
            let mut want = choice.flags | init::ASYNC_READ | init::BIG_WRITES | init::MAX_PAGES;
            // A ring entry's payload holds the largest write: smaller with io_uring, whose
            // buffers are per entry and per CPU.
            let max_write = if rings.is_some() {
                want |= init::OVER_IO_URING;
                uring::MAX_WRITE
            } else {
                MAX_WRITE
            };
            let mut flags = want & offered;
            if flags >> 32 != 0 {
                flags |= init::INIT_EXT;
            }
            let out = abi::InitOut {
                major: abi::KERNEL_VERSION,
                minor,
                max_readahead: i.max_readahead,
                flags: flags as u32,
                max_background: choice.max_background.max(1),
                congestion_threshold: (choice.max_background.max(1) as u32 * 3 / 4).max(1) as u16,
                max_write,
                time_gran: 1,
                max_pages: uring::max_pages(max_write, uring::page_size()),
                map_alignment: 0,
                flags2: (flags >> 32) as u32,
                max_stack_depth: if flags & init::PASSTHROUGH != 0 {
                    choice.max_stack_depth
                } else {
                    0
                },
                unused: [0; 6],
            };
            // Kernels before 7.23 read 24 bytes of it.
            let len = if minor < 23 {
                24
            } else {
                std::mem::size_of::<abi::InitOut>()
            };
            self.device.minor.store(minor, Ordering::Relaxed);
            self.device.set_uring(rings.is_some());
            self.fs.transport(rings.is_some());
            self.device
                .send(self.device.fd(), h.unique, &Answer::Init(out, len))?;
            tracing::debug!("FUSE INIT: protocol 7.{minor}, flags {flags:#x}");
            return Ok(Some(rings));
        }
    }
}

/// A descriptor of the connection of its own for a worker thread (FUSE_DEV_IOC_CLONE);
/// None (the thread then shares the mount's) where that is refused.
fn clone_device(device: &Device) -> Option<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .ok()?;
    let mut master = device.fd.as_raw_fd() as u32;
    // SAFETY: the ioctl reads a u32 (the descriptor to clone) from the pointer.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), abi::ioc::CLONE as _, &mut master as *mut u32) };
    if rc < 0 {
        tracing::debug!(
            "cloning the FUSE descriptor: {}; this thread shares the mount's",
            std::io::Error::last_os_error()
        );
        return None;
    }
    Some(OwnedFd::from(f))
}

/// One worker: reads requests from its descriptor (or the mount's) and answers each.
fn serve_loop<F: Filesystem>(
    fs: &F,
    device: &Arc<Device>,
    own: Option<OwnedFd>,
) -> std::io::Result<()> {
    let fd = own.as_ref().map_or(device.fd(), |f| f.as_fd());
    let mut buf = vec![0u8; BUFFER_SIZE];
    loop {
        let n = match read_request(fd, &mut buf) {
            Ok(Read::Request(n)) => n,
            Ok(Read::Again) => continue,
            Ok(Read::Gone) => return Ok(()),
            Err(e) => {
                tracing::error!("reading a FUSE request: {e}");
                return Err(e);
            }
        };
        let (h, fixed, rest) = match request::split(&buf[..n]) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("{e}");
                continue;
            }
        };
        let answer = answer(fs, device, &h, fixed, rest);
        if let Answer::Nothing = answer {
            continue;
        }
        if let Err(e) = device.send(fd, h.unique, &answer) {
            // ENOENT: the request is gone (its process was killed, or it was
            // interrupted): nobody waits for this answer.
            if e.raw_os_error() == Some(libc::ENOENT) {
                tracing::debug!("reply to request {} not sent: {e}", h.unique);
            } else {
                tracing::error!("reply to request {} not sent: {e}", h.unique);
            }
        }
    }
}

/// The answer to one request: decoded, then served by the filesystem (the parts of the
/// protocol that are the session's answered here).
pub fn answer<F: Filesystem>(
    fs: &F,
    device: &Arc<Device>,
    h: &abi::InHeader,
    fixed: &[u8],
    rest: &[u8],
) -> Answer {
    let op = match request::decode(h, fixed, rest) {
        Ok(op) => op,
        Err(e) => {
            tracing::error!("{e} (opcode {})", h.opcode);
            return Answer::Error(libc::EIO);
        }
    };
    match op {
        Op::Init(_) => {
            tracing::error!("a second FUSE INIT");
            Answer::Error(libc::EIO)
        }
        // Interrupts are not acted on: every request is answered soon. ENOSYS tells the
        // kernel not to send them again.
        Op::Interrupt { .. } => Answer::Error(libc::ENOSYS),
        // The session calls `destroy` once, when the connection ends.
        Op::Destroy => Answer::Empty,
        Op::Unsupported(_) => Answer::Error(libc::ENOSYS),
        op => {
            let forget = matches!(op, Op::Forget { .. } | Op::BatchForget(_));
            let a = fs.serve(&Header::of(h), op, device);
            if forget {
                Answer::Nothing
            } else {
                a
            }
        }
    }
}
