//! The three attention forms side by side, and the online form on tile ops:
//! `cargo run --release --example flash_attention -- N D`
//! (defaults 1024 64). With `--causal`, `--heads H`, `--batch B` or `--nq NQ` it runs the
//! masked and batched multi-head forms instead (the Tensor forms only for B = H = 1, NQ = N).
//!
//! Each line is the best of 3 calls after a warm-up, the largest error against an f64
//! reference, and what the realized plan materialized. The Tensor forms' times include
//! building tensors from the input vectors, realizing and reading the output back; the online
//! form's is one run of the compiled loop program.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::process::ExitCode;
use std::time::Instant;
use uopc::attention::{attention, online_attention_ir};
use uopc::flash_tiled::{FlashTileOps, TILE_OPS_TILING};
use uopc::jit::Program;
use uopc::kernels::reference::{attention_f64, max_abs_err};
use uopc::tensor::{ArgSource, Plan, input_products};
use uopc::{RealizeOptions, Tensor, make_plan, realize};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Larger than f32 rounding over N- and D-long sums (~1e-6 here), far below a real bug (~1e-2).
const TOLERANCE: f64 = 1e-4;

/// Q and K uniform in [-2, 2), V in [-1, 1); the same seed as `cargo xtask bench attention`.
fn inputs(n: usize, d: usize) -> [Vec<f32>; 3] {
    let mut rng = StdRng::seed_from_u64(0x5eed ^ ((n as u64) << 32) ^ d as u64);
    [2.0, 2.0, 1.0].map(|s: f32| (0..n * d).map(|_| rng.random_range(-s..s)).collect())
}

/// `3.3e-07`, like C's `%.1e`.
fn fmt_err(x: f64) -> String {
    let s = format!("{x:.1e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

fn fmt_bytes(b: usize) -> String {
    let b = b as f64;
    match b {
        _ if b >= 1e9 => format!("{:.1} GB", b / 1e9),
        _ if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        _ if b >= 1e3 => format!("{:.1} kB", b / 1e3),
        _ => format!("{b} B"),
    }
}

/// What the plan keeps in memory, and how often it computes q.k, from the plan itself.
fn describe(plan: &Plan, n: usize, d: usize) -> String {
    let nn: Vec<usize> = plan
        .kernels
        .iter()
        .filter(|k| k.shape == [n, n])
        .filter_map(|k| match k.args.last() {
            Some(ArgSource::Temp(t)) => Some(plan.temps[*t].0.size() * plan.temps[*t].1),
            _ => None,
        })
        .collect();
    let mut desc = match nn.len() {
        0 => "no N*N buffer".to_string(),
        1 => format!("materializes {} of scores", fmt_bytes(nn[0])),
        c => format!("materializes {} of scores in {c} N*N buffers", fmt_bytes(nn.iter().sum())),
    };
    // q.k products: MULs of loads of Q (input 0) and K (input 1), and their tile GEMMs
    let per_pair = input_products(plan, 0, 1).unwrap_or(0) as f64 / (n * n * d) as f64;
    let times = if per_pair == 1.0 { "once".to_string() } else { format!("{per_pair:.0} times") };
    desc += &format!(", QK^T computed {times}");
    desc
}

fn best_of_3(mut call: impl FnMut() -> Result<()>) -> Result<f64> {
    call()?; // warm-up: compiles (Tensor forms), maps memory
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        call()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best * 1e3)
}

fn run(n: usize, d: usize) -> Result<bool> {
    let x = inputs(n, d);
    let want = attention_f64(&x[0], &x[1], &x[2], n, d);
    let mut ok = true;
    let mut line = |name: &str, ms: f64, out: &[f32], desc: String| {
        let err = max_abs_err(out, &want);
        let flag = if err <= TOLERANCE { "" } else { "  WRONG" };
        ok &= err <= TOLERANCE;
        println!("{name:<8}{ms:>9.2} ms  err {}   ({desc}){flag}", fmt_err(err));
    };
    for (name, opts) in [("unfused", RealizeOptions::default()), ("fused", RealizeOptions::fused())] {
        let tensors = || -> Result<[Tensor; 3]> {
            let [q, k, v] = x.clone().map(|data| Tensor::try_from_vec(data, &[n, d]));
            Ok([q?, k?, v?])
        };
        let mut out = Vec::new();
        let ms = best_of_3(|| {
            let [q, k, v] = tensors()?;
            let (res, _) = realize(&[&attention(&q, &k, &v)], &opts)?;
            out = res[0].to_ndarray::<f32>()?.into_raw_vec_and_offset().0;
            Ok(())
        })?;
        let [q, k, v] = tensors()?;
        let plan = make_plan(&[attention(&q, &k, &v).uop().clone()], &opts)?;
        line(name, ms, &out, describe(&plan, n, d));
    }
    let prg = Program::compile(&online_attention_ir(n, d), "online")?;
    let mut out = vec![0.0f32; n * d];
    let ms = best_of_3(|| Ok(prg.run_f32(&[&x[0], &x[1], &x[2]], &mut [&mut out])?))?;
    line("online", ms, &out, "one pass, running max/sum".into());
    // The same online softmax on tile ops: score and output tiles through the micro-kernels.
    let mut flash = FlashTileOps::compile(n, d, TILE_OPS_TILING)?;
    let ms = best_of_3(|| Ok(flash.run(&x[0], &x[1], &x[2], &mut out)?))?;
    let br = uopc::attention::query_block(n, TILE_OPS_TILING.query_block);
    let bc = TILE_OPS_TILING.key_block.min(n);
    line("tiles", ms, &out, format!("FlashAttention-2, {br}x{bc} tiles through tile GEMMs"));
    Ok(ok)
}

/// Masked / multi-head forms: Tensor unfused and fused (single head), the online kernel with
/// a WHERE mask, and (causal) the ragged key loop.
fn run_masked(n: usize, d: usize, m: &MaskFlags) -> Result<bool> {
    use uopc::masked_attention::*;
    let nq = m.nq.unwrap_or(n);
    let shape = AttentionShape { batch: m.batch, heads: m.heads, n_q: nq, n_k: n, d };
    let mut rng = StdRng::seed_from_u64(0x5eed ^ ((n as u64) << 32) ^ d as u64);
    let mut fill = |len: usize, s: f32| (0..len).map(|_| rng.random_range(-s..s)).collect::<Vec<f32>>();
    let (q, k, v) = (fill(shape.q_len(), 2.0), fill(shape.kv_len(), 2.0), fill(shape.kv_len(), 1.0));
    let want = masked_attention_reference(&shape, &q, &k, &v, m.causal, PadData::None);
    let mut ok = true;
    let mut line = |name: &str, ms: f64, out: &[f32], desc: &str| {
        let err = max_abs_err(out, &want);
        ok &= err <= TOLERANCE;
        let flag = if err <= TOLERANCE { "" } else { "  WRONG" };
        println!("{name:<14}{ms:>9.2} ms  err {}   ({desc}){flag}", fmt_err(err));
    };
    if m.batch == 1 && m.heads == 1 && nq == n {
        for (name, opts) in [("unfused", RealizeOptions::default()), ("fused", RealizeOptions::fused())] {
            let mut out = Vec::new();
            let ms = best_of_3(|| {
                let t = |x: &[f32]| Tensor::try_from_vec(x.to_vec(), &[n, d]);
                let a = uopc::tensor::masked::attention_masked(&t(&q)?, &t(&k)?, &t(&v)?, None, m.causal);
                let (res, _) = realize(&[&a], &opts)?;
                out = res[0].to_ndarray::<f32>()?.into_raw_vec_and_offset().0;
                Ok(())
            })?;
            line(name, ms, &out, "mask applied with WHERE on the scores");
        }
    }
    let mut forms = vec![(if m.causal { Causal::Where } else { Causal::None }, "online")];
    if m.causal {
        forms.push((Causal::Ragged, "online_ragged"));
    }
    for (causal, name) in forms {
        let kern = MaskedAttention::compile(shape, MaskSpec { causal, ..MaskSpec::default() })?;
        let mut out = vec![0.0f32; shape.q_len()];
        let ms = best_of_3(|| Ok(kern.run(&q, &k, &v, PadData::None, &mut out)?))?;
        let desc = match causal {
            Causal::Ragged => "key loop ends at the diagonal",
            Causal::Where => "every key visited, future ones masked",
            Causal::None => "batch x heads x query blocks threaded",
        };
        line(name, ms, &out, desc);
    }
    Ok(ok)
}

/// `--causal`, `--heads H`, `--batch B`, `--nq NQ`.
#[derive(Default)]
struct MaskFlags {
    causal: bool,
    heads: usize,
    batch: usize,
    nq: Option<usize>,
    any: bool,
}

fn parse_flags(args: &mut Vec<String>) -> std::result::Result<MaskFlags, String> {
    let mut f = MaskFlags { heads: 1, batch: 1, ..MaskFlags::default() };
    let mut rest = Vec::new();
    let mut it = args.drain(..);
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> std::result::Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|&v| v > 0)
                .ok_or(format!("{name} needs a positive integer"))
        };
        match a.as_str() {
            "--causal" => f.causal = true,
            "--heads" => f.heads = value("--heads")?,
            "--batch" => f.batch = value("--batch")?,
            "--nq" => f.nq = Some(value("--nq")?),
            _ => {
                rest.push(a);
                continue;
            }
        }
        f.any = true;
    }
    drop(it);
    *args = rest;
    Ok(f)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let flags = match parse_flags(&mut args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let dims: Option<Vec<usize>> = args.iter().map(|a| a.parse().ok().filter(|&v| v > 0)).collect();
    let (n, d) = match dims.as_deref() {
        Some([]) => (1024, 64),
        Some([n]) => (*n, 64),
        Some([n, d]) => (*n, *d),
        _ => {
            eprintln!(
                "usage: flash_attention [N [D]] [--causal] [--heads H] [--batch B] [--nq NQ]   (default 1024 64)"
            );
            return ExitCode::from(2);
        }
    };
    let result = if flags.any { run_masked(n, d, &flags) } else { run(n, d) };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: a result differs from the f64 reference by more than {}", fmt_err(TOLERANCE));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
