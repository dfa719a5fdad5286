//! Compiles `proto/tumbler/v1/*.proto` into Rust with a pure-Rust proto
//! compiler (protox), so a fresh machine needs no system `protoc`, and
//! writes the encoded descriptor set that server reflection serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let protos: Vec<PathBuf> = std::fs::read_dir("proto/tumbler/v1")?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    let protos: Vec<PathBuf> = protos
        .into_iter()
        .filter(|p| p.extension().is_some_and(|ext| ext == "proto"))
        .collect();

    // Imported google/protobuf files stay in the set: prost-build needs them.
    let descriptors = protox::compile(&protos, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("tumbler_descriptor.bin");
    std::fs::write(
        &descriptor_path,
        prost::Message::encode_to_vec(&descriptors),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
