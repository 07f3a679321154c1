//! `cargo xtask bench flex`: attention with score and mask functions compiled in
//! (`Sdpa::compile_flex`), case by case, with the share of key blocks computed and the error
//! against the f64 reference on a sample of rows; each cell beside the plain causal kernel of
//! the same shape and the same cell on lazy tensors ([`graph`]), interleaved.

mod graph;

use crate::stats::{PairedRatio, median};
use graph::GraphArm;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;
use uopc::ir::{DType, UOp};
use uopc::kernels::sdpa::{
    AttentionMods, CaptureValues, Extras, FlexReference, ForwardSaved, Sdpa, SdpaBackward, SdpaConfig,
    SdpaError, and, eq, or, reference_flex_row,
};

/// The cases, by name.
pub const CASES: [&str; 7] =
    ["causal", "sliding_window", "document", "alibi", "softcap", "sinks", "prefix_lm"];

/// The softcap of the `softcap` case (Gemma 2's attention logit cap is 50; a smaller one
/// bends more scores).
const SOFTCAP: f32 = 20.0;
/// Keys every row sees at the start of the `prefix_lm` case.
const PREFIX: i64 = 256;
/// Document lengths of the `document` case, repeated over the sequence.
const DOCUMENTS: [usize; 5] = [64, 192, 512, 256, 1024];
/// Rows whose output is checked against the f64 reference.
const CHECKED_ROWS: usize = 24;

/// One cell: a case at a shape.
#[derive(Clone, Debug)]
pub struct FlexCell {
    pub case: String,
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub n: usize,
    pub d: usize,
    /// Whether the pass timed is the forward and backward (else the forward alone).
    pub backward: bool,
}

/// The captured values of a case and the document ids.
struct Data {
    slopes: Vec<f32>,
    sinks: Vec<f32>,
    docs: Vec<i32>,
}

impl Data {
    fn new(cell: &FlexCell) -> Data {
        let slopes = (0..cell.heads).map(|h| 0.5f32.powf(8.0 * (h + 1) as f32 / cell.heads as f32)).collect();
        let sinks = (0..cell.heads).map(|h| (h % 4) as f32 - 1.0).collect();
        let mut docs = Vec::with_capacity(cell.batch * cell.n);
        for _ in 0..cell.batch {
            let mut lengths = DOCUMENTS.iter().cycle();
            let (mut id, mut left) = (0, 0);
            for _ in 0..cell.n {
                if left == 0 {
                    id += 1;
                    left = *lengths.next().expect("a cycle");
                }
                left -= 1;
                docs.push(id);
            }
        }
        Data { slopes, sinks, docs }
    }

    fn captures(&self, case: &str) -> Vec<CaptureValues<'_>> {
        match case {
            "alibi" => vec![CaptureValues::F32(&self.slopes)],
            "sinks" => vec![CaptureValues::F32(&self.sinks)],
            "document" => vec![CaptureValues::I32(&self.docs)],
            _ => vec![],
        }
    }
}

/// `c * tanh(x / c)`.
fn softcap(x: &UOp, c: f32) -> UOp {
    uopc::kernels::sdpa::tanh(&(x * (1.0 / c))) * c
}

/// The mods of `cell`'s case (every case but `document` and `prefix_lm` is causal; the window
/// is `window` keys).
fn mods(cell: &FlexCell, window: i64) -> AttentionMods {
    fn causal(x: &uopc::kernels::sdpa::ScoreArgs<'_>) -> UOp {
        x.kv.lt(&x.q + 1)
    }
    let mut m = AttentionMods::new();
    match cell.case.as_str() {
        "causal" => m.mask(causal),
        "sliding_window" => m.mask(move |x| and(&causal(x), &(&x.q - &x.kv).lt(window))),
        "document" => {
            let ids = m.capture("doc_ids", &[cell.batch, cell.n], DType::I32);
            m.mask(move |x| {
                eq(&x.load(ids, &[x.b.clone(), x.q.clone()]), &x.load(ids, &[x.b.clone(), x.kv.clone()]))
            })
        }
        "alibi" => {
            let slopes = m.capture("slopes", &[cell.heads], DType::F32);
            m.score(move |x, s| s + x.load(slopes, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32))
                .mask(causal)
        }
        "softcap" => m.score(|_, s| softcap(s, SOFTCAP)).mask(causal),
        "sinks" => {
            let logits = m.capture("sinks", &[cell.heads], DType::F32);
            m.sinks(logits).mask(causal)
        }
        "prefix_lm" => m.mask(|x| or(&x.kv.lt(PREFIX), &causal(x))),
        other => unreachable!("case {other} is checked by the caller"),
    }
}

/// The largest error of `out` against the f64 reference over a spread of rows.
fn max_error(
    cell: &FlexCell,
    c: &SdpaConfig,
    (q, k, v): (&[f32], &[f32], &[f32]),
    out: &[f32],
    data: &Data,
    window: i64,
) -> f64 {
    let n = cell.n;
    let causal = |i: usize, j: usize| j <= i;
    let alibi = |s: f64, [_, h, i, j]: [usize; 4]| s + f64::from(data.slopes[h]) * (j as f64 - i as f64);
    let cap = |s: f64, _: [usize; 4]| f64::from(SOFTCAP) * (s / f64::from(SOFTCAP)).tanh();
    let causal_mask = |[_, _, i, j]: [usize; 4]| causal(i, j);
    let window_mask = |[_, _, i, j]: [usize; 4]| causal(i, j) && ((i - j) as i64) < window;
    let doc_mask = |[b, _, i, j]: [usize; 4]| data.docs[b * n + i] == data.docs[b * n + j];
    let prefix_mask = |[_, _, i, j]: [usize; 4]| (j as i64) < PREFIX || causal(i, j);
    let f = match cell.case.as_str() {
        "causal" => FlexReference { mask: Some(&causal_mask), ..FlexReference::default() },
        "sliding_window" => FlexReference { mask: Some(&window_mask), ..FlexReference::default() },
        "document" => FlexReference { mask: Some(&doc_mask), ..FlexReference::default() },
        "alibi" => {
            FlexReference { score: Some(&alibi), mask: Some(&causal_mask), ..FlexReference::default() }
        }
        "softcap" => {
            FlexReference { score: Some(&cap), mask: Some(&causal_mask), ..FlexReference::default() }
        }
        "sinks" => {
            FlexReference { mask: Some(&causal_mask), sinks: Some(&data.sinks), ..FlexReference::default() }
        }
        _ => FlexReference { mask: Some(&prefix_mask), ..FlexReference::default() },
    };
    let [qsb, qsh, qsn] = c.layout.strides(c.heads, c.n_q, c.d);
    let mut worst = 0.0f64;
    for r in 0..CHECKED_ROWS {
        let (b, h, i) = (r % c.batch, (r * 7) % c.heads, (r * 997 + n / 3) % n);
        let want = reference_flex_row(c, (q, k, v), Extras::default(), f, [b, h, i]);
        let got = &out[b * qsb + h * qsh + i * qsn..][..c.d];
        for (&g, &w) in got.iter().zip(&want) {
            worst = worst.max((f64::from(g) - w).abs());
        }
    }
    worst
}

/// The compiled kernels of one timed cell and the buffers their runs write.
enum Kernels {
    /// The flex forward and the plain causal forward of the same shape.
    Forward { flex: Box<Sdpa>, causal: Box<Sdpa> },
    /// The flex forward-with-lse and backward (with the float captures' gradients) and the
    /// plain causal ones of the same shape.
    Backward { flex: Box<SdpaBackward>, causal: Box<SdpaBackward>, grads: Grads },
}

/// What a forward and backward run writes besides the output.
struct Grads {
    lse: Vec<f32>,
    d_o: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    /// One per capture (empty for ids).
    dcaptures: Vec<Vec<f32>>,
}

struct Timed {
    cell: FlexCell,
    kernels: Kernels,
    data: Data,
    qkv: [Vec<f32>; 3],
    out: Vec<f32>,
    ms: Vec<f64>,
    causal_ms: Vec<f64>,
    /// The same cell on lazy tensors, and its times.
    graph: GraphArm,
    graph_ms: Vec<f64>,
}

impl Timed {
    fn new(cell: &FlexCell, window: i64) -> Result<Timed, SdpaError> {
        let c = SdpaConfig {
            kv_heads: cell.kv_heads,
            ..SdpaConfig::new(cell.batch, cell.heads, cell.n, cell.n, cell.d)
        };
        let causal = SdpaConfig { causal: true, ..c };
        let mods = mods(cell, window);
        let kernels = if cell.backward {
            let flex = SdpaBackward::compile_flex(&c, &mods)?;
            let dcaptures = mods
                .captures()
                .iter()
                .map(|spec| vec![0.0; if spec.dtype == DType::F32 { spec.len() } else { 0 }])
                .collect();
            let grads = Grads {
                lse: vec![0.0; flex.lse_len()],
                d_o: crate::masked::inputs(c.q_len(), 4, 1.0),
                dq: vec![0.0; c.q_len()],
                dk: vec![0.0; c.kv_len()],
                dv: vec![0.0; c.kv_len()],
                dcaptures,
            };
            Kernels::Backward {
                flex: Box::new(flex),
                causal: Box::new(SdpaBackward::compile(&causal)?),
                grads,
            }
        } else {
            Kernels::Forward {
                flex: Box::new(Sdpa::compile_flex(&c, &mods)?),
                causal: Box::new(Sdpa::compile(&causal)?),
            }
        };
        let values = |len: usize, seed: u64| crate::masked::inputs(len, seed, 1.0);
        let qkv = [values(c.q_len(), 1), values(c.kv_len(), 2), values(c.kv_len(), 3)];
        let data = Data::new(cell);
        let d_o = crate::masked::inputs(c.q_len(), 4, 1.0);
        let shape = [cell.batch, cell.heads, cell.kv_heads, cell.n, cell.d];
        let inputs = [&qkv[0][..], &qkv[1][..], &qkv[2][..], &d_o[..]];
        let graph = GraphArm::new(mods, inputs, shape, &data.captures(&cell.case), cell.backward);
        Ok(Timed {
            cell: cell.clone(),
            kernels,
            data,
            qkv,
            out: vec![0.0; c.q_len()],
            ms: vec![],
            causal_ms: vec![],
            graph,
            graph_ms: vec![],
        })
    }

    /// One run of the flex kernels (or with `plain` the causal ones), in milliseconds: the
    /// forward, or the forward with its lse and the backward with every float capture's
    /// gradient.
    fn run(&mut self, plain: bool) -> Result<f64, SdpaError> {
        let captures = self.data.captures(&self.cell.case);
        let flex_extras = Extras { captures: &captures, ..Extras::default() };
        let extras = if plain { Extras::default() } else { flex_extras };
        let [q, k, v] = &self.qkv;
        let start = Instant::now();
        match &mut self.kernels {
            Kernels::Forward { flex, causal } => {
                let s: &Sdpa = if plain { causal } else { flex };
                s.run(q, k, v, extras, &mut self.out)?;
            }
            Kernels::Backward { flex, causal, grads } => {
                let b: &SdpaBackward = if plain { causal } else { flex };
                b.forward(q, k, v, extras, &mut self.out, &mut grads.lse)?;
                let saved = ForwardSaved { q, k, v, o: &self.out, lse: &grads.lse };
                let targets = [&mut grads.dq[..], &mut grads.dk[..], &mut grads.dv[..]];
                if plain || captures.is_empty() {
                    let [dq, dk, dv] = targets;
                    b.run(saved, &grads.d_o, extras, dq, dk, dv)?;
                } else {
                    let mut dcaptures: Vec<&mut [f32]> =
                        grads.dcaptures.iter_mut().map(|g| &mut g[..]).collect();
                    b.run_with_capture_grads(saved, &grads.d_o, extras, targets, &mut dcaptures)?;
                }
            }
        }
        Ok(start.elapsed().as_secs_f64() * 1e3)
    }

    /// The flex kernels' description and share of blocks computed.
    fn describe(&self) -> (String, Option<f64>) {
        let captures = self.data.captures(&self.cell.case);
        let extras = Extras { captures: &captures, ..Extras::default() };
        match &self.kernels {
            Kernels::Forward { flex, .. } => (flex.to_string(), flex.blocks_computed(extras).ok().flatten()),
            Kernels::Backward { flex, .. } => (flex.to_string(), None),
        }
    }
}

/// Times every cell, interleaved over `rounds` rounds of `reps` runs, beside the plain causal
/// kernels of its shape; prints a table and writes `json` when given.
pub fn run(cells: &[FlexCell], window: i64, reps: usize, rounds: usize, json: Option<&Path>) -> ExitCode {
    let mut timed = Vec::new();
    for cell in cells {
        match Timed::new(cell, window) {
            Ok(t) => timed.push(t),
            Err(e) => {
                eprintln!("error: {cell:?}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    for _ in 0..rounds {
        for t in &mut timed {
            for plain in [false, true] {
                if let Err(e) = t.run(plain) {
                    eprintln!("error: {:?}: {e}", t.cell);
                    return ExitCode::FAILURE;
                }
            }
            if let Err(e) = t.graph.run() {
                eprintln!("error: {:?} on tensors: {e}", t.cell);
                return ExitCode::FAILURE;
            }
            for rep in 0..reps {
                for plain in if rep % 2 == 0 { [false, true] } else { [true, false] } {
                    let ms = t.run(plain).expect("ran before");
                    if plain { t.causal_ms.push(ms) } else { t.ms.push(ms) }
                }
                t.graph_ms.push(t.graph.run().expect("ran before"));
            }
        }
    }
    println!(
        "{:<15} {:<17} {:>18} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}",
        "case", "pass", "B,H,HKV,N,D", "median ms", "causal ms", "vs causal", "blocks", "max err", "graph ms"
    );
    let mut rows = Vec::new();
    for t in &mut timed {
        let _ = t.run(false);
        let [q, k, v] = &t.qkv;
        let config = match &t.kernels {
            Kernels::Forward { flex, .. } => *flex.config(),
            Kernels::Backward { flex, .. } => *flex.config(),
        };
        let err = max_error(&t.cell, &config, (q, k, v), &t.out, &t.data, window);
        let (ms, causal_ms, graph_ms) = (median(&t.ms), median(&t.causal_ms), median(&t.graph_ms));
        // Each rep times the case and the causal kernel back to back.
        let vs_causal = PairedRatio::of(&t.ms, &t.causal_ms).map_or(f64::NAN, |r| r.median);
        let (kernel, blocks) = t.describe();
        let FlexCell { case, batch, heads, kv_heads, n, d, backward } = &t.cell;
        let pass = if *backward { "forward_backward" } else { "forward" };
        println!(
            "{case:<15} {pass:<17} {:>18} {ms:>11.3} {causal_ms:>11.3} {:>9.3} {:>9} {err:>9.1e} {graph_ms:>9.3}",
            format!("{batch},{heads},{kv_heads},{n},{d}"),
            vs_causal,
            blocks.map_or("-".to_string(), |b| format!("{:.1}%", b * 100.0)),
        );
        rows.push(serde_json::json!({
            "case": case, "batch": batch, "heads": heads, "kv_heads": kv_heads, "n": n, "d": d,
            "pass": pass, "median_ms": ms, "ms": t.ms, "causal_kernel_median_ms": causal_ms,
            "vs_causal_paired_median": vs_causal,
            "max_abs_err": err, "max_abs_err_of": "the forward output, on sampled rows",
            "blocks_computed": blocks, "window": window, "kernel": kernel,
            "tensor_graph_median_ms": graph_ms, "tensor_graph_ms": t.graph_ms,
            "tensor_graph_is": "q.sdpa(&k, &v).mods(..) built and realized per run (with the gradients of q, k, v \
                                and the float captures for forward_backward)",
        }));
    }
    crate::write_results(json, &rows)
}

/// Whether each `--pass` of `bench flex` times the backward too (default: both passes), or the
/// first name that is not a pass.
pub fn passes(passes: &[String]) -> Result<Vec<bool>, String> {
    if passes.is_empty() {
        return Ok(vec![false, true]);
    }
    passes
        .iter()
        .map(|p| match p.as_str() {
            "forward" => Ok(false),
            "forward_backward" => Ok(true),
            other => Err(other.to_string()),
        })
        .collect()
}

/// The cells of `bench flex`: every case by every shape (heads paired with kv-heads), or
/// `None` after printing what is wrong.
pub fn cells(
    mut cases: Vec<String>,
    ns: Vec<usize>,
    ds: Vec<usize>,
    heads: Vec<usize>,
    kv_heads: Vec<usize>,
    batch: usize,
) -> Option<Vec<FlexCell>> {
    if cases.is_empty() {
        cases = CASES.iter().map(|c| c.to_string()).collect();
    }
    if let Some(bad) = cases.iter().find(|c| !CASES.contains(&c.as_str())) {
        eprintln!("error: --case {bad}: not one of {}", CASES.join(", "));
        return None;
    }
    let shapes: Vec<(usize, usize, usize, usize)> = if ns.is_empty() && ds.is_empty() && heads.is_empty() {
        vec![(8, 8, 2048, 64), (32, 8, 4096, 128)]
    } else {
        let heads = if heads.is_empty() { vec![8] } else { heads };
        let pairs: Vec<(usize, usize)> =
            heads.iter().enumerate().map(|(i, &h)| (h, kv_heads.get(i).copied().unwrap_or(h))).collect();
        let (ns, ds) =
            (if ns.is_empty() { vec![2048] } else { ns }, if ds.is_empty() { vec![64] } else { ds });
        pairs
            .iter()
            .flat_map(|&(h, kv)| {
                ns.iter().flat_map(|&n| ds.iter().map(move |&d| (h, kv, n, d))).collect::<Vec<_>>()
            })
            .collect()
    };
    if let Some(&(h, kv, n, d)) =
        shapes.iter().find(|&&(h, kv, n, d)| [h, kv, n, d, batch].contains(&0) || !h.is_multiple_of(kv))
    {
        eprintln!(
            "error: heads {h}, kv-heads {kv}, n {n}, d {d}, batch {batch}: sizes must be positive and heads a multiple of kv-heads"
        );
        return None;
    }
    Some(
        cases
            .iter()
            .flat_map(|case| {
                shapes.iter().map(move |&(heads, kv_heads, n, d)| FlexCell {
                    case: case.clone(),
                    batch,
                    heads,
                    kv_heads,
                    n,
                    d,
                    backward: false,
                })
            })
            .collect(),
    )
}
