//! Checks of the repository itself: the documentation navigates, its
//! examples run and show the answers tumbler gives; the layers keep their
//! rules; long files keep to their budgets; what the architecture and
//! safety documents cite exists.
//!
//! One test binary per area (each file a module named as its tests were
//! before): the suite links a handful of binaries, not one per file.

#[path = "../common/mod.rs"]
pub mod common;

mod client_snippets;
mod crates;
mod doc_answers;
mod doc_claims;
mod docs;
mod layers;
mod metric_names;
mod packages;
mod sizes;
