//! Prints this machine's JIT F32X4 FMA peak on all threads: `cargo run --release --example peak`.
fn main() {
    let g = uopc::jit::peak::fma_peak_gflops(20_000_000, 5).expect("peak");
    println!("F32X4 FMA peak (all rayon threads): {g:.1} GFLOP/s");
}
