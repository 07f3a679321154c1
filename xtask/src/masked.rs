//! `bench masked` and `bench decode`: causal and batched multi-head attention, and
//! flash-decoding against the machine's streaming bandwidth, each checked against f64.

use std::process::ExitCode;
use std::time::Instant;
use uopc::attention::online_attention_qb_ir;
use uopc::jit::Program;
use uopc::masked_attention::{
    AttentionShape, Causal, FlashDecode, MaskSpec, MaskedAttention, PadData, Padding,
    masked_attention_reference, streaming_read_gbs,
};

/// Outputs are convex combinations of values in [-1, 1): see `attention::TOLERANCE`.
const TOLERANCE: f64 = 1e-4;

/// `len` values uniform in `[-scale, scale)` from a xorshift seeded by `seed`.
pub(crate) fn inputs(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max)
}

fn best_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// Options of `bench masked`.
pub struct MaskedArgs {
    /// Key lengths (and query lengths unless `nq` is set).
    pub n: Vec<usize>,
    /// Head dimension.
    pub d: usize,
    /// Batch items.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Query length (defaults to the key length).
    pub nq: Option<usize>,
    /// Timed repetitions.
    pub reps: usize,
}

/// Runs `bench masked`: non-causal, causal via WHERE and causal via a ragged key loop, in one
/// run so their ratio is meaningful on a noisy machine (the runs are interleaved), with each
/// kernel's static GFLOP (how much work the causal forms skip). For one head with as many
/// queries as keys, the single-head online kernel (`online_qb`) runs in the same rounds as a
/// yardstick for the batched one; its speedup is against the non-causal batched kernel too.
pub fn run_masked(a: &MaskedArgs) -> ExitCode {
    println!(
        "{:<16} {:>3} {:>3} {:>6} {:>6} {:>4} {:>10} {:>9} {:>8} {:>12}",
        "variant", "b", "h", "nq", "nk", "d", "best ms", "speedup", "GFLOP", "max abs err"
    );
    let mut ok = true;
    for &n in &a.n {
        let shape = AttentionShape { batch: a.batch, heads: a.heads, n_q: a.nq.unwrap_or(n), n_k: n, d: a.d };
        let (q, k, v) =
            (inputs(shape.q_len(), 1, 2.0), inputs(shape.kv_len(), 2, 2.0), inputs(shape.kv_len(), 3, 1.0));
        let mut rows = Vec::new();
        let mut best = [f64::INFINITY; 3];
        let kernels: Vec<MaskedAttention> = [Causal::None, Causal::Where, Causal::Ragged]
            .iter()
            .map(|&causal| {
                MaskedAttention::compile(shape, MaskSpec { causal, padding: Padding::None, query_block: 4 })
            })
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("compiling the masked kernels: {e}"));
        let single_head = shape.batch == 1 && shape.heads == 1 && shape.n_q == shape.n_k;
        let yardstick = single_head.then(|| {
            Program::compile(&online_attention_qb_ir(n, shape.d, 4), "online_qb")
                .unwrap_or_else(|e| panic!("compiling online_qb: {e}"))
        });
        let mut outs = vec![vec![0.0f32; shape.q_len()]; 3];
        let mut yardstick_out = vec![0.0f32; shape.q_len()];
        let mut yardstick_best = f64::INFINITY;
        for _ in 0..a.reps.max(1) {
            for (i, kern) in kernels.iter().enumerate() {
                let out = &mut outs[i];
                best[i] = best[i].min(best_ms(0, || kern.run(&q, &k, &v, PadData::None, out).expect("runs")));
            }
            if let Some(prg) = &yardstick {
                let out = &mut yardstick_out;
                let t = best_ms(0, || prg.run_f32(&[&q, &k, &v], &mut [out]).expect("runs"));
                yardstick_best = yardstick_best.min(t);
            }
        }
        for (i, kern) in kernels.iter().enumerate() {
            let causal = kern.spec.causal != Causal::None;
            let want = masked_attention_reference(&shape, &q, &k, &v, causal, PadData::None);
            let err = max_err(&outs[i], &want);
            ok &= err <= TOLERANCE;
            let gflop = kern.program.estimates().flops as f64 / 1e9;
            let name = format!("causal_{}", format!("{:?}", kern.spec.causal).to_lowercase());
            rows.push((name, best[i], best[0] / best[i], gflop, err));
        }
        if let Some(prg) = &yardstick {
            let want = masked_attention_reference(&shape, &q, &k, &v, false, PadData::None);
            let err = max_err(&yardstick_out, &want);
            ok &= err <= TOLERANCE;
            let gflop = prg.estimates().flops as f64 / 1e9;
            rows.push(("online_qb".to_string(), yardstick_best, best[0] / yardstick_best, gflop, err));
        }
        for (name, t, speedup, gflop, err) in rows {
            let flag = if err <= TOLERANCE { "" } else { "  WRONG" };
            println!(
                "{name:<16} {:>3} {:>3} {:>6} {:>6} {:>4} {t:>10.3} {speedup:>8.2}x {gflop:>8.3} {err:>12.1e}{flag}",
                shape.batch, shape.heads, shape.n_q, shape.n_k, shape.d
            );
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Runs `bench decode`: one query against `nk` keys per head, split across threads and merged,
/// reported as GB/s of K and V read next to a streaming read measured in the same run.
pub fn run_decode(nk: &[usize], d: usize, heads: usize, chunks: usize, reps: usize) -> ExitCode {
    let stream = streaming_read_gbs(256, rayon_threads(), 5);
    println!("streaming read (256 MB, all threads): {stream:.1} GB/s");
    println!(
        "{:<14} {:>4} {:>8} {:>4} {:>10} {:>10} {:>10} {:>12}",
        "variant", "h", "nk", "d", "best ms", "KV GB/s", "% stream", "max abs err"
    );
    let mut ok = true;
    for &n in nk {
        let shape = AttentionShape { batch: 1, heads, n_q: 1, n_k: n, d };
        let (q, k, v) =
            (inputs(shape.q_len(), 4, 2.0), inputs(shape.kv_len(), 5, 2.0), inputs(shape.kv_len(), 6, 1.0));
        let dec = match FlashDecode::compile(shape, chunks, Padding::None) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("error: flash-decoding n_k={n}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut scratch = dec.scratch();
        let mut out = vec![0.0f32; shape.q_len()];
        let t =
            best_ms(reps, || dec.run_with(&q, &k, &v, PadData::None, &mut scratch, &mut out).expect("runs"));
        let want = masked_attention_reference(&shape, &q, &k, &v, false, PadData::None);
        let err = max_err(&out, &want);
        ok &= err <= TOLERANCE;
        let gbs = dec.kv_bytes() as f64 / (t * 1e-3) / 1e9;
        let flag = if err <= TOLERANCE { "" } else { "  WRONG" };
        println!(
            "{:<14} {heads:>4} {n:>8} {d:>4} {t:>10.3} {gbs:>10.1} {:>9.0}% {err:>12.1e}{flag}",
            "flash_decode",
            100.0 * gbs / stream
        );
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// The size of the pool the kernels run on (rayon's global pool, sized by `RAYON_NUM_THREADS`).
fn rayon_threads() -> usize {
    rayon::current_num_threads()
}
