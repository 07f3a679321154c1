//! Replays the `tensor_realize` fuzz corpus (`fuzz/corpus/tensor_realize`, regression inputs
//! kept in the repository) through the fuzz target's checks, so the corpus runs in every
//! `cargo test` without cargo-fuzz.

use std::path::Path;

#[test]
fn the_tensor_realize_corpus_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/tensor_realize");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    files.sort();
    // The corpus is there (a moved directory must not pass as an empty one).
    assert!(files.len() >= 10, "{} inputs in {}", files.len(), dir.display());
    for path in &files {
        let bytes = std::fs::read(path).expect("a readable corpus file");
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if let Err(e) = uopc_testgen_tensor::check(&bytes) {
            panic!("{name}: {e}");
        }
        if let Err(e) = uopc_testgen_tensor::check_try_api(&bytes) {
            panic!("{name} (try_ API walk): {e}");
        }
    }
}
