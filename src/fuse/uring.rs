//! FUSE over io_uring: requests reach the daemon in ring entries instead of reads of
//! `/dev/fuse`, on the CPU of the process that made them, and each answer goes back with
//! the command that fetches the next request (one system call per request, no wake-up of
//! a thread on another CPU).
//!
//! The kernel wants one queue per possible CPU, every queue with an entry registered,
//! before it sends any request there (until then requests wait). Each entry here is one
//! thread with a ring of its own, pinned to its queue's CPU where that CPU is online: a
//! slow request (a worktree's creation, a checkout filter) holds one entry, and the other
//! entries of its CPU go on. An entry is a header buffer (288 bytes used: the request's
//! header, its fixed structure, the entry's own fields) and a payload buffer (names,
//! write data; the reply's structures and data), both mapped without reserving memory:
//! pages are touched only as far as the largest request or reply that used them.
//!
//! INIT, FORGET, INTERRUPT and notifications stay on `/dev/fuse`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use zerocopy::{FromBytes, IntoBytes};

use super::abi;
use super::device::Device;
use super::dispatch;
use super::reply::Answer;
use super::request;
use super::yielding::{Turn, Yielding};
use super::Filesystem;

/// The largest write (and read) the kernel is told to send when io_uring carries the
/// requests: each entry's payload buffer is at least this large.
pub const MAX_WRITE: u32 = 256 << 10;

/// Entries (threads) per queue: how many requests of one CPU are served at once.
pub const PER_QUEUE: usize = 4;

/// The header buffer's layout (`struct fuse_uring_req_header`): the request's header (or
/// the reply's) at 0, the request's fixed structure at 128, the entry's fields at 256.
const HEADER_SIZE: usize = 4096;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const HEADER_USED: usize = 288;

/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// Why the kernel did not offer io_uring at INIT, with the way to turn it on.
pub fn not_offered_reason() -> String {
    match available_at(&switch()) {
        Ok(()) => "the kernel did not offer it at INIT".into(),
        Err(why) => why,
    }
}

/// Whether the kernel will offer io_uring at INIT (its fuse module has it and it is on)
/// and this process may make rings (`kernel.io_uring_disabled`, descriptors). Err: why
/// not, with the way out.
pub fn available() -> Result<(), String> {
    available_at(&switch())?;
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(4)
        .map(drop)
        .map_err(|e| {
            format!(
                "this process cannot make an io_uring ({e}; see the sysctl kernel.io_uring_disabled)"
            )
        })
}

/// The payload buffer an entry needs: the kernel wants room for the largest write and for
/// its largest read (`max_pages` pages), and 8 KiB at least.
pub fn payload_size(max_write: u32, page: usize) -> usize {
    let pages = max_pages(max_write, page) as usize;
    (max_write as usize)
        .max(pages * page)
        .max(abi::MIN_READ_BUFFER)
}

/// The pages the kernel is told a request may carry for `max_write` bytes.
pub fn max_pages(max_write: u32, page: usize) -> u16 {
    (max_write as usize)
        .div_ceil(page.max(1))
        .clamp(1, u16::MAX as usize) as u16
}

/// This machine's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// The fuse module's switch: [`ENABLE_URING`], or `$WORKTREEFS_URING_SWITCH` (for tests,
/// which must not change the machine's).
pub fn switch() -> std::path::PathBuf {
    std::env::var_os("WORKTREEFS_URING_SWITCH")
        .map(Into::into)
        .unwrap_or_else(|| ENABLE_URING.into())
}

/// [`available`], with the fuse module's switch at `switch`.
fn available_at(switch: &std::path::Path) -> Result<(), String> {
    let at = switch.display();
    match std::fs::read_to_string(switch) {
        Ok(v) if v.trim() == "Y" || v.trim() == "1" => Ok(()),
        Ok(v) => Err(format!(
            "the kernel's fuse module has it off ({at} is {}; turn it on with `echo 1 > {at}`, and for every boot with the line `options fuse enable_uring=1` in /etc/modprobe.d/fuse.conf)",
            v.trim()
        )),
        Err(_) => Err(
            "this kernel does not have it (Linux 6.14 or later, with CONFIG_FUSE_IO_URING)".into(),
        ),
    }
}

/// The fuse module's switch for io_uring (root may change it; the daemon never does).
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// What the memory of the transport comes to, reserved (pages are touched only as used).
pub fn memory_per_cpu() -> usize {
    PER_QUEUE * (HEADER_SIZE + payload_size(MAX_WRITE, page_size()))
}

/// `struct fuse_uring_ent_in_out`, at [`ENT_IN_OUT`] of the header buffer.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, zerocopy::Immutable)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// An anonymous private mapping, unmapped when dropped.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by one entry, used by its thread alone.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh anonymous mapping; no memory is reserved until touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, readable, and the kernel writes it only
        // while the entry is its (between a command's submission and its completion).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and writable.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One ring entry: its ring (declared first, so it is closed before the buffers go),
/// buffers and the iovecs that name them to the kernel.
struct Entry {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    header: Mapping,
    payload: Mapping,
    iov: Box<[libc::iovec; 2]>,
    qid: u16,
}

// SAFETY: the iovecs point into the entry's own mappings; the entry moves to its thread
// whole and is used there alone.
unsafe impl Send for Entry {}

/// The rings of a connection, made before INIT is answered (so that asking the kernel
/// for io_uring is never a promise the daemon cannot keep), started after.
pub struct Rings {
    entries: Vec<Entry>,
    /// Written to end every entry's thread (an eventfd each ring polls).
    stop: Arc<OwnedFd>,
}

/// The CPUs the kernel counts as possible: a queue each.
/// The kernel makes as many queues as it counts possible CPUs (`num_possible_cpus()`), a
/// count, not the highest CPU number plus one (they differ where the list has gaps).
pub fn possible_cpus() -> std::io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    cpu_list(&text)
        .map(|cpus| cpus.len())
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/sys/devices/system/cpu/possible reads {:?}", text.trim()),
            )
        })
}

/// A CPU list as sysfs writes it (`0-3,5`).
fn cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// The CPUs online now (each queue's thread is pinned to its CPU if it is one).
fn online_cpus() -> Vec<usize> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| cpu_list(&t))
        .unwrap_or_default()
}

impl Rings {
    /// Rings and buffers for `queues` queues of [`PER_QUEUE`] entries each, with payload
    /// buffers of `payload` bytes.
    pub fn prepare(queues: usize, payload: usize) -> std::io::Result<Rings> {
        // SAFETY: eventfd(2) with no shared state.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just made and owned by nobody else.
        let stop = Arc::new(unsafe { OwnedFd::from_raw_fd(stop) });
        let mut entries = Vec::with_capacity(queues * PER_QUEUE);
        for qid in 0..queues {
            for _ in 0..PER_QUEUE {
                // Two commands at most in flight: the entry's and the stop poll.
                let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(4)?;
                let mut header = Mapping::new(HEADER_SIZE)?;
                let mut payload = Mapping::new(payload)?;
                let iov = Box::new([
                    libc::iovec {
                        iov_base: header.bytes_mut().as_mut_ptr().cast(),
                        iov_len: HEADER_USED,
                    },
                    libc::iovec {
                        iov_base: payload.bytes_mut().as_mut_ptr().cast(),
                        iov_len: payload.len,
                    },
                ]);
                entries.push(Entry {
                    ring,
                    header,
                    payload,
                    iov,
                    qid: qid as u16,
                });
            }
        }
        Ok(Rings { entries, stop })
    }

    /// How many entries (threads) these rings have.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Starts a thread per entry, which registers it and serves what arrives there.
    /// `failed` is set when the kernel refused an entry (that entry's thread ends; the
    /// others go on). With `yielding`, each thread leaves the callers it answers on their
    /// CPU (see [`super::yielding`]).
    pub fn start<F: Filesystem>(
        self,
        fs: Arc<F>,
        device: Arc<Device>,
        failed: Arc<AtomicBool>,
        yielding: Option<Arc<Yielding>>,
    ) -> std::io::Result<(Vec<std::thread::JoinHandle<()>>, Stop)> {
        let online = online_cpus();
        let mut threads = Vec::with_capacity(self.entries.len());
        for (i, entry) in self.entries.into_iter().enumerate() {
            let fs = fs.clone();
            let device = device.clone();
            let stop = self.stop.clone();
            let failed = failed.clone();
            let yielding = yielding.clone();
            let pin = online.contains(&(entry.qid as usize));
            threads.push(
                std::thread::Builder::new()
                    .name(format!("fuse-q{}-{}", entry.qid, i % PER_QUEUE))
                    .spawn(move || {
                        if pin {
                            pin_to(entry.qid as usize);
                        }
                        let turn = yielding.as_ref().map(|y| y.turn(i));
                        if let Err(e) = serve_entry(&*fs, &device, entry, &stop, &failed, turn) {
                            tracing::error!("FUSE over io_uring: an entry's thread ended: {e}");
                        }
                    })?,
            );
        }
        Ok((threads, Stop(self.stop)))
    }
}

/// Ends every entry's thread of a connection.
pub struct Stop(Arc<OwnedFd>);

impl Stop {
    pub fn now(&self) {
        signal(&self.0);
    }
}

fn signal(stop: &OwnedFd) {
    let one = 1u64;
    // SAFETY: an 8-byte write to an eventfd.
    unsafe { libc::write(stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

thread_local! {
    /// The CPU a queue's thread is pinned to, and the CPUs it could run on before.
    static PINNED: std::cell::Cell<Option<(usize, libc::cpu_set_t)>> =
        const { std::cell::Cell::new(None) };
}

/// Sets the calling thread's CPUs to `set`.
fn set_affinity(set: &libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: a valid cpu_set_t of the size given, for the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn pin_to(cpu: usize) {
    // A cpu_set_t holds CPUs below CPU_SETSIZE (1024) only: others are not pinned.
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return;
    }
    // SAFETY: zeroed cpu_set_t are empty sets, filled by the kernel or by CPU_SET within
    // their size (checked above).
    let (before, one) = unsafe {
        let mut before: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut before) != 0 {
            // Not pinned: `unpinned` could not give its CPUs back.
            return;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        (before, one)
    };
    match set_affinity(&one) {
        Ok(()) => PINNED.set(Some((cpu, before))),
        Err(e) => tracing::debug!("pinning a FUSE queue thread to CPU {cpu}: {e}"),
    }
}

/// Runs `f` with the calling thread allowed on the CPUs it had before a queue pinned it
/// (a thread that is no queue's runs `f` as it is), then pins it again, and at the
/// thread's own scheduling policy (see [`super::yielding::at_own_policy`]): a process or
/// a thread that `f` starts inherits those CPUs and that policy, not the queue's. Used
/// around what starts processes or threads while answering a request (a checkout
/// filter, a worktree's creation).
pub fn unpinned<T>(f: impl FnOnce() -> T) -> T {
    let Some((cpu, before)) = PINNED.get() else {
        return super::yielding::at_own_policy(f);
    };
    /// Pins the thread again when `f` ends, by a panic too.
    struct Again(usize);
    impl Drop for Again {
        fn drop(&mut self) {
            pin_to(self.0);
        }
    }
    if let Err(e) = set_affinity(&before) {
        tracing::debug!("a FUSE queue thread back on its CPUs: {e}");
        return super::yielding::at_own_policy(f);
    }
    let _again = Again(cpu);
    super::yielding::at_own_policy(f)
}

/// user_data of the entry's command, and of the stop poll.
const ENTRY: u64 = 1;
const STOP: u64 = 2;

/// The command that registers `e` (`commit_id` None) or commits its answer and fetches
/// the next request.
fn command(e: &Entry, device: &Device, commit_id: Option<u64>) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.unwrap_or(0).to_ne_bytes());
    cmd[16..18].copy_from_slice(&e.qid.to_ne_bytes());
    let op = match commit_id {
        None => CMD_REGISTER,
        Some(_) => CMD_COMMIT_AND_FETCH,
    };
    let sqe = opcode::UringCmd80::new(types::Fd(device.fd().as_raw_fd()), op)
        .cmd(cmd)
        .addr(Some(e.iov.as_ptr() as u64))
        .build()
        .user_data(ENTRY);
    if commit_id.is_some() {
        return sqe;
    }
    // REGISTER names its two buffers: `len` (byte 24 of the entry) must say 2, and the
    // builder has no setter for it.
    // SAFETY: Entry128 is a repr(C) 128-byte submission entry (the crate tests its size);
    // byte 24 is the kernel's `len`, a u32.
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(sqe);
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
    }
}

fn push(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>, sqe: &squeue::Entry128) {
    // SAFETY: what the entry names (its iovecs and buffers) lives as long as the ring.
    unsafe {
        ring.submission()
            .push(sqe)
            .expect("a ring of four has room for its two commands");
    }
}

/// Registers entry `e`, then serves each request the kernel puts there until the
/// connection ends or `stop` is written.
fn serve_entry<F: Filesystem>(
    fs: &F,
    device: &Arc<Device>,
    mut e: Entry,
    stop: &OwnedFd,
    failed: &AtomicBool,
    mut turn: Option<Turn>,
) -> std::io::Result<()> {
    let poll = opcode::PollAdd::new(types::Fd(stop.as_raw_fd()), libc::POLLIN as u32)
        .build()
        .user_data(STOP);
    push(&mut e.ring, &poll.into());
    let mut last = command(&e, device, None);
    push(&mut e.ring, &last);
    let mut registered = false;
    loop {
        match e.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::EINTR) => continue,
            Err(err) => return Err(err),
        }
        // At most two commands are in flight: the entry's and the stop poll.
        let (mut entry, mut stopped) = (None, false);
        for c in e.ring.completion() {
            if c.user_data() == STOP {
                stopped = true;
            } else {
                entry = Some(c.result());
            }
        }
        // The entry's completion before a stop that came with it: a request just given
        // to the entry is answered before the thread ends.
        if let Some(res) = entry {
            match res {
                0 => {
                    registered = true;
                    if let Some(t) = turn.as_mut() {
                        t.serve();
                    }
                    let commit_id = serve_one(fs, device, &mut e);
                    last = command(&e, device, Some(commit_id));
                    push(&mut e.ring, &last);
                    if let Some(t) = turn.as_mut() {
                        t.answer();
                    }
                }
                // INIT's answer is not processed yet, or a signal: the same again.
                r if r == -libc::EAGAIN || r == -libc::EINTR => push(&mut e.ring, &last),
                // The connection ended (unmounted, aborted), or the ring is closing.
                r if r == -libc::ENOTCONN
                    || r == -libc::ECANCELED
                    || r == -libc::ENODEV
                    || r == -libc::ECONNABORTED =>
                {
                    return Ok(())
                }
                r => {
                    let err = std::io::Error::from_raw_os_error(-r);
                    if !registered {
                        // Only this entry ends. The kernel never takes back a ring that
                        // became ready (every queue with an entry): the other entries,
                        // registered or about to be, serve it then; and if it never
                        // becomes ready, the refusal sent the connection back to
                        // /dev/fuse, where the session's readers serve it. Ending them
                        // all would leave a ready ring nobody serves.
                        failed.store(true, Ordering::Relaxed);
                        tracing::error!("FUSE over io_uring: the kernel refused an entry of queue {} ({err}); its requests go to the queue's other entries, or through /dev/fuse", e.qid);
                        return Ok(());
                    }
                    return Err(err);
                }
            }
        }
        if stopped {
            return Ok(());
        }
    }
}

/// Decodes the request in `e`'s buffers, serves it and writes the answer there; returns
/// the commit id that sends it.
fn serve_one<F: Filesystem>(fs: &F, device: &Arc<Device>, e: &mut Entry) -> u64 {
    let header = e.header.bytes();
    let ent = EntInOut::read_from_bytes(&header[ENT_IN_OUT..HEADER_USED]).expect("32 bytes");
    let h = abi::InHeader::read_from_prefix(header).expect("40 bytes").0;
    let payload = &e.payload.bytes()[..(ent.payload_sz as usize).min(e.payload.len)];
    // Extensions (never asked for) would end the payload.
    let ext = (h.total_extlen as usize * 8).min(payload.len());
    let rest = &payload[..payload.len() - ext];
    let fixed = &header[OP_IN..OP_IN + request::fixed_size(h.opcode).min(128)];
    // A handler that panics answers EIO: the entry goes on (over /dev/fuse a panic ended
    // one of the shared reader threads; here it would take one of this CPU's entries).
    let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // A request is never served at the idle policy a yielding thread waits at (what
        // it starts would inherit it; a test build answers EIO if it is).
        debug_assert!(
            !super::yielding::idle_now(),
            "request {} (opcode {}) served at SCHED_IDLE",
            h.unique,
            h.opcode
        );
        dispatch::answer(fs, device, &h, fixed, rest)
    }))
    .unwrap_or_else(|_| {
        tracing::error!(
            "FUSE request {} (opcode {}) panicked; answered EIO",
            h.unique,
            h.opcode
        );
        Answer::Error(libc::EIO)
    });
    // Every request that arrives here is answered here, even one /dev/fuse would not
    // answer (nothing, then: error 0 and no payload).
    let answer = match answer {
        Answer::Nothing => Answer::Empty,
        a if a.len() > e.payload.len => {
            tracing::error!(
                "FUSE over io_uring: the answer to request {} is {} bytes, past the entry's {}",
                h.unique,
                a.len(),
                e.payload.len
            );
            Answer::Error(libc::EIO)
        }
        a => a,
    };
    let out = answer.header(h.unique);
    let [a, b] = answer.parts();
    let payload = e.payload.bytes_mut();
    payload[..a.len()].copy_from_slice(a);
    payload[a.len()..a.len() + b.len()].copy_from_slice(b);
    let header = e.header.bytes_mut();
    header[..std::mem::size_of::<abi::OutHeader>()].copy_from_slice(out.as_bytes());
    let ent_out = EntInOut {
        commit_id: ent.commit_id,
        payload_sz: answer.len() as u32,
        ..Default::default()
    };
    header[ENT_IN_OUT..HEADER_USED].copy_from_slice(ent_out.as_bytes());
    ent.commit_id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_io_uring_is_missing_says_how_to_turn_it_on() {
        let dir = tempfile::tempdir().unwrap();
        let switch = dir.path().join("enable_uring");
        std::fs::write(&switch, "N\n").unwrap();
        let why = available_at(&switch).unwrap_err();
        assert!(
            why.contains(&format!("`echo 1 > {}`", switch.display())),
            "{why}"
        );
        assert!(why.contains("options fuse enable_uring=1"), "{why}");
        std::fs::write(&switch, "Y\n").unwrap();
        assert_eq!(available_at(&switch), Ok(()));
        let why = available_at(&dir.path().join("missing")).unwrap_err();
        assert!(why.contains("does not have it"), "{why}");
    }

    /// With 64 KiB pages the kernel asks a payload of max_pages pages: the buffer is made
    /// that large, and max_pages is counted in this machine's pages.
    #[test]
    fn the_payload_holds_the_largest_read_whatever_the_page_size() {
        assert_eq!(max_pages(MAX_WRITE, 4096), 64);
        assert_eq!(payload_size(MAX_WRITE, 4096), 256 << 10);
        assert_eq!(max_pages(MAX_WRITE, 65536), 4);
        assert_eq!(payload_size(MAX_WRITE, 65536), 256 << 10);
        assert_eq!(max_pages(100, 65536), 1);
        assert_eq!(payload_size(100, 65536), 65536);
    }

    #[test]
    fn cpu_lists_read_as_sysfs_writes_them() {
        assert_eq!(cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(cpu_list("0-2,5,7-8"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(cpu_list("3"), Some(vec![3]));
        assert_eq!(cpu_list("x"), None);
        // Queues are counted, not numbered past the highest CPU.
        assert_eq!(cpu_list("0-1,4").map(|c| c.len()), Some(3));
    }

    #[test]
    fn the_entry_fields_sit_where_the_kernel_reads_them() {
        assert_eq!(std::mem::size_of::<EntInOut>(), 32);
        assert_eq!(ENT_IN_OUT + std::mem::size_of::<EntInOut>(), HEADER_USED);
        assert!(request::fixed_size(abi::opcode::SETATTR) <= ENT_IN_OUT - OP_IN);
    }

    #[test]
    fn a_register_command_names_two_buffers() {
        let e = Entry {
            ring: IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                .build(4)
                .unwrap(),
            header: Mapping::new(HEADER_SIZE).unwrap(),
            payload: Mapping::new(8192).unwrap(),
            iov: Box::new([
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                },
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                },
            ]),
            qid: 3,
        };
        let devnull = std::fs::File::open("/dev/null").unwrap();
        let device = Device::new(devnull.into());
        // SAFETY: reading the 128 bytes of a submission entry.
        let raw: [u8; 128] = unsafe { std::mem::transmute(command(&e, &device, None)) };
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            CMD_REGISTER
        );
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        assert_eq!(
            u16::from_ne_bytes(raw[64..66].try_into().unwrap()),
            3,
            "qid"
        );
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            e.iov.as_ptr() as u64
        );
        let raw: [u8; 128] = unsafe { std::mem::transmute(command(&e, &device, Some(77))) };
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            CMD_COMMIT_AND_FETCH
        );
        assert_eq!(u64::from_ne_bytes(raw[56..64].try_into().unwrap()), 77);
    }
}
