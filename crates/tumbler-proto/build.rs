//! Compiles `proto/tumbler/v1/*.proto` into Rust with a pure-Rust proto
//! compiler (protox), so a fresh machine needs no system `protoc`, and writes the encoded
//! descriptor set that server reflection serves, and the proto3 JSON
//! mapping of every message (pbjson: serde impls from the same descriptors,
//! used by the Connect protocol's JSON bodies).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate's own copy of the repository's `proto/`, so the published
    // package builds on its own; `tests/repo/crates.rs` keeps the two equal.
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.join("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let protos: Vec<PathBuf> = std::fs::read_dir(root.join("tumbler/v1"))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    let protos: Vec<PathBuf> = protos
        .into_iter()
        .filter(|p| p.extension().is_some_and(|ext| ext == "proto"))
        .collect();

    // Imported google/protobuf files stay in the set: prost-build needs them.
    let descriptors = protox::compile(&protos, [&root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let encoded = prost::Message::encode_to_vec(&descriptors);
    std::fs::write(out_dir.join("tumbler_descriptor.bin"), &encoded)?;
    // Writes `tumbler.v1.serde.rs` into OUT_DIR, included by lib.rs.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .build(&[".tumbler.v1"])?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
