//! Writes an attention kernel's loop IR, CLIF and machine code:
//! `cargo run --release --example dump_online -- N D QB [DIR]` for the online kernel (QB > 1:
//! query-blocked), `cargo run --release --example dump_online -- N D tiled [DIR]` for
//! `flash_tiled`.
use uopc::attention::{online_attention_ir, online_attention_qb_ir};
use uopc::flash_tiled::{FlashTiled, FlashTiling};
use uopc::jit::Program;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: dump_online N D (QB | tiled) [DIR]";
    let num = |k: usize| args.get(k).and_then(|x| x.parse::<usize>().ok()).expect(usage);
    let (n, d) = (num(0), num(1));
    let dir = args.get(3).cloned().unwrap_or_else(|| "kernels".into());
    let tiled;
    let compiled;
    let (prg, name): (&Program, &str) = if args.get(2).map(String::as_str) == Some("tiled") {
        tiled = FlashTiled::compile(n, d, FlashTiling::default()).unwrap();
        (tiled.kernel(), "flash_tiled")
    } else {
        let qb = num(2);
        let p = if qb > 1 { online_attention_qb_ir(n, d, qb) } else { online_attention_ir(n, d) };
        compiled = Program::compile(&p, "online").unwrap();
        (&compiled, "online")
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(format!("{dir}/{name}.clif"), prg.clif()).unwrap();
    std::fs::write(format!("{dir}/{name}.loops"), prg.loop_ir()).unwrap();
    std::fs::write(format!("{dir}/{name}.bin"), prg.machine_code()).unwrap();
}
