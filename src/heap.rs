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
/// 32 MiB): a large block (each FUSE worker's request buffer, `fuse::session::BUFFER_SIZE`,
/// allocated at the mount, while the arenas are small) then comes from an arena, and a
/// zeroed one is written over in full where the arena's pages had been handed back, so
/// its zeros sit in the resident size, or not, depending on what ran before. Fixing the bar fixes glibc's
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

/// The arenas' (bytes in use, bytes free).
fn arenas() -> Option<(u64, u64)> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: as in `in_use`.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks as u64, m.fordblks as u64))
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// Whether to trim: more than `slack` is free, and the arenas changed since the last trim
/// (`last`, their counts just after it). A trim gives the pages back but the chunks stay
/// free, so the free count alone says nothing of what is resident: any allocation since
/// may have touched freed pages again (a `find` that allocates its listings where the
/// last one's were, then frees them, leaves the free count where it was). An idle
/// daemon's arenas do not change, so a fragmented heap is not walked again and again.
pub fn should_trim(last: (u64, u64), now: (u64, u64), slack: u64) -> bool {
    now.1 > slack && now != last
}

/// `trim` when [`should_trim`] says so (from a timer: the sweeper's, every 5 s).
pub fn trim_beyond(slack: u64) {
    static USED: AtomicU64 = AtomicU64::new(0);
    static FREE: AtomicU64 = AtomicU64::new(0);
    let Some(now) = arenas() else { return };
    let last = (USED.load(Ordering::Relaxed), FREE.load(Ordering::Relaxed));
    if should_trim(last, now, slack) {
        trim();
        let after = arenas().unwrap_or(now);
        USED.store(after.0, Ordering::Relaxed);
        FREE.store(after.1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::should_trim;

    #[test]
    fn a_trim_follows_any_change_of_the_arenas_with_enough_free() {
        let mb = 1 << 20;
        // Idle since the last trim: not again, however much is free.
        assert!(!should_trim((40 * mb, 30 * mb), (40 * mb, 30 * mb), 2 * mb));
        // Allocated and freed again (the free count where it was, pages touched): again.
        assert!(should_trim(
            (40 * mb, 30 * mb),
            (40 * mb + 4096, 30 * mb),
            2 * mb
        ));
        assert!(should_trim((40 * mb, 30 * mb), (41 * mb, 29 * mb), 2 * mb));
        // Too little free to be worth a walk.
        assert!(!should_trim((40 * mb, 0), (41 * mb, mb), 2 * mb));
    }
}
