//! The generated gRPC code of `tumbler.v1` and the descriptor set served by
//! reflection: the `tumbler-proto` crate (`crates/tumbler-proto`),
//! re-exported so the server names it `crate::proto`.

pub use tumbler_proto::*;
