//! Processes, as this machine's `/proc` and pidfds show them: who a process is and
//! whether it is still there, whether it is inside a directory, signals that never reach
//! a process that reused a pid, the tree below a command, a child's exit seen without
//! reaping it, and running a command below this process as system(3) does. A leaf: it names nothing of the crate.

pub mod info;
pub mod inside;
pub mod pidfd;
pub mod supervise;
pub mod tree;
pub mod unreaped;
