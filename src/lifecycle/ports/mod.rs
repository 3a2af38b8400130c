//! A block of ports for each worktree, so servers that agents start side by side never
//! collide: a range (default 20000–29999, below the kernel's ephemeral ports) cut into
//! blocks (default 10), one given to each worktree at its creation, kept while it lives
//! (the store holds it; a restart keeps it), free again when it is removed.
//!
//! Blocks are unique across the state directories that share a registry: each is
//! claimed by a file `<first>-<size>` there (`/run/worktreefs/ports` for root, only root
//! may write it; for another user `$XDG_RUNTIME_DIR/worktreefs/ports`, unique across that
//! user's state directories), written under the registry's lock (waited for at most
//! `LOCK_WAIT`) and never through a symlink. An allocation also keeps clear of the blocks
//! the machine's other registries claim, as far as it can read them (a user reads
//! root's; root reads every user's, at most `FOREIGN_PORTS` ports of each): across
//! users, blocks are unique but for two allocations at the same moment. The file names the
//! worktree and the state directory. A claim whose state directory is not there goes at the next allocation;
//! this state directory's claims follow its store: dropped when their worktree is no
//! longer live, made again where missing, and at each mount (`reclaim_all`, after a
//! reboot emptied `/run`) a worktree whose block another state directory claimed
//! meanwhile gets a new one, and one with none (made before blocks were given, or when
//! none was free) gets one. A block with a port someone listens on (TCP) or is bound to
//! (UDP), IPv4 or IPv6, as `/proc/net` lists them, is skipped.
//!
//! - `range.rs`: the range and its blocks, as `mount --ports` sets it.
//! - `allocate.rs`: a block given at a creation, claimed again at a mount, given back at
//!   a removal.
//! - `registry.rs`: this user's registry of claims, under its lock.
//! - `foreign.rs`: the machine's other registries, read to keep clear of their claims.
//! - `listening.rs`: the ports something listens on now.
//! - `environment.rs`: what runs inside a worktree is told of it and of its ports.

mod allocate;
mod environment;
mod foreign;
mod listening;
mod range;
mod registry;

pub use allocate::{assign, give, reclaim_all, release};
pub use environment::environment;
pub use range::{range_of, PortRange, META_RANGE};
