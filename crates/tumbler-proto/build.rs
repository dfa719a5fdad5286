//! Compiles `proto/tumbler/v1/*.proto` (the repository's `proto/`, two
//! folders up) into Rust with a pure-Rust proto compiler (protox), so a
//! fresh machine needs no system `protoc`, and writes the encoded
//! descriptor set that server reflection serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.join("../../proto");
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
    std::fs::write(
        out_dir.join("tumbler_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
