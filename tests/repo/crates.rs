//! The workspace's dependency rules, which the compiler enforces once a
//! dependency is absent: the Rust client and the CLI build without the
//! server's Redis and web stack, and the CLI without the server itself;
//! the engine knows no proto or transport, the store no engine either;
//! the engine's face (`tumbler-face`) knows no Redis, store, proto or
//! transport; the handlers (`tumbler-service`) build on the face and the
//! proto, with neither the engine, the store nor Redis in their tree.

use std::path::Path;
use std::process::Command;

/// The packages `package` depends on (normal dependencies, transitively),
/// as `cargo tree` resolves them: names only.
fn normal_dependencies(package: &str) -> Vec<String> {
    tree(package, &[])
}

/// `cargo tree -p package -e normal` with `more` arguments: names only.
fn tree(package: &str, more: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            package,
            "-e",
            "normal",
        ])
        .args(more)
        .args(["--prefix", "none", "--format", "{p}"])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// `package` builds on `tumbler-proto` and without `redis*`, `axum*` or
/// the server package `tumbler`.
fn assert_client_side(package: &str) {
    let names = normal_dependencies(package);
    assert!(names.iter().any(|n| n == "tumbler-proto"), "{names:?}");
    let server_side: Vec<&String> = (names.iter())
        .filter(|n| n.starts_with("redis") || n.starts_with("axum") || *n == "tumbler")
        .collect();
    assert!(
        server_side.is_empty(),
        "{package} pulls in server-side crates: {server_side:?}"
    );
}

/// A layer's normal dependencies include `needs` and none of the crates
/// above it: none whose name starts with one of `prefixes`, none named
/// one of `names`.
fn assert_below(package: &str, needs: &str, prefixes: &[&str], names: &[&str]) {
    let found = normal_dependencies(package);
    assert!(found.iter().any(|n| n == needs), "{found:?}");
    let above: Vec<&String> = (found.iter())
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)) || names.contains(&n.as_str()))
        .collect();
    assert!(
        above.is_empty(),
        "{package} pulls in what is above it: {above:?}"
    );
}

#[test]
fn the_engine_depends_on_no_proto_or_transport() {
    assert_below(
        "tumbler-engine",
        "tumbler-store",
        &["tonic", "axum", "tumbler-proto"],
        &["tumbler", "hyper", "prost"],
    );
}

#[test]
fn the_store_depends_on_no_engine_proto_or_transport() {
    assert_below(
        "tumbler-store",
        "redis",
        &["tonic", "axum", "tumbler-proto"],
        &["tumbler", "tumbler-engine", "tumbler-face", "hyper"],
    );
}

/// The handlers' crate depends on the engine's face and the proto, and
/// has neither the engine, the store nor Redis anywhere in its tree
/// (decision 0088): the server hands it the engine as an `Arc<dyn
/// EngineFace>`, so the compiler keeps all three out of its code (what
/// `tests/repo/layers.rs` read by grep before). Nor the dashboard's web
/// stack or the server package (axum comes with tonic's router).
#[test]
fn the_handlers_depend_on_the_face_and_proto_not_the_engine_store_or_redis() {
    let direct = tree("tumbler-service", &["--depth", "1"]);
    for needs in ["tumbler-face", "tumbler-proto"] {
        assert!(direct.iter().any(|n| n == needs), "{direct:?}");
    }
    assert_below(
        "tumbler-service",
        "tumbler-face",
        &["redis", "bb8", "askama", "axum-extra", "cookie"],
        &[
            "tumbler",
            "tumbler-store",
            "tumbler-engine",
            "tumbler-cli",
            "tumbler-client",
        ],
    );
}

/// The engine's face, below the engine: its names, requests, outcomes,
/// errors and traits, with no Redis, store, proto or transport in its tree.
#[test]
fn the_face_depends_on_no_redis_store_proto_or_transport() {
    assert_below(
        "tumbler-face",
        "async-trait",
        &["redis", "bb8", "tonic", "axum", "tumbler-proto"],
        &[
            "tumbler",
            "tumbler-store",
            "tumbler-engine",
            "hyper",
            "prost",
        ],
    );
}

/// The engine builds on the face (and re-exports it), not the other way.
#[test]
fn the_engine_builds_on_the_face() {
    let names = normal_dependencies("tumbler-engine");
    assert!(names.iter().any(|n| n == "tumbler-face"), "{names:?}");
}

#[test]
fn the_rust_client_depends_on_neither_redis_nor_axum() {
    assert_client_side("tumbler-client");
}

/// The client subcommands compile no Redis, web or server code: what they
/// share with the server (protocol constants, the token digest) lives in
/// `tumbler-proto`, and they reach it through `tumbler-client`.
#[test]
fn the_cli_depends_on_neither_redis_nor_axum_nor_the_server() {
    assert_client_side("tumbler-cli");
    let names = normal_dependencies("tumbler-cli");
    assert!(names.iter().any(|n| n == "tumbler-client"), "{names:?}");
}

#[test]
fn the_rust_clients_readme_example_is_the_compiled_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("clients/rust/README.md")).unwrap();
    let section = readme
        .split("\n## Example")
        .nth(1)
        .expect("an Example section");
    let block = section
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a rust block");
    let example = std::fs::read_to_string(root.join("clients/rust/examples/readme.rs")).unwrap();
    assert!(
        example.ends_with(block),
        "clients/rust/examples/readme.rs must end with the README's example, as it is"
    );
}
