//! Lock semantics through the real server: mutual exclusion, queues, limits, namespaces, validation, read/write locks, weighted permits, sessions, watches, events, the changelog, the Metrics RPC, random requests; and the protocol model's paths replayed against the real functions.
//!
//! One test binary per area (each file a module named as its tests were
//! before): the suite links a handful of binaries, not one per file.

#[path = "../common/mod.rs"]
pub mod common;

mod batch;
mod changelog;
mod changelog_flood;
mod changelog_reads;
mod deadlock;
mod deadlock_flood;
mod election;
mod election_faults;
mod election_ownership;
mod events;
mod group_commit;
mod handover;
mod key_isolation;
mod libraries;
mod limits;
mod metrics;
mod model_replay;
mod multi;
mod multi_one_call;
mod multi_tokens;
mod mutual_exclusion;
mod properties;
mod provisional;
mod queue;
mod read_write;
mod read_write_events;
mod read_write_load;
mod semantics;
mod session;
mod session_edges;
mod session_multi;
mod session_takeover;
mod take_over;
mod validation;
mod watch;
mod weighted;
