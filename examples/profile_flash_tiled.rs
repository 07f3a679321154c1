//! Runs `flash_tiled` in a loop for profiling and prints its best and mean time per run. It
//! writes the kernel's machine code to `OUT` (its CLIF to `OUT.clif`, its loop IR to `OUT.ir`)
//! and prints where the code lives, so samples of `perf record` map onto `objdump` of that
//! file: `RAYON_NUM_THREADS=1 perf record -o perf.data
//! target/release/examples/profile_flash_tiled N D SECONDS OUT [RxC]`, then `perf script -F
//! ip` and subtract the printed base. `RxC` sets the block sizes. The kernel is compiled with
//! `FlashTiled`'s own options; `OPT=speed` or `OPT=auto` overrides its opt level.
use std::time::Instant;
use uopc::flash_tiled::{FlashTiled, FlashTiling};
use uopc::jit::{JitOptions, OptLevel};

/// The address of `code` in this process's executable mappings (the JIT copies what it
/// reports as machine code into one of them).
fn find_code(code: &[u8]) -> Option<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (range, perms) = (parts.next()?, parts.next()?);
        if !perms.contains('x') {
            continue;
        }
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?);
        if hi - lo > 64 << 20 {
            continue;
        }
        // SAFETY: the range is mapped readable and executable in this process right now.
        let bytes = unsafe { std::slice::from_raw_parts(lo as *const u8, hi - lo) };
        if let Some(pos) = bytes.windows(code.len()).position(|w| w == code) {
            return Some(lo + pos);
        }
    }
    None
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |k: usize, default: usize| args.get(k).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (n, d, secs) = (num(0, 1024), num(1, 64), num(2, 5));
    let out_path = args.get(3).cloned().unwrap_or_else(|| "flash_tiled.bin".into());
    let defaults = FlashTiled::kernel_options();
    let opt_level = match std::env::var("OPT").as_deref() {
        Ok("speed") => OptLevel::Speed,
        Ok("auto") => OptLevel::Auto,
        _ => defaults.opt_level,
    };
    // An optional fifth argument `RxC` sets the query and key block sizes.
    let tiling = args
        .get(4)
        .and_then(|t| t.split_once('x'))
        .and_then(|(r, c)| Some(FlashTiling { query_block: r.parse().ok()?, key_block: c.parse().ok()? }))
        .unwrap_or_default();
    let opts = JitOptions { opt_level, ..defaults };
    let mut flash = FlashTiled::compile_with(n, d, tiling, &opts).unwrap();
    let code = flash.kernel().machine_code().to_vec();
    std::fs::write(&out_path, &code).expect("writes the machine code");
    std::fs::write(format!("{out_path}.clif"), flash.kernel().clif()).expect("writes the CLIF");
    std::fs::write(format!("{out_path}.ir"), flash.kernel().loop_ir()).expect("writes the loop IR");
    match find_code(&code) {
        Some(a) => println!("base {a:#x} len {}", code.len()),
        None => println!("code not found"),
    }
    let x: Vec<f32> = (0..n * d).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let mut out = vec![0.0f32; n * d];
    let t = Instant::now();
    let mut runs = 0;
    let mut best = f64::INFINITY;
    while t.elapsed().as_secs() < secs as u64 {
        let run = Instant::now();
        flash.run(&x, &x, &x, &mut out).unwrap();
        best = best.min(run.elapsed().as_secs_f64());
        runs += 1;
    }
    let mean = t.elapsed().as_secs_f64() * 1e3 / runs as f64;
    println!("{runs} runs, {mean:.3} ms each, best {:.3} ms", best * 1e3);
}
