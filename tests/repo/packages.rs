//! What the workspace's publishable crates carry: `tumbler-proto` builds
//! from its own copy of `proto/` (a published package cannot reach outside
//! its folder), and that copy is the repository's, byte for byte.

use std::path::Path;

fn protos(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    found.sort();
    found
}

#[test]
fn the_proto_crate_carries_the_repositorys_proto_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repository = protos(&root.join("proto/tumbler/v1"));
    let packaged = protos(&root.join("crates/tumbler-proto/proto/tumbler/v1"));
    assert!(!repository.is_empty());
    let names = |files: &[(String, Vec<u8>)]| files.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&packaged),
        names(&repository),
        "crates/tumbler-proto/proto/tumbler/v1 must hold the same files as proto/tumbler/v1: \
         cp proto/tumbler/v1/*.proto crates/tumbler-proto/proto/tumbler/v1/"
    );
    for ((name, packaged), (_, repository)) in packaged.iter().zip(&repository) {
        assert!(
            packaged == repository,
            "crates/tumbler-proto/proto/tumbler/v1/{name} differs from proto/tumbler/v1/{name}: \
             cp proto/tumbler/v1/{name} crates/tumbler-proto/proto/tumbler/v1/"
        );
    }
}
