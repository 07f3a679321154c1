//! Writes every kernel of unfused attention (loop IR, CLIF, machine code) to a directory:
//! `cargo run --release --example dump_kernels -- N D DIR`, then e.g.
//! `objdump -D -b binary -m i386:x86-64 DIR/r_1024_1024.bin`.
use uopc::jit::Program;
use uopc::{RealizeOptions, Tensor};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let d: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let dir = std::path::PathBuf::from(args.get(2).cloned().unwrap_or_else(|| "kernels".into()));
    std::fs::create_dir_all(&dir).expect("output directory");
    let t = |seed: usize| {
        Tensor::from_vec((0..n * d).map(|x| ((x * seed) % 7) as f32).collect::<Vec<f32>>(), &[n, d])
    };
    let out = uopc::attention::attention(&t(1), &t(2), &t(3));
    let fused = std::env::var("FUSED").is_ok();
    let opts = if fused { RealizeOptions::fused() } else { RealizeOptions::default() };
    let plan = uopc::make_plan(&[out.uop().clone()], &opts).expect("plan");
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let prg = Program::compile(&kernel.program, &kernel.name).expect("compiles");
        let stem = dir.join(format!("{k}_{}", kernel.name));
        std::fs::write(stem.with_extension("loops"), prg.loop_ir()).unwrap();
        std::fs::write(stem.with_extension("clif"), prg.clif()).unwrap();
        std::fs::write(stem.with_extension("bin"), prg.machine_code()).unwrap();
        println!("{}: {} bytes of code", stem.display(), prg.machine_code().len());
    }
}
