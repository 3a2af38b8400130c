//! The allocator's own counts, and handing its free pages back (glibc 2.33 or later, for
//! `mallinfo2`; with another C library neither is known and nothing is done).
//!
//! The daemon's resident size keeps the pages of everything it freed until the allocator
//! gives them back: a burst of short-lived data (a snapshot's manifest being read, the
//! listings of a `find`) would otherwise show as memory the daemon holds.

use std::sync::atomic::{AtomicU64, Ordering};

/// Blocks of `LARGE` bytes or more that no free chunk of an arena can hold get mappings
/// of their own, always, and an arena keeps up to `KEEP_TOP` free at its top; set once at
/// startup, before other threads exist.
///
/// glibc otherwise raises the first bar to the size of every mapped block freed (up to
/// 32 MiB): a 16 MiB block (each FUSE worker's request buffer, allocated at the mount,
/// while the arenas are small) then comes from an arena, and a zeroed one is written over
/// in full where the arena's pages had been handed back, so 16 MiB of zeros sit in the
/// resident size, or not, depending on what ran before. Fixing the bar fixes glibc's
/// trim threshold too (at 128 KiB, where it would have moved up): a read's 1 MiB buffer
/// freed at an arena's top would be handed back at every read, hence `KEEP_TOP`.
pub fn large_blocks_apart() {
    #[cfg(target_env = "gnu")]
    // SAFETY: plain settings of the allocator; fixed values also turn its moving off.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_TOP as libc::c_int);
    }
}

/// The size from which `large_blocks_apart` maps blocks apart: above the largest buffer a
/// request reads into (1 MiB where the kernel's `max_pages_limit` is its default 256;
/// one raised past 1024 would map and unmap each read's buffer), below the workers'
/// request buffers.
pub const LARGE: usize = 4 << 20;

/// The free bytes an arena keeps at its top before a free hands them back (the sweeper's
/// `trim_beyond` bounds the rest).
pub const KEEP_TOP: usize = 2 << 20;

/// Bytes handed out and not yet freed: what the daemon's data takes.
pub fn in_use() -> Option<u64> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd) as u64)
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// Bytes the allocator holds free (its arenas' free chunks).
pub fn free() -> Option<u64> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: as in `in_use`.
        let m = unsafe { libc::mallinfo2() };
        Some(m.fordblks as u64)
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// Gives the allocator's free pages back to the system. It holds each arena's lock while
/// it walks it (milliseconds for a heap of a hundred megabytes): call it after a burst,
/// or from a timer, never per request.
pub fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory; no pointer handed out is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// `trim` when the bytes held free grew by more than `slack` since the last time (a
/// trim gives the pages back but the chunks stay free: without the mark, a fragmented
/// heap would be walked again at every call).
pub fn trim_beyond(slack: u64) {
    static MARK: AtomicU64 = AtomicU64::new(0);
    let Some(f) = free() else { return };
    if f > MARK.load(Ordering::Relaxed).saturating_add(slack) {
        trim();
        MARK.store(free().unwrap_or(0), Ordering::Relaxed);
    } else if f < MARK.load(Ordering::Relaxed) {
        MARK.store(f, Ordering::Relaxed);
    }
}
