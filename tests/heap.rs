//! The allocator's counts (`worktreefs::heap`), in a test binary of their own: they are
//! the whole process's, so no other test may allocate beside this one.

use std::sync::Mutex;

use worktreefs::heap::{free, in_use, large_blocks_apart, trim};

/// The counts are the whole process's: one test at a time.
static ONE: Mutex<()> = Mutex::new(());

/// A burst of 64 MiB, with 16 MiB of leeway.
#[test]
fn a_burst_is_counted_in_and_out() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
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

fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A FUSE worker's zeroed 16 MiB request buffer, allocated after a bigger mapped block
/// was freed (which moves glibc's own bar above it): mapped apart, not written over
/// (resident) before a request uses it.
#[cfg(target_env = "gnu")]
#[test]
fn a_big_zeroed_buffer_is_mapped_apart_and_stays_unwritten() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    large_blocks_apart();
    std::thread::spawn(|| {
        drop(std::hint::black_box(vec![1u8; 24 << 20]));
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let mapped = || unsafe { libc::mallinfo2() }.hblkhd;
        let (before, was) = (resident(), mapped());
        let buf = std::hint::black_box(vec![0u8; (16 << 20) + 4096]);
        let grew = resident().saturating_sub(before);
        assert!(
            mapped() >= was + (16 << 20),
            "the buffer came from an arena ({was} -> {} bytes mapped)",
            mapped()
        );
        assert!(
            grew < 4 << 20,
            "a zeroed 16 MiB buffer made {grew} bytes resident"
        );
        drop(buf);
    })
    .join()
    .unwrap();
}
