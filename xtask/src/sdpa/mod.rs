//! `bench sdpa`: the one attention entry point on model shapes, timed in interleaved rounds,
//! with useful GFLOP/s, the share of the widest FMA peak and the error against f64.

use crate::stats::PairedRatio;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;
use uopc::kernels::sdpa::{
    Blocking, Extras, ForwardSaved, Sdpa, SdpaBackward, SdpaConfig, SdpaDType, Values, ValuesMut,
    reference_backward_f64, reference_f64,
};

mod backward;
pub use backward::run_backward;

/// Parses an element type: `f32`, `bf16` or `f16`.
pub fn parse_dtype(s: &str) -> Result<SdpaDType, String> {
    match s {
        "f32" => Ok(SdpaDType::F32),
        "bf16" => Ok(SdpaDType::BF16),
        "f16" => Ok(SdpaDType::F16),
        _ => Err(format!("{s}: expected f32, bf16 or f16")),
    }
}

/// One cell of the matrix: `[B, H, H_kv, n_q, n_k, D]`, causal or not, optional key lengths.
#[derive(Clone, Debug)]
pub struct Cell {
    /// `[B, H, H_kv, n_q, n_k, D]`.
    pub shape: [usize; 6],
    /// The causal mask.
    pub causal: bool,
    /// Per-batch key lengths.
    pub key_lengths: Option<Vec<i32>>,
}

/// Parses `B,H,HKV,NQ,NK,D`.
pub fn parse_shape(s: &str) -> Result<[usize; 6], String> {
    crate::stats::parse_dims(s, "B,H,HKV,NQ,NK,D")
}

/// The default matrix: model shapes (single-head, BERT-like, LLaMA-like with and without GQA,
/// odd lengths, D = 80 and 256), shapes no list names (prime lengths, D = 96 and 160, GQA 3:1
/// and 8:1), causal forms, padding, and decodes against long caches.
pub fn default_cells() -> Vec<Cell> {
    let plain = |shape| Cell { shape, causal: false, key_lengths: None };
    let causal = |shape| Cell { shape, causal: true, key_lengths: None };
    vec![
        plain([1, 1, 1, 1024, 1024, 64]),
        plain([1, 1, 1, 4096, 4096, 64]),
        plain([4, 12, 12, 512, 512, 64]),
        plain([1, 32, 32, 1024, 1024, 128]),
        plain([1, 32, 8, 1024, 1024, 128]),
        plain([2, 8, 8, 1000, 1000, 80]),
        plain([1, 8, 8, 1024, 1024, 256]),
        // Sizes no list names: n_q and n_k prime or odd (no tile height divides them), odd D,
        // GQA 3:1 and 8:1.
        plain([3, 6, 2, 777, 1500, 96]),
        plain([1, 8, 1, 1009, 1009, 160]),
        plain([1, 12, 4, 257, 1031, 96]),
        causal([1, 1, 1, 1024, 1024, 64]),
        causal([4, 12, 12, 512, 512, 64]),
        causal([1, 32, 8, 1024, 1024, 128]),
        Cell { shape: [4, 8, 8, 512, 512, 64], causal: false, key_lengths: Some(vec![512, 300, 129, 1]) },
        plain([1, 32, 8, 1, 4096, 128]),
        plain([8, 32, 32, 1, 2048, 128]),
        plain([1, 16, 16, 1, 65536, 64]),
    ]
}

/// `cells` with each causal cell followed by its unmasked form, unless `cells` has that already.
pub fn with_unmasked_forms(cells: Vec<Cell>) -> Vec<Cell> {
    let mut out = Vec::new();
    for c in &cells {
        out.push(c.clone());
        let present = |x: &Cell| x.shape == c.shape && x.key_lengths == c.key_lengths && !x.causal;
        if c.causal && !cells.iter().any(present) {
            out.push(Cell { causal: false, ..c.clone() });
        }
    }
    out
}

/// The default backward matrix (forward with lse plus backward per cell): the single-head,
/// BERT-like, LLaMA-like GQA and odd-length D = 80 shapes, each causal and not.
pub fn default_backward_cells() -> Vec<Cell> {
    let shapes = [
        [1, 1, 1, 1024, 1024, 64],
        [4, 12, 12, 512, 512, 64],
        [1, 32, 8, 1024, 1024, 128],
        [2, 8, 8, 1000, 1000, 80],
    ];
    shapes
        .into_iter()
        .flat_map(|shape| [false, true].map(|causal| Cell { shape, causal, key_lengths: None }))
        .collect()
}

/// One row of the JSON report.
#[derive(Serialize)]
struct Row {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    n_q: usize,
    n_k: usize,
    d: usize,
    causal: bool,
    key_lengths: Option<Vec<i32>>,
    dtype: &'static str,
    pass: &'static str,
    kernel: String,
    median_ms: f64,
    best_ms: f64,
    gflops: f64,
    percent_of_widest_peak: f64,
    /// Over every output of batch item 0's first key/value group (the f64 reference of the
    /// whole output would take longer than the bench).
    max_abs_err: f64,
    compile_ms: f64,
    /// Decode cells (at most 16 query rows per key/value head): K and V bytes read per second,
    /// and that as a share of the streaming-read bandwidth measured in the same run.
    kv_gbs: Option<f64>,
    percent_of_stream: Option<f64>,
    /// Bytes of the buffers the backward allocates besides the caller's (backward rows only).
    #[serde(skip_serializing_if = "Option::is_none")]
    temporary_bytes: Option<usize>,
    /// Causal cells whose unmasked form ran in the same run: causal time over non-causal
    /// time, paired run by run.
    #[serde(skip_serializing_if = "Option::is_none")]
    causal_over_non_causal: Option<PairedRatio>,
    /// A 16-bit cell's speed against the same cell in f32 (f32 time over its time), paired run
    /// by run, when the run times both.
    #[serde(skip_serializing_if = "Option::is_none")]
    speed_vs_f32_paired: Option<PairedRatio>,
}

#[derive(Serialize)]
struct Report {
    widest_peak: Option<(&'static str, f64)>,
    streaming_read_gbs: Option<f64>,
    decode_steps: Option<DecodeSteps>,
    threads: usize,
    results: Vec<Row>,
}

fn config(cell: &Cell) -> SdpaConfig {
    let [b, h, hkv, n_q, n_k, d] = cell.shape;
    SdpaConfig {
        kv_heads: hkv,
        causal: cell.causal,
        key_lengths: cell.key_lengths.is_some(),
        ..SdpaConfig::new(b, h, n_q, n_k, d)
    }
}

/// Query-key pairs that are not masked, over all batch items and heads.
fn useful_pairs(c: &SdpaConfig, lens: Option<&[i32]>) -> f64 {
    let mut pairs = 0.0;
    for b in 0..c.batch {
        let len = lens.map_or(c.n_k, |l| l[b] as usize);
        for i in 0..c.n_q {
            let seen = if c.causal {
                (i as i64 + c.causal_offset() + 1).clamp(0, c.n_k as i64) as usize
            } else {
                c.n_k
            };
            pairs += seen.min(len) as f64;
        }
    }
    pairs * c.heads as f64
}

/// The error of `out` on batch item 0's first key/value group, against f64 (BHND: that group
/// is a prefix of q, k, v and the output).
fn error(c: &SdpaConfig, q: &[f32], k: &[f32], v: &[f32], lens: Option<&[i32]>, out: &[f32]) -> f64 {
    let group = c.heads / c.kv_heads;
    let sub = SdpaConfig { batch: 1, heads: group, kv_heads: 1, ..*c };
    let want = reference_f64(
        &sub,
        &q[..sub.q_len()],
        &k[..sub.kv_len()],
        &v[..sub.kv_len()],
        Extras { key_lengths: lens.map(|l| &l[..1]), ..Extras::default() },
    );
    uopc::kernels::reference::max_abs_err(&out[..sub.q_len()], &want)
}

/// q, k, v and the output of one cell in its element type.
#[derive(Clone)]
enum Operands {
    F32([Vec<f32>; 4]),
    BF16([Vec<bf16>; 4]),
    F16([Vec<f16>; 4]),
}

impl Operands {
    /// `q, k, v` rounded to `dtype`, and a zero output of `out_len`.
    fn new(dtype: SdpaDType, q: &[f32], k: &[f32], v: &[f32], out_len: usize) -> Operands {
        fn all<T: Copy>(f: impl Fn(f32) -> T, q: &[f32], k: &[f32], v: &[f32], n: usize) -> [Vec<T>; 4] {
            let conv = |x: &[f32]| x.iter().map(|&x| f(x)).collect::<Vec<T>>();
            [conv(q), conv(k), conv(v), vec![f(0.0); n]]
        }
        match dtype {
            SdpaDType::F32 => Operands::F32(all(|x| x, q, k, v, out_len)),
            SdpaDType::BF16 => Operands::BF16(all(bf16::from_f32, q, k, v, out_len)),
            SdpaDType::F16 => Operands::F16(all(f16::from_f32, q, k, v, out_len)),
        }
    }

    fn run(&mut self, sdpa: &Sdpa, extras: Extras<'_>) -> Result<(), String> {
        let r = match self {
            Operands::F32([q, k, v, o]) => sdpa.run(q, k, v, extras, o),
            Operands::BF16([q, k, v, o]) => {
                sdpa.run_values(Values::BF16(q), Values::BF16(k), Values::BF16(v), extras, ValuesMut::BF16(o))
            }
            Operands::F16([q, k, v, o]) => {
                sdpa.run_values(Values::F16(q), Values::F16(k), Values::F16(v), extras, ValuesMut::F16(o))
            }
        };
        r.map_err(|e| e.to_string())
    }

    /// Operand `i` (0 = q, 1 = k, 2 = v, 3 = the output), widened exactly to f32.
    fn widened(&self, i: usize) -> Vec<f32> {
        match self {
            Operands::F32(x) => x[i].clone(),
            Operands::BF16(x) => x[i].iter().map(|h| h.to_f32()).collect(),
            Operands::F16(x) => x[i].iter().map(|h| h.to_f32()).collect(),
        }
    }
}

struct Prepared {
    cell: Cell,
    /// The per-task-packing twin of the library's choice (`--compare-per-task-packing`).
    per_task_twin: bool,
    config: SdpaConfig,
    sdpa: Sdpa,
    compile_ms: f64,
    operands: Operands,
    times: Vec<f64>,
}

/// The cells of `cells` that are timed together (see [`time_interleaved`]): those of one
/// shape, key lengths and dtype (`key` gives them), e.g. a causal cell and its unmasked form,
/// or a cell and its per-task-packing twin; groups in order of first appearance.
fn groups_of<P, K: PartialEq>(cells: &[P], key: impl Fn(&P) -> K) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, c) in cells.iter().enumerate() {
        match groups.iter_mut().find(|g| key(&cells[g[0]]) == key(c)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// `rounds` rounds over `groups` of `cells`, interleaved so load changes hit every cell alike:
/// per group one untimed run of each cell (pages touched, caches and branch predictors warm),
/// then `reps` steps, each one timed run of every cell of the group in turn (in alternating
/// order), so the cells of a group meet the same load run by run; each run's milliseconds go
/// to its cell's times (`parts` gives its cell and times). An error of a run is printed with
/// the cell's shape.
fn time_interleaved<P>(
    cells: &mut [P],
    groups: &[Vec<usize>],
    rounds: usize,
    reps: usize,
    parts: impl Fn(&mut P) -> (&Cell, &mut Vec<f64>),
    mut run: impl FnMut(&mut P) -> Result<(), String>,
) -> Result<(), ExitCode> {
    for _ in 0..rounds {
        for group in groups {
            for &i in group {
                if let Err(e) = run(&mut cells[i]) {
                    eprintln!("error: {:?}: {e}", parts(&mut cells[i]).0.shape);
                    return Err(ExitCode::FAILURE);
                }
            }
            for rep in 0..reps {
                let mut order = group.clone();
                if rep % 2 == 1 {
                    order.reverse();
                }
                for i in order {
                    let start = Instant::now();
                    let _ = run(&mut cells[i]);
                    parts(&mut cells[i]).1.push(start.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
    }
    Ok(())
}

/// KV capacity of the growing-cache decode run.
pub const DECODE_CAPACITY: usize = 4096;

/// The growing-cache decode run: `steps` decode steps of (1, 32, 8, 1, L, 128) at
/// L = 1, 2, ..., `steps`, each through [`uopc::kernels::sdpa::attention`] on one
/// configuration of capacity [`DECODE_CAPACITY`] with a runtime KV length.
#[derive(Serialize)]
struct DecodeSteps {
    steps: usize,
    capacity: usize,
    compiles: usize,
    median_step_ms: f64,
    last_step_ms: f64,
}

fn decode_steps(steps: usize) -> Result<DecodeSteps, uopc::kernels::sdpa::SdpaError> {
    let config = SdpaConfig {
        kv_heads: 8,
        runtime_kv_length: true,
        ..SdpaConfig::new(1, 32, 1, DECODE_CAPACITY, 128)
    };
    let mut rng = StdRng::seed_from_u64(0xdec0de);
    let mut fill = |n: usize| (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>();
    let (q, k, v) = (fill(config.q_len()), fill(config.kv_len()), fill(config.kv_len()));
    let mut out = vec![0.0; config.q_len()];
    let before = uopc::kernels::sdpa::compile_count();
    let mut times = Vec::with_capacity(steps);
    for len in 1..=steps {
        let start = Instant::now();
        uopc::kernels::sdpa::attention(
            &config,
            &q,
            &k,
            &v,
            Extras { kv_length: Some(len), ..Extras::default() },
            &mut out,
        )?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let compiles = uopc::kernels::sdpa::compile_count() - before;
    let last_step_ms = times.last().copied().unwrap_or(0.0);
    Ok(DecodeSteps {
        steps,
        capacity: DECODE_CAPACITY,
        compiles,
        median_step_ms: crate::stats::median(&times),
        last_step_ms,
    })
}

/// Each cell in each of `dtypes`, with its inputs (the same values rounded to each dtype) and
/// its compiled attention; with `per_task_packing`, a twin that packs per task before each cell
/// whose K and V the library packs once. A compile error is printed and ends the bench.
fn prepare(cells: &[Cell], dtypes: &[SdpaDType], per_task_packing: bool) -> Result<Vec<Prepared>, ExitCode> {
    let mut prepared = Vec::new();
    for (cell, &dtype) in cells.iter().flat_map(|c| dtypes.iter().map(move |d| (c, d))) {
        let config = SdpaConfig { dtype, ..config(cell) };
        let mut rng = StdRng::seed_from_u64(
            0x5d9a ^ cell.shape.iter().fold(0u64, |h, &x| h.wrapping_mul(31) ^ x as u64),
        );
        let mut fill = |n: usize, s: f32| (0..n).map(|_| rng.random_range(-s..s)).collect::<Vec<f32>>();
        let (q, k, v) = (fill(config.q_len(), 2.0), fill(config.kv_len(), 2.0), fill(config.kv_len(), 1.0));
        let operands = Operands::new(dtype, &q, &k, &v, config.q_len());
        drop((q, k, v));
        let start = Instant::now();
        let sdpa = match Sdpa::compile(&config) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {:?}: {e}", cell.shape);
                return Err(ExitCode::FAILURE);
            }
        };
        let compile_ms = start.elapsed().as_secs_f64() * 1e3;
        let blocking = sdpa.blocking();
        if per_task_packing && blocking.kv_panel_width > 0 {
            let unpacked = Blocking { kv_panel_width: 0, ..blocking };
            match Sdpa::compile_with(&config, unpacked) {
                Ok(other) => prepared.push(Prepared {
                    cell: cell.clone(),
                    per_task_twin: true,
                    config,
                    sdpa: other,
                    compile_ms,
                    operands: operands.clone(),
                    times: Vec::new(),
                }),
                Err(e) => {
                    eprintln!("error: {:?}: {e}", cell.shape);
                    return Err(ExitCode::FAILURE);
                }
            }
        }
        prepared.push(Prepared {
            cell: cell.clone(),
            per_task_twin: false,
            config,
            sdpa,
            compile_ms,
            operands,
            times: Vec::new(),
        });
    }
    Ok(prepared)
}

/// Each causal cell's time against its unmasked form, and each 16-bit cell's speed against
/// its f32 form (f32 time over its time), from the runs [`time_interleaved`] timed together in
/// one group; `None` where the run lacks the other form.
#[allow(clippy::type_complexity)] // one list per ratio, in the cells' order
fn paired_ratios(
    prepared: &[Prepared],
    groups: &[Vec<usize>],
) -> (Vec<Option<PairedRatio>>, Vec<Option<PairedRatio>>) {
    let mut causal_ratios = vec![None; prepared.len()];
    let mut half_ratios = vec![None; prepared.len()];
    for group in groups {
        let chosen = |causal: bool, dtype: SdpaDType| {
            group.iter().copied().find(|&i| {
                let p = &prepared[i];
                p.cell.causal == causal && p.config.dtype == dtype && !p.per_task_twin
            })
        };
        for &i in group {
            let p = &prepared[i];
            if p.per_task_twin {
                continue;
            }
            if p.cell.causal
                && let Some(n) = chosen(false, p.config.dtype)
            {
                causal_ratios[i] = PairedRatio::of(&p.times, &prepared[n].times);
            }
            if p.config.dtype != SdpaDType::F32
                && let Some(f) = chosen(p.cell.causal, SdpaDType::F32)
            {
                half_ratios[i] = PairedRatio::of(&prepared[f].times, &p.times);
            }
        }
    }
    (causal_ratios, half_ratios)
}

/// The kernel column: the blocks, split-K, and how K and V come packed once per run.
fn kernel_label(b: &Blocking, config: &SdpaConfig) -> String {
    let mut kernel = format!("flash_tile_ops {}x{}x{}", b.heads_per_task, b.queries, b.keys);
    if b.splits > 1 {
        kernel += &format!(" split-K {}", b.splits);
    }
    if b.pair_panels(config) {
        kernel += &format!(" kv-pair-panels {}", b.kv_panel_width);
    } else if b.kv_panel_width > 0 {
        kernel += &format!(" kv-panels {}", b.kv_panel_width);
    }
    kernel
}

/// Runs the bench: each cell in each of `dtypes` (the same inputs rounded to each), `reps`
/// timed runs per cell per round, a shape's dtypes and causal forms timed run by run in turn
/// (so each 16-bit cell's speed against f32, and each causal cell's time against its unmasked
/// form, are medians of paired runs); then `steps` decode steps of a growing KV cache (none
/// when 0).
///
/// With `per_task_packing`, every cell whose K and V the library packs once per run also runs
/// (interleaved, as its own row) with the same blocks but each task packing its own K and V
/// blocks, for an A/B of that choice in one run.
pub fn run(
    cells: &[Cell],
    dtypes: &[SdpaDType],
    reps: usize,
    rounds: usize,
    steps: usize,
    per_task_packing: bool,
    json: Option<&std::path::Path>,
) -> ExitCode {
    let peak = crate::attention::measure_widest_peak();
    // 256 MiB: past every cache, like the long key caches of the decode cells.
    let stream = uopc::kernels::bandwidth::streaming_read_gbs(256, rayon::current_num_threads(), 5);
    let mut prepared = match prepare(cells, dtypes, per_task_packing) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let step = |p: &mut Prepared| {
        let extras = Extras { key_lengths: p.cell.key_lengths.as_deref(), ..Extras::default() };
        p.operands.run(&p.sdpa, extras)
    };
    // A shape's dtypes and causal forms in one group, so each pair is timed run by run.
    let groups = groups_of(&prepared, |p| (p.cell.shape, p.cell.key_lengths.clone()));
    if let Err(code) =
        time_interleaved(&mut prepared, &groups, rounds, reps, |p| (&p.cell, &mut p.times), step)
    {
        return code;
    }
    let (causal_ratios, half_ratios) = paired_ratios(&prepared, &groups);
    let mut rows = Vec::new();
    // With 16-bit cells the table says which peak its percentages are of, and gets a dtype
    // column; an f32-only run prints the table as it always has.
    let half_cells = dtypes.iter().any(|&d| d != SdpaDType::F32);
    if half_cells {
        println!(
            "%peak is of the widest f32 FMA peak for every dtype: the 16-bit GEMMs run on {} here, and no \
             16-bit (AMX) peak is measured",
            uopc_tile::Bf16Path::detect()
        );
    }
    println!(
        "{}{:<28} {:>6} {:>9} {:>9} {:>8} {:>6} {:>8} {:>9} {:>8}  kernel",
        if half_cells { "dtype " } else { "" },
        "B,H,HKV,NQ,NK,D",
        "causal",
        "median ms",
        "best ms",
        "GFLOP/s",
        "%peak",
        "%stream",
        "max err",
        "compile"
    );
    let mut ratio_lines = Vec::new();
    let mut half_lines = Vec::new();
    for ((p, causal_ratio), half_ratio) in prepared.into_iter().zip(causal_ratios).zip(half_ratios) {
        let median = crate::stats::median(&p.times);
        let best = p.times.iter().copied().fold(f64::INFINITY, f64::min);
        let lens = p.cell.key_lengths.as_deref();
        let gflops = 4.0 * p.config.d as f64 * useful_pairs(&p.config, lens) / (median * 1e-3) / 1e9;
        let pct = peak.map_or(f64::NAN, |(_, g)| 100.0 * gflops / g);
        // Against the f64 attention of the inputs as the kernel got them (rounded to its dtype).
        let o = &p.operands;
        let err = error(&p.config, &o.widened(0), &o.widened(1), &o.widened(2), lens, &o.widened(3));
        let kernel = kernel_label(&p.sdpa.blocking(), &p.config);
        let c = &p.config;
        let decode = c.n_q * (c.heads / c.kv_heads) <= 16;
        let element_bytes = if c.dtype == SdpaDType::F32 { 4 } else { 2 };
        let kv_gbs = decode.then(|| (2 * c.kv_len() * element_bytes) as f64 / (median * 1e-3) / 1e9);
        let percent_of_stream = kv_gbs.map(|g| 100.0 * g / stream);
        let shape = p.cell.shape.map(|x| x.to_string()).join(",");
        let shape = if lens.is_some() { format!("{shape} len") } else { shape };
        let stream_col = percent_of_stream.map_or("-".to_string(), |x| format!("{x:.0}%"));
        let dtype_col = if half_cells { format!("{:<6}", c.dtype) } else { String::new() };
        println!(
            "{dtype_col}{shape:<28} {:>6} {median:>9.3} {:>9.3} {gflops:>8.1} {pct:>6.1} {stream_col:>8} {err:>9.1e} {:>6.1}ms  {kernel}",
            p.cell.causal, best, p.compile_ms
        );
        let [batch, heads, kv_heads, n_q, n_k, d] = p.cell.shape;
        rows.push(Row {
            batch,
            heads,
            kv_heads,
            n_q,
            n_k,
            d,
            causal: p.cell.causal,
            key_lengths: p.cell.key_lengths.clone(),
            dtype: c.dtype.name(),
            pass: "forward",
            kernel,
            median_ms: median,
            best_ms: best,
            gflops,
            percent_of_widest_peak: pct,
            max_abs_err: err,
            compile_ms: p.compile_ms,
            kv_gbs,
            percent_of_stream,
            temporary_bytes: None,
            causal_over_non_causal: causal_ratio,
            speed_vs_f32_paired: half_ratio,
        });
        if let Some(r) = half_ratio {
            let form = if p.cell.causal { "causal" } else { "" };
            half_lines.push(format!(
                "{:<6}{shape:<28} {form:<6} {:.3} ({:.3}-{:.3}, {} pairs)",
                c.dtype, r.median, r.min, r.max, r.pairs
            ));
        }
        if let Some(r) = causal_ratio {
            ratio_lines
                .push(format!("{shape:<28} {:.3} ({:.3}-{:.3}, {} pairs)", r.median, r.min, r.max, r.pairs));
        }
    }
    if !ratio_lines.is_empty() {
        println!("causal / non-causal time, paired run by run: median (min-max)");
        for line in ratio_lines {
            println!("{line}");
        }
    }
    if !half_lines.is_empty() {
        println!("16-bit speed against f32 (f32 time / its time), paired run by run: median (min-max)");
        for line in half_lines {
            println!("{line}");
        }
    }
    finish(peak, Some(stream), steps, rows, json)
}

/// Prints the peak line and writes the JSON report, if asked for.
fn finish(
    peak: Option<(&'static str, f64)>,
    stream: Option<f64>,
    steps: usize,
    rows: Vec<Row>,
    json: Option<&std::path::Path>,
) -> ExitCode {
    if let Some((name, g)) = peak {
        println!("widest FMA peak ({name}): {g:.1} GFLOP/s on {} threads", rayon::current_num_threads());
    }
    if let Some(stream) = stream {
        println!("streaming read (256 MiB): {stream:.1} GB/s on {} threads", rayon::current_num_threads());
    }
    let decode = if steps > 0 {
        match decode_steps(steps) {
            Ok(d) => {
                println!(
                    "{} decode steps of (1,32,8,1,L,128), L = 1..={} in a cache of {}: {} compile(s), median step {:.3} ms, last {:.3} ms",
                    d.steps, d.steps, d.capacity, d.compiles, d.median_step_ms, d.last_step_ms
                );
                Some(d)
            }
            Err(e) => {
                eprintln!("error: decode steps: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    if let Some(path) = json {
        let report = Report {
            widest_peak: peak,
            streaming_read_gbs: stream,
            decode_steps: decode,
            threads: rayon::current_num_threads(),
            results: rows,
        };
        match serde_json::to_string_pretty(
            &serde_json::json!({ "machine": crate::machine_record(), "report": report }),
        ) {
            Ok(s) => {
                if let Err(e) = std::fs::write(path, s) {
                    eprintln!("error: writing {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
