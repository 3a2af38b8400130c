//! The FUSE protocol, ours: the kernel's structures (`abi`), a request decoded into one
//! form (`request`), an answer in one form (`reply`), and the connection that carries
//! them (`session`: INIT, the worker threads on `/dev/fuse`, notifications and
//! passthrough's backing files). A filesystem implements [`Filesystem`]: one call per
//! request, whatever transport brought it.
//!
//! Only `fs/` (the adapter and the mount) uses this module; it uses nothing of the crate.

pub mod abi;
pub mod device;
pub mod dispatch;
pub mod reply;
pub mod request;
pub mod session;
pub mod uring;
pub mod yielding;

pub use device::{BackingId, Device, Notifier};
pub use reply::{Answer, DirBuf};
pub use request::{Header, Op, SetTime, SetattrArgs};
pub use session::Session;
pub use yielding::YieldCpu;

/// Whether requests come over io_uring (where the kernel offers it) or `/dev/fuse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Uring {
    /// io_uring where the kernel offers it, else `/dev/fuse`.
    #[default]
    Auto,
    /// `/dev/fuse` always.
    Off,
    /// io_uring, or the mount fails saying why it cannot be had.
    On,
}

impl std::str::FromStr for Uring {
    type Err = String;
    fn from_str(s: &str) -> Result<Uring, String> {
        match s {
            "auto" => Ok(Uring::Auto),
            "off" => Ok(Uring::Off),
            "on" => Ok(Uring::On),
            _ => Err(format!("'{s}' is not one of auto, off, on")),
        }
    }
}

impl std::fmt::Display for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Uring::Auto => "auto",
            Uring::Off => "off",
            Uring::On => "on",
        })
    }
}

/// What the kernel offers at INIT.
#[derive(Debug, Clone, Copy)]
pub struct KernelInit {
    /// The protocol's minor version both sides speak (the smaller of the two).
    pub minor: u32,
    /// The capabilities the kernel offers (`flags` | `flags2` << 32).
    pub flags: u64,
    pub max_readahead: u32,
}

/// What the filesystem asks for at INIT.
#[derive(Debug, Clone, Copy, Default)]
pub struct InitChoice {
    /// Capabilities wanted; only those the kernel offers are asked for.
    pub flags: u64,
    pub max_background: u16,
    /// Stacking depth of passthrough's backing files (with `PASSTHROUGH`).
    pub max_stack_depth: u32,
}

/// A filesystem served over FUSE. Each request is one call of [`Filesystem::serve`],
/// from any of the session's threads; its answer is sent when it returns.
pub trait Filesystem: Send + Sync + 'static {
    /// INIT: what to ask of the kernel.
    fn init(&self, kernel: &KernelInit) -> InitChoice;

    /// One request. `device` registers passthrough's backing files.
    fn serve(&self, h: &Header, op: Op<'_>, device: &std::sync::Arc<Device>) -> Answer;

    /// The connection ended (DESTROY, or the device closed).
    fn destroy(&self) {}

    /// Which transport carries the requests: io_uring (`true`) or `/dev/fuse`; told at
    /// INIT, and again if the kernel refuses io_uring's entries afterwards.
    fn transport(&self, _uring: bool) {}

    /// Whether io_uring's queue threads yield their CPU to the callers they answer
    /// (`yielding.rs`); told once the queues start.
    fn yielding(&self, _on: bool) {}
}
