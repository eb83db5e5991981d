//! Regenerates the protocol code and fails when the committed `src/gen/` differs from it.
//! `make gen` runs this with `CONSISTD_REGENERATE=1`, which writes the new code instead of failing.

use std::{
    fs,
    path::{Path, PathBuf},
};

const PROTOS: &[&str] = &[
    "consistd/v1/object.proto",
    "consistd/v1/watch.proto",
    "consistd/v1/objects.proto",
    "consistd/v1/leadership.proto",
    "consistd/v1/outbox.proto",
    "consistd/v1/inbox.proto",
    "consistd/v1/rollout.proto",
    "consistd/v1/reconcile.proto",
];
/// The daemon-to-daemon protocol, kept out of the app socket's reflection.
const PEER_PROTOS: &[&str] = &["consistd/peer/v1/peer.proto"];
const GENERATED: &[&str] = &["consistd.v1.rs", "consistd.v1.bin", "consistd.peer.v1.rs"];

#[test]
fn generated_code_matches_the_proto_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed = root.join("src/gen");
    let fresh = tempfile::tempdir().expect("create a temp dir for generated code");
    generate(root, fresh.path());

    if std::env::var_os("CONSISTD_REGENERATE").is_some() {
        for name in GENERATED {
            fs::copy(fresh.path().join(name), committed.join(name))
                .unwrap_or_else(|e| panic!("copy generated {name} into src/gen: {e}"));
        }
        return;
    }
    for name in GENERATED {
        let want = fs::read(fresh.path().join(name)).expect("read freshly generated code");
        let have = fs::read(committed.join(name)).unwrap_or_default();
        assert!(
            want == have,
            "proto/src/gen/{name} is out of date with proto/consistd/v1/*.proto; run `make gen` and commit the result"
        );
    }
}

fn generate(root: &Path, out: &Path) {
    // An object's JSON goes from the watch cache to every subscriber, and from the wire to the app,
    // without a copy of its own.
    compile(root, out, PROTOS, "consistd.v1.bin", &[".consistd.v1.KubeObject.json"]);
    // Payloads pass from the outbox to the wire and from the wire to the inbox without copies.
    compile(root, out, PEER_PROTOS, "consistd.peer.v1.bin", &["."]);
}

/// Generates Rust for `protos` (and their descriptor set, `bin`) into `out`, with the `bytes` fields
/// under `as_bytes` as `bytes::Bytes` (shared, not copied) rather than `Vec<u8>`.
fn compile(root: &Path, out: &Path, protos: &[&str], bin: &str, as_bytes: &[&str]) {
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("find the vendored protoc");
    let wkt = protoc_bin_vendored::include_path().expect("find the vendored well-known protos");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    config.bytes(as_bytes);
    let protos: Vec<PathBuf> = protos.iter().map(|p| root.join(p)).collect();
    let includes = [root.to_path_buf(), wkt];
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .out_dir(out)
        .file_descriptor_set_path(out.join(bin))
        .compile_with_config(config, &protos, &includes)
        .unwrap_or_else(|e| panic!("generate Rust code from {protos:?}: {e}"));
}
