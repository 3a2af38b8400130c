//! The connection to the kernel over `/dev/fuse`: the INIT handshake, worker threads
//! that each read requests from a descriptor of their own (cloned from the mount's) and
//! write the answers back, notifications, and passthrough's backing files.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::abi::{self, init};
use super::device::{Device, Notifier};
use super::dispatch::answer;
use super::reply::Answer;
use super::request::{self, Op};
use super::uring::{self, Rings};
use super::yielding::{self, YieldCpu, Yielding};
use super::{Filesystem, KernelInit, Uring};

/// The largest write (and read) the kernel is told to send over `/dev/fuse`.
pub const MAX_WRITE: u32 = 1 << 20;

/// A buffer for one request: the largest write and its headers (well within a page).
pub const BUFFER_SIZE: usize = MAX_WRITE as usize + 4096;

/// A mounted connection, served by `run`.
pub struct Session<F: Filesystem> {
    fs: Arc<F>,
    device: Arc<Device>,
    threads: usize,
    uring: Uring,
    /// Whether queue threads yield their CPU to the callers they answer (io_uring only).
    yield_cpu: YieldCpu,
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
    /// `/dev/fuse` and, as `uring` says, by io_uring's queues, whose threads yield their
    /// CPU to the callers they answer as `yield_cpu` says.
    pub fn new(
        fs: F,
        fd: OwnedFd,
        threads: usize,
        uring: Uring,
        yield_cpu: YieldCpu,
    ) -> Session<F> {
        Session {
            fs: Arc::new(fs),
            device: Arc::new(Device::new(fd)),
            threads: threads.max(1),
            uring,
            yield_cpu,
        }
    }

    pub fn notifier(&self) -> Notifier {
        Notifier::on(self.device.clone())
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
                let yielding = self.yielding(r.entries());
                self.fs.yielding(yielding.is_some());
                let (threads, stop) =
                    r.start(self.fs.clone(), self.device.clone(), failed, yielding)?;
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

    /// Yielding for `entries` queue threads, if asked for and possible here (one log line
    /// saying which, and why not).
    fn yielding(&self, entries: usize) -> Option<Arc<Yielding>> {
        if self.yield_cpu == YieldCpu::Off {
            tracing::info!(
                "FUSE over io_uring: answers leave their callers to the scheduler (--yield-cpu off)"
            );
            return None;
        }
        match Yielding::start(entries, self.yield_cpu) {
            Ok(y) => {
                tracing::info!("FUSE over io_uring: each answer yields its CPU to the caller (SCHED_IDLE until the next request, {} ms at most)", yielding::LIMIT.as_millis());
                Some(Arc::new(y))
            }
            Err(why) => {
                tracing::info!(
                    "FUSE over io_uring: answers leave their callers to the scheduler: {why}"
                );
                None
            }
        }
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
            self.device.set_minor(minor);
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
    let mut master = device.fd().as_raw_fd() as u32;
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
