//! The harness's helpers (`tests/mounted/common.rs`) for the test binaries outside it
//! (`tests/view.rs`), each of which uses only some of them.

#[allow(dead_code)]
#[path = "../mounted/common.rs"]
mod helpers;

pub use helpers::*;
