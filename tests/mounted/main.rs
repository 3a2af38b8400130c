//! The tests that mount worktreefs or run its daemon and CLI against a real repository, in
//! one test binary: the helpers (`common`) are compiled once, the binary linked once, and
//! the compiler sees every use of each helper. A module per area; `cargo test --test
//! mounted -- trust::` runs one area. The tests of a binary share its process and run in
//! parallel, so none changes the process's own state (environment, working directory,
//! umask, signal handlers, limits); a daemon or child that needs another environment gets
//! it passed on its command (`Mounted::start_with_envs`).

mod common;

mod basics;
mod checkout;
mod checkpoints;
mod cleanup;
mod cli;
mod doctor;
mod faults;
mod fork;
mod glance;
mod inspect;
mod leases;
mod mcp;
mod nonroot;
mod passthrough;
mod ports;
mod privacy;
mod ranges;
mod restore;
mod setup;
mod submodules;
mod systemd;
mod transport;
mod trust;
mod turns;
mod warm;
mod where_you_are;
