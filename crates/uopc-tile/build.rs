//! Records the optimization level this crate is compiled at, so the library can warn at run time
//! when its SIMD micro-kernels were built unoptimized (a dependent's debug build without a
//! profile override), which makes every tile op one to two orders of magnitude slower.

fn main() {
    let level = std::env::var("OPT_LEVEL").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=UOPC_TILE_OPT_LEVEL={level}");
    println!("cargo:rerun-if-env-changed=OPT_LEVEL");
}
