//! The `tumbler` binary and its client subcommands, run as processes.
//!
//! One test binary per area (each file a module named as its tests were
//! before): the suite links a handful of binaries, not one per file.

#[path = "../common/mod.rs"]
pub mod common;

mod binary;
mod cli;
mod cli_elect;
mod cli_health;
mod cli_hold;
mod cli_multi;
mod cli_read_write;
mod redis_acl;
mod upgrade_layout;
