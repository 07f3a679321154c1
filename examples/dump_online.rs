//! Writes the online attention kernel's CLIF and machine code: `cargo run --release --example dump_online -- N D QB DIR`.
use uopc::attention::{online_attention_ir, online_attention_qb_ir};
use uopc::jit::Program;

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).take(3).filter_map(|x| x.parse().ok()).collect();
    let dir = std::env::args().nth(4).unwrap_or_else(|| "kernels".into());
    let (n, d, qb) = (a[0], a[1], a[2]);
    let p = if qb > 1 { online_attention_qb_ir(n, d, qb) } else { online_attention_ir(n, d) };
    let prg = Program::compile(&p, "online").unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(format!("{dir}/online.clif"), prg.clif()).unwrap();
    std::fs::write(format!("{dir}/online.loops"), prg.loop_ir()).unwrap();
    std::fs::write(format!("{dir}/online.bin"), prg.machine_code()).unwrap();
}
