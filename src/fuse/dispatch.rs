//! One dispatch for both transports: a request decoded once into an `Op` and served by
//! the filesystem (the parts of the protocol that are the session's answered here).

use std::sync::Arc;

use super::abi;
use super::device::Device;
use super::reply::Answer;
use super::request::{self, Header, Op};
use super::Filesystem;

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
