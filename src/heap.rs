//! The allocator's own counts, and handing its free pages back (glibc; elsewhere neither
//! is known and nothing is done).
//!
//! The daemon's resident size keeps the pages of everything it freed until the allocator
//! gives them back: a burst of short-lived data (a snapshot's manifest being read, the
//! listings of a `find`) would otherwise show as memory the daemon holds.

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

/// `trim` when more than `slack` bytes are held free.
pub fn trim_beyond(slack: u64) {
    if free().is_some_and(|f| f > slack) {
        trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts are the whole process's (other tests allocate at the same time): a
    /// burst of 64 MiB, with 16 MiB of leeway.
    #[test]
    fn a_burst_is_counted_in_and_out() {
        let Some(before) = in_use() else { return };
        let burst: Vec<Vec<u8>> = (0..1024).map(|i| vec![i as u8; 64 << 10]).collect();
        let during = in_use().unwrap();
        assert!(during >= before + (48 << 20), "{before} -> {during}");
        drop(burst);
        assert!(free().is_some());
        trim();
        let after = in_use().unwrap();
        assert!(after + (48 << 20) <= during, "{during} -> {after}");
    }
}
