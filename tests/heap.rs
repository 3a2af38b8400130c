//! The allocator's counts (`worktreefs::heap`), in a test binary of their own: they are
//! the whole process's, so no other test may allocate beside this one.

use worktreefs::heap::{free, in_use, trim};

/// A burst of 64 MiB, with 16 MiB of leeway.
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
