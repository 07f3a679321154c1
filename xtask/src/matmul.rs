//! `bench matmul`: `Tensor::matmul` through the whole Tensor path (plan cache, kernels, output
//! allocation), in the three orientations a linear layer and its gradient produce, on f32,
//! bf16 or f16 tensors.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use crate::stats::median;
use uopc::tensor::{Experiments, RealizeOptions, Tensor, realize};

/// Which operand is stored transposed: `x @ W` (forward), `dy @ W^T` (input gradient) and
/// `x^T @ dy` (weight gradient).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// `A @ B` with both operands row-major.
    Ab,
    /// `A @ B^T`, B stored row-major as (N, K).
    ABt,
    /// `A^T @ B`, A stored row-major as (K, M).
    AtB,
}

/// The element type of both operands and the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// f32 tensors (the f32 tile GEMM).
    F32,
    /// bf16 tensors: the bf16 tile GEMM, f32 sums, the product rounded to bf16.
    Bf16,
    /// f16 tensors: the f16 GEMM (widened to f32), the product rounded to f16.
    F16,
}

impl Dtype {
    /// `x` rounded to this type, as f32.
    fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            Dtype::Bf16 => half::bf16::from_f32(x).to_f32(),
            Dtype::F16 => half::f16::from_f32(x).to_f32(),
        }
    }

    /// A tensor of this type holding `x` (already rounded to it, so exactly).
    fn tensor(self, x: Vec<f32>, shape: &[usize]) -> Tensor {
        match self {
            Dtype::F32 => Tensor::from_vec(x, shape),
            Dtype::Bf16 => Tensor::from_vec(x.into_iter().map(half::bf16::from_f32).collect(), shape),
            Dtype::F16 => Tensor::from_vec(x.into_iter().map(half::f16::from_f32).collect(), shape),
        }
    }
}

/// Parses `M,K,N`.
pub fn parse_shape(s: &str) -> Result<[usize; 3], String> {
    crate::stats::parse_dims(s, "M,K,N")
}

/// The default shapes: a GPT-2-small MLP's first layer on 128 and 2048 tokens, and its second.
pub fn default_shapes() -> Vec<[usize; 3]> {
    vec![[128, 768, 3072], [2048, 768, 3072], [2048, 3072, 768]]
}

#[derive(Serialize)]
struct Row {
    m: usize,
    k: usize,
    n: usize,
    form: Form,
    dtype: Dtype,
    median_ms: f64,
    best_ms: f64,
    gflops: f64,
    kernels: usize,
    tile_gemm_kernels: usize,
    max_abs_err: f64,
    compile_ms: f64,
    /// Timed with `Experiments::unfused_gemm_epilogues` (the rounding cast of a 16-bit product
    /// as a kernel of its own).
    unfused_epilogues: bool,
}

#[derive(Clone)]
struct Cell {
    shape: [usize; 3],
    form: Form,
    dtype: Dtype,
    c: Tensor,
    reference: Vec<f64>,
    samples: Vec<f64>,
    kernels: usize,
    tile_gemm_kernels: usize,
    compile_ms: f64,
    max_abs_err: f64,
    unfused_epilogues: bool,
}

/// `len` values uniform in [-1, 1).
pub(crate) fn random(len: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// `C = A B` in f64 from row-major `a` (M, K) and `b` (K, N).
fn reference(a: &[f32], b: &[f32], [m, k, n]: [usize; 3]) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p] as f64;
            for (j, out) in c[i * n..(i + 1) * n].iter_mut().enumerate() {
                *out += x * b[p * n + j] as f64;
            }
        }
    }
    c
}

fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

fn cell(shape: [usize; 3], form: Form, dtype: Dtype, rng: &mut StdRng) -> Cell {
    let [m, k, n] = shape;
    // The inputs are rounded to the dtype first, so the reference is the exact product of the
    // values the GEMM sees; its error is then only the f32 sums and the final rounding.
    let mut values = |len| random(len, rng).into_iter().map(|x| dtype.round(x)).collect::<Vec<_>>();
    let (a, b) = (values(m * k), values(k * n));
    let reference = reference(&a, &b, shape);
    let t = |x, shape: &[usize]| dtype.tensor(x, shape);
    let c = match form {
        Form::Ab => t(a, &[m, k]).matmul(&t(b, &[k, n])),
        Form::ABt => t(a, &[m, k]).matmul(&t(transpose(&b, k, n), &[n, k]).t()),
        Form::AtB => t(transpose(&a, m, k), &[k, m]).t().matmul(&t(b, &[k, n])),
    };
    Cell {
        shape,
        form,
        dtype,
        c,
        reference,
        samples: Vec::new(),
        kernels: 0,
        tile_gemm_kernels: 0,
        compile_ms: 0.0,
        max_abs_err: 0.0,
        unfused_epilogues: false,
    }
}

/// Runs `bench matmul`: every (shape, form, dtype) cell once to compile and check against
/// f64, then `rounds` interleaved rounds of `reps` timed realizes each; with
/// `compare_unfused_epilogues`, every cell also with its GEMM epilogue unfused, in the same
/// rounds.
pub fn run(
    shapes: &[[usize; 3]],
    forms: &[Form],
    dtypes: &[Dtype],
    reps: usize,
    rounds: usize,
    compare_unfused_epilogues: bool,
    json: Option<&Path>,
) -> ExitCode {
    let mut rng = StdRng::seed_from_u64(7);
    let mut cells: Vec<Cell> = shapes
        .iter()
        .flat_map(|&s| forms.iter().flat_map(move |&f| dtypes.iter().map(move |&d| (s, f, d))))
        .map(|(s, f, d)| cell(s, f, d, &mut rng))
        .collect();
    if compare_unfused_epilogues {
        cells = cells.into_iter().flat_map(|c| [c.clone(), Cell { unfused_epilogues: true, ..c }]).collect();
    }
    let fused = RealizeOptions::default();
    let unfused = RealizeOptions::default()
        .with_experiments(Experiments { unfused_gemm_epilogues: true, ..Experiments::default() });
    let opts_of = |c: &Cell| if c.unfused_epilogues { unfused.clone() } else { fused.clone() };
    for c in &mut cells {
        match realize(&[&c.c], &opts_of(c)) {
            Ok((out, report)) => {
                c.compile_ms = (report.schedule_seconds + report.compile_seconds) * 1e3;
                c.kernels = report.kernels.len();
                c.tile_gemm_kernels = report.kernels.iter().filter(|k| k.tile_ops).count();
                let got = match out[0].to_ndarray::<f32>() {
                    Ok(v) => v,
                    Err(e) => {
                        eprintln!("error: {:?}: {e}", c.shape);
                        return ExitCode::FAILURE;
                    }
                };
                c.max_abs_err =
                    got.iter().zip(&c.reference).map(|(&g, &r)| (g as f64 - r).abs()).fold(0.0, f64::max);
            }
            Err(e) => {
                eprintln!("error: {:?} {:?}: {e}", c.shape, c.form);
                return ExitCode::FAILURE;
            }
        }
    }
    for _ in 0..rounds {
        for c in &mut cells {
            let opts = opts_of(c);
            for _ in 0..reps {
                let start = Instant::now();
                let _ = realize(&[&c.c], &opts);
                c.samples.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    println!(
        "{:>5} {:>5} {:>5}  {:<5} {:<5} {:>10} {:>10} {:>8} {:>8} {:>10} {:>10}  epilogue",
        "M", "K", "N", "form", "dtype", "median ms", "best ms", "GFLOP/s", "kernels", "max err", "compile ms"
    );
    let mut rows = Vec::new();
    for c in &cells {
        let [m, k, n] = c.shape;
        let (med, best) = (median(&c.samples), c.samples.iter().copied().fold(f64::INFINITY, f64::min));
        let gflops = 2.0 * (m * k * n) as f64 / (med * 1e-3) / 1e9;
        let name = |v: serde_json::Result<serde_json::Value>| {
            v.ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
        };
        let (form, dtype) = (name(serde_json::to_value(c.form)), name(serde_json::to_value(c.dtype)));
        println!(
            "{m:>5} {k:>5} {n:>5}  {form:<5} {dtype:<5} {med:>10.3} {best:>10.3} {gflops:>8.1} {:>4} ({} tile) {:>10.1e} {:>10.1}  {}",
            c.kernels,
            c.tile_gemm_kernels,
            c.max_abs_err,
            c.compile_ms,
            if c.unfused_epilogues { "unfused" } else { "fused" }
        );
        rows.push(Row {
            m,
            k,
            n,
            form: c.form,
            dtype: c.dtype,
            median_ms: med,
            best_ms: best,
            gflops,
            kernels: c.kernels,
            tile_gemm_kernels: c.tile_gemm_kernels,
            max_abs_err: c.max_abs_err,
            compile_ms: c.compile_ms,
            unfused_epilogues: c.unfused_epilogues,
        });
    }
    crate::write_results(json, &rows)
}
