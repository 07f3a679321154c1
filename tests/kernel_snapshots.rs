//! Snapshot test of `kernels/`: the loop IR, CLIF and machine code of every kernel of unfused
//! attention at N = 1024, D = 64, as `cargo run --release --example dump_kernels -- 1024 64
//! kernels` writes them.
//!
//! A changed kernel fails this test until its snapshot is regenerated on purpose:
//! `UOPC_BLESS=1 cargo test --release --test kernel_snapshots` rewrites `kernels/` (and
//! `kernels/cpu_features.txt`); the diff of `kernels/` then shows the change for review.
//!
//! The loop IR does not depend on the host and is always compared. The CLIF depends on one
//! feature, FMA (the lowering fuses a multiply and an add only where the host has it), so it is
//! compared wherever the host's FMA matches the one recorded in `kernels/cpu_features.txt`: a
//! kernel's changed CLIF then shows on any x86 CPU the project runs on. The machine code
//! depends on every feature Cranelift detects, so it is compared only when all of the host's
//! features equal the recorded ones; otherwise the test says on stderr what it skipped.
//!
//! Node numbers in the loop IR count every node the process created, so this file holds one
//! test (its own process, nothing building nodes beside it) that builds the graph exactly as
//! `dump_kernels` does.

use std::path::{Path, PathBuf};
use uopc::jit::Program;
use uopc::{RealizeOptions, Tensor};

/// The features that change what Cranelift (and the tile micro-kernels it calls) emit, one
/// `name yes|no` per line after the architecture.
fn host_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let features = [
            ("sse3", std::is_x86_feature_detected!("sse3")),
            ("ssse3", std::is_x86_feature_detected!("ssse3")),
            ("sse4.1", std::is_x86_feature_detected!("sse4.1")),
            ("sse4.2", std::is_x86_feature_detected!("sse4.2")),
            ("popcnt", std::is_x86_feature_detected!("popcnt")),
            ("lzcnt", std::is_x86_feature_detected!("lzcnt")),
            ("bmi1", std::is_x86_feature_detected!("bmi1")),
            ("bmi2", std::is_x86_feature_detected!("bmi2")),
            ("avx", std::is_x86_feature_detected!("avx")),
            ("avx2", std::is_x86_feature_detected!("avx2")),
            ("fma", std::is_x86_feature_detected!("fma")),
            ("avx512f", std::is_x86_feature_detected!("avx512f")),
            ("avx512vl", std::is_x86_feature_detected!("avx512vl")),
            ("avx512dq", std::is_x86_feature_detected!("avx512dq")),
            ("avx512bw", std::is_x86_feature_detected!("avx512bw")),
            ("avx512vbmi", std::is_x86_feature_detected!("avx512vbmi")),
            ("avx512bitalg", std::is_x86_feature_detected!("avx512bitalg")),
        ];
        let mut text = String::from("arch x86_64\n");
        for (name, on) in features {
            text.push_str(&format!("{name} {}\n", if on { "yes" } else { "no" }));
        }
        text
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        format!("arch {}\n", std::env::consts::ARCH)
    }
}

/// `(file name, contents)` of every snapshot file, built as `dump_kernels 1024 64` builds them.
fn generate() -> Vec<(String, Vec<u8>)> {
    let (n, d) = (1024, 64);
    let t = |seed: usize| {
        Tensor::from_vec((0..n * d).map(|x| ((x * seed) % 7) as f32).collect::<Vec<f32>>(), &[n, d])
    };
    let out = uopc::attention::attention(&t(1), &t(2), &t(3));
    let plan = uopc::make_plan(&[out.uop().clone()], &RealizeOptions::default()).expect("plan");
    let mut files = Vec::new();
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let prg = Program::compile(&kernel.program, &kernel.name).expect("compiles");
        let stem = format!("{k}_{}", kernel.name);
        files.push((format!("{stem}.loops"), prg.loop_ir().as_bytes().to_vec()));
        files.push((format!("{stem}.clif"), prg.clif().as_bytes().to_vec()));
        files.push((format!("{stem}.bin"), prg.machine_code().to_vec()));
    }
    files
}

/// The first line where `want` and `got` differ, for the failure message.
fn first_difference(want: &[u8], got: &[u8]) -> String {
    let (want, got) = (String::from_utf8_lossy(want), String::from_utf8_lossy(got));
    let mut lines = want.lines().zip(got.lines()).enumerate();
    match lines.find(|(_, (w, g))| w != g) {
        Some((i, (w, g))) => format!("line {}: snapshot `{w}`, now `{g}`", i + 1),
        None => {
            format!("lengths differ: snapshot {} lines, now {}", want.lines().count(), got.lines().count())
        }
    }
}

fn snapshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels")
}

#[test]
fn kernels_match_their_snapshots() {
    let dir = snapshot_dir();
    let files = generate();
    let features_path = dir.join("cpu_features.txt");
    if std::env::var_os("UOPC_BLESS").is_some() {
        std::fs::create_dir_all(&dir).expect("kernels/");
        // Snapshots of kernels the plan no longer has go, so the directory is the plan.
        for entry in std::fs::read_dir(&dir).expect("kernels/ exists") {
            let path = entry.expect("directory entry").path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name != "cpu_features.txt" && !files.iter().any(|f| f.0 == name) {
                std::fs::remove_file(&path).expect("removes a stale snapshot");
            }
        }
        for (name, bytes) in &files {
            std::fs::write(dir.join(name), bytes).expect("writes a snapshot");
        }
        std::fs::write(&features_path, host_features()).expect("writes cpu_features.txt");
        eprintln!("kernel_snapshots: wrote {} files to {}", files.len() + 1, dir.display());
        return;
    }
    let recorded = std::fs::read_to_string(&features_path).unwrap_or_default();
    let host = host_features();
    let same_host = recorded == host;
    let fma_line = |features: &str| features.lines().find(|l| l.starts_with("fma ")).map(str::to_owned);
    let same_clif = same_host || fma_line(&recorded) == fma_line(&host);
    if !same_host {
        eprintln!(
            "kernel_snapshots: this host's CPU features differ from kernels/cpu_features.txt; \
             the machine code comparison is SKIPPED{}",
            if same_clif { "" } else { ", and so is the CLIF's (the hosts differ in FMA)" }
        );
    }
    let mut stale = Vec::new();
    for (name, bytes) in &files {
        let compared = if name.ends_with(".bin") {
            same_host
        } else if name.ends_with(".clif") {
            same_clif
        } else {
            true
        };
        if !compared {
            continue;
        }
        match std::fs::read(dir.join(name)) {
            Ok(want) if &want == bytes => {}
            Ok(want) => stale.push(format!("{name}: {}", first_difference(&want, bytes))),
            Err(e) => stale.push(format!("{name}: {e}")),
        }
    }
    // A kernel that no longer exists leaves its snapshot behind: that is a change too.
    let expected: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
    for entry in std::fs::read_dir(&dir).expect("kernels/ exists") {
        let name = entry.expect("directory entry").file_name().to_string_lossy().into_owned();
        if name != "cpu_features.txt" && !expected.contains(&name.as_str()) {
            stale.push(format!("{name}: no kernel writes it any more"));
        }
    }
    assert!(
        stale.is_empty(),
        "kernels/ is out of date (regenerate with `UOPC_BLESS=1 cargo test --release --test \
         kernel_snapshots` if the change is intended):\n{}",
        stale.join("\n")
    );
}
