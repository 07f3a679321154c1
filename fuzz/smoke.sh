#!/usr/bin/env bash
# The fuzz targets without cargo-fuzz or nightly: type-check both targets (libfuzzer-sys
# builds on stable; only running them needs `cargo +nightly fuzz`), then replay the
# tensor_realize corpus through the same checks the target makes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo check --manifest-path fuzz/Cargo.toml --bins
cargo test --release -p uopc-testgen-tensor --test corpus
