//! Generated gRPC code for `tumbler.v1` (see `proto/` and `build.rs`).
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("tumbler.v1");

/// The encoded descriptors of `proto/`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tumbler_descriptor.bin"));
