//! One file per command: its options (a clap `Args` struct, or a `Subcommand` enum for
//! a group) and its `run`.

pub mod checkpoint;
pub mod completions;
pub mod doctor;
pub mod du;
pub mod env;
pub mod events;
pub mod lease;
pub mod leases;
pub mod list;
pub mod man;
pub mod mount;
pub mod new;
pub mod reclaim;
pub mod removed;
pub mod repo;
pub mod restore;
pub mod retained;
pub mod run;
pub mod setup;
pub mod setup_runner;
pub mod shell_init;
pub mod status;
pub mod turn;
pub mod turns;
pub mod unmount;
pub mod warm;
