//! The reference semantics of tile ops in the interpreter: plain loops over the operand blocks,
//! every element read and written through the machine's checked accesses.

use super::{InterpError, Machine, Mem, Precision, Val, malformed};
use crate::dtype::DType;
use crate::uop::{GemmShape, TileOp, UOp};

impl Machine<'_> {
    /// Reads an f32 element as f64 (bounds- and initialization-checked).
    fn get(&self, node: &UOp, (mem, start): (Mem, i64), offset: usize) -> Result<f64, InterpError> {
        match self.load(node, mem, start + offset as i64)? {
            Val::F32(x) => Ok(x as f64),
            Val::F64(x) => Ok(x),
            v => Err(malformed(node, format!("tile operand holds {v:?}, not a float"))),
        }
    }

    /// Writes an f32 element (rounded in native precision).
    fn put(
        &mut self,
        node: &UOp,
        (mem, start): (Mem, i64),
        offset: usize,
        x: f64,
    ) -> Result<(), InterpError> {
        let v = if self.precision == Precision::F64 { Val::F64(x) } else { Val::F32(x as f32) };
        self.store(node, mem, start + offset as i64, v)
    }

    /// `X = f(X)` per element of the `rows x cols` block at `x` (row stride `ld`).
    fn map_block(
        &mut self,
        node: &UOp,
        x: (Mem, i64),
        (rows, cols, ld): (usize, usize, usize),
        f: impl Fn(f64) -> f64,
    ) -> Result<(), InterpError> {
        for r in 0..if cols == 0 { 0 } else { rows } {
            for j in 0..cols {
                let v = self.get(node, x, r * ld + j)?;
                self.put(node, x, r * ld + j, f(v))?;
            }
        }
        Ok(())
    }

    /// [`TileOp::ScoreRamp`] in f64: `X = scale X + c (origin + j - r)` with `c = slope_scale
    /// slope`, the slope and origin read once (not at all for an empty block).
    fn score_ramp(
        &mut self,
        node: &UOp,
        at: &[(Mem, i64)],
        (rows, cols, ld): (usize, usize, usize),
        scale: f32,
        slope_scale: f32,
    ) -> Result<(), InterpError> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let c = self.get(node, at[1], 0)? * f64::from(slope_scale);
        let origin = self.get(node, at[2], 0)?;
        for r in 0..rows {
            for j in 0..cols {
                let x = self.get(node, at[0], r * ld + j)?;
                let position = origin + (j as f64 - r as f64);
                self.put(node, at[0], r * ld + j, x * f64::from(scale) + c * position)?;
            }
        }
        Ok(())
    }

    /// The reference semantics of a tile op: plain loops, every access checked.
    pub(super) fn tile(&mut self, node: &UOp, t: TileOp, at: &[(Mem, i64)]) -> Result<(), InterpError> {
        match t {
            TileOp::Gemm(g @ GemmShape { m, n, k, lda, ldc, a_trans, accumulate, .. }) => {
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = if accumulate { self.get(node, at[2], i * ldc + j)? } else { 0.0 };
                        for p in 0..k {
                            let a = self.get(node, at[0], if a_trans { p * lda + i } else { i * lda + p })?;
                            let b = self.get(node, at[1], g.b_index(p, j))?;
                            acc += a * b;
                        }
                        self.put(node, at[2], i * ldc + j, acc)?;
                    }
                }
            }
            TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo, scale } => {
                let scale = f64::from(f32::from_bits(scale));
                let shape = UpdateShape { rows, cols, lds, d, ldo, ldp: lds, scale, round_to: None };
                self.softmax_update(node, at, at[0], shape)?;
            }
            TileOp::SoftmaxUpdateRounded { rows, cols, lds, d, ldo, ldp, scale, round_to } => {
                let scale = f64::from(f32::from_bits(scale));
                let shape =
                    UpdateShape { rows, cols, lds, d, ldo, ldp, scale, round_to: Some(round_to.into()) };
                // P is stored rounded to `round_to` (in its own tile or over S), and summed as
                // stored.
                self.softmax_update(node, at, at[4], shape)?;
            }
            TileOp::SoftmaxRecompute { rows, cols, ld } => {
                // With no columns the op touches nothing, not even the per-row scalars.
                for r in 0..if cols == 0 { 0 } else { rows } {
                    let l = self.get(node, at[1], r)?;
                    for j in 0..cols {
                        let x = self.get(node, at[0], r * ld + j)?;
                        // A row that saw no key: P = 0 rather than exp2(-inf - -inf).
                        let p = if l == f64::NEG_INFINITY { 0.0 } else { (x - l).exp2() };
                        self.put(node, at[0], r * ld + j, p)?;
                    }
                }
            }
            TileOp::Convert { rows, cols, lds, ldd } => {
                // The store into D's storage rounds a value to a 16-bit D (in both precisions,
                // through f32 as a CAST rounds); widening is exact.
                for r in 0..rows {
                    for j in 0..cols {
                        let x = self.get(node, at[0], r * lds + j)?;
                        self.put(node, at[1], r * ldd + j, x)?;
                    }
                }
            }
            TileOp::SoftmaxGrad { rows, cols, ld } => {
                // With no columns the op touches nothing, not even the per-row scalars.
                for r in 0..if cols == 0 { 0 } else { rows } {
                    let dl = self.get(node, at[2], r)?;
                    for j in 0..cols {
                        let p = self.get(node, at[0], r * ld + j)?;
                        let g = self.get(node, at[1], r * ld + j)?;
                        // P == 0: a key outside the softmax, whose gradient is 0 whatever dP is.
                        self.put(node, at[1], r * ld + j, if p == 0.0 { 0.0 } else { p * (g - dl) })?;
                    }
                }
            }
            TileOp::Activation { rows, cols, ld, kind } => {
                self.map_block(node, at[0], (rows, cols, ld), |x| activation_f64(kind, x).0)?;
            }
            TileOp::Softcap { rows, cols, ld, inner, outer } => {
                let (inner, outer) = (f32::from_bits(inner), f32::from_bits(outer));
                self.map_block(node, at[0], (rows, cols, ld), |x| softcap_f64(x, inner, outer))?;
            }
            TileOp::ScoreRamp { rows, cols, ld, scale, slope_scale } => {
                let (scale, slope_scale) = (f32::from_bits(scale), f32::from_bits(slope_scale));
                self.score_ramp(node, at, (rows, cols, ld), scale, slope_scale)?;
            }
            TileOp::ActivationGrad { rows, cols, ldx, ldg, kind } => {
                for r in 0..if cols == 0 { 0 } else { rows } {
                    for j in 0..cols {
                        let x = self.get(node, at[0], r * ldx + j)?;
                        let g = self.get(node, at[1], r * ldg + j)?;
                        self.put(node, at[1], r * ldg + j, g * activation_f64(kind, x).1)?;
                    }
                }
            }
            TileOp::ExpRows { rows, cols, ldx, ldy, scale } => {
                let c = f64::from(f32::from_bits(scale));
                // With no columns the op touches nothing, not even the shifts.
                for r in 0..if cols == 0 { 0 } else { rows } {
                    let b = self.get(node, at[1], r)?;
                    for j in 0..cols {
                        let x = self.get(node, at[0], r * ldx + j)?;
                        self.put(node, at[2], r * ldy + j, (c * (x - b)).exp2())?;
                    }
                }
            }
            TileOp::MaxSumExp { rows, cols, ld, scale } => {
                let c = f64::from(f32::from_bits(scale));
                // With no columns the op touches nothing, not even the running state.
                for r in 0..if cols == 0 { 0 } else { rows } {
                    let (m, l) = (self.get(node, at[1], r)?, self.get(node, at[2], r)?);
                    let mut xs = Vec::with_capacity(cols);
                    for j in 0..cols {
                        xs.push(self.get(node, at[0], r * ld + j)?);
                    }
                    let m1 =
                        xs.iter().fold(m, |a, &x| if a.is_nan() || x.is_nan() { f64::NAN } else { a.max(x) });
                    // A row still at -inf keeps its sum (not exp2(-inf - -inf)); an unchanged
                    // maximum does not rescale (so +inf stays +inf without exp2(inf - inf)).
                    if m1 != f64::NEG_INFINITY {
                        let a = if m == m1 { 1.0 } else { (c * (m - m1)).exp2() };
                        let l1 = l * a + xs.iter().map(|&x| (c * (x - m1)).exp2()).sum::<f64>();
                        self.put(node, at[1], r, m1)?;
                        self.put(node, at[2], r, l1)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// One online-softmax step over `[S, row_max, row_sum, O]` at `at`, the scores scaled by
    /// `shape.scale` and P written at `p` (S itself, or a tile of the rounded dtype); with
    /// `shape.round_to`, each probability is rounded to it (from f64 through f32, as a store
    /// into a 16-bit buffer rounds) and the row sum adds P as stored, else as computed.
    fn softmax_update(
        &mut self,
        node: &UOp,
        at: &[(Mem, i64)],
        p: (Mem, i64),
        shape: UpdateShape,
    ) -> Result<(), InterpError> {
        let UpdateShape { rows, cols, lds, d, ldo, ldp, scale, round_to } = shape;
        let round = |x: f64| match round_to {
            Some(DType::BF16) => f64::from(half::bf16::from_f32(x as f32).to_f32()),
            Some(_) => f64::from(half::f16::from_f32(x as f32).to_f32()),
            None => x,
        };
        for r in 0..rows {
            let m_old = self.get(node, at[1], r)?;
            let mut m_new = m_old;
            for j in 0..cols {
                m_new = m_new.max(scale * self.get(node, at[0], r * lds + j)?);
            }
            // An all -inf row: P = 0, l and O unchanged.
            let dead = m_new == f64::NEG_INFINITY;
            let alpha = if dead { 1.0 } else { (m_old - m_new).exp2() };
            let mut sum = 0.0;
            for j in 0..cols {
                let x = scale * self.get(node, at[0], r * lds + j)?;
                let pj = round(if dead { 0.0 } else { (x - m_new).exp2() });
                self.put(node, p, r * ldp + j, pj)?;
                sum += if round_to.is_some() { self.get(node, p, r * ldp + j)? } else { pj };
            }
            let l = self.get(node, at[2], r)?;
            self.put(node, at[2], r, l * alpha + sum)?;
            for e in 0..d {
                let o = self.get(node, at[3], r * ldo + e)?;
                self.put(node, at[3], r * ldo + e, o * alpha)?;
            }
            self.put(node, at[1], r, m_new)?;
        }
        Ok(())
    }
}

/// The extents of one softmax step: rows, keys, the strides of S, O and P, the score scale,
/// and the 16-bit type P is rounded to (if any).
struct UpdateShape {
    rows: usize,
    cols: usize,
    lds: usize,
    d: usize,
    ldo: usize,
    ldp: usize,
    scale: f64,
    round_to: Option<DType>,
}

/// An activation of [`TileOp::Activation`] in f64 and its derivative (what
/// [`TileOp::ActivationGrad`] scales G by), the reference semantics the reference expansion
/// spells out op by op: `z` and `z'` from `x` (the kernels' f32 constants, widened),
/// `e = exp2(-|z| log2 e)` (`-|z|` as `z < 0 ? z : -z`), `r = 1 / (e + 1)`,
/// `s = z < 0 ? e r : r`; the value `x s` and the derivative `x (e r r) z' + s`.
pub(crate) fn activation_f64(kind: uopc_tile::Activation, x: f64) -> (f64, f64) {
    if kind == uopc_tile::Activation::Gelu {
        return normal_gated_f64(x);
    }
    let cubic = f64::from(uopc_tile::GELU_CUBIC);
    let twice = f64::from(uopc_tile::GELU_TWICE_SQRT_2_OVER_PI);
    let (z, dz) = match kind {
        uopc_tile::Activation::GeluTanh => {
            let square = x * x;
            ((x + square * x * cubic) * twice, (square * (3.0 * cubic) + 1.0) * twice)
        }
        _ => (x, 1.0),
    };
    let below = z < 0.0;
    let e = ((if below { z } else { -z }) * std::f64::consts::LOG2_E).exp2();
    let r = 1.0 / (e + 1.0);
    let er = e * r;
    let s = if below { er } else { r };
    (x * s, x * (er * r) * dz + s)
}

/// [`TileOp::Softcap`] of one element in f64, the reference semantics the reference expansion
/// spells out op by op: `y = inner x`, `e = exp2((y < 0 ? y : -y) 2 log2 e)` (the kernels'
/// f32 constant, widened), `t = (1 - e) (1 / (1 + e))`, then `(y < 0 ? -t : t) outer`.
pub(crate) fn softcap_f64(x: f64, inner: f32, outer: f32) -> f64 {
    let y = x * f64::from(inner);
    let below = y < 0.0;
    let e = ((if below { y } else { -y }) * f64::from(uopc_tile::SOFTCAP_TWO_LOG2_E)).exp2();
    let t = (1.0 - e) * (1.0 / (1.0 + e));
    (if below { -t } else { t }) * f64::from(outer)
}

/// Exact GELU of [`TileOp::Activation`] in f64 and its derivative, the kernels' formula with
/// their f32 constants widened, each operation rounded once in f64 (the reference expansion
/// spells out the same): `s = x c` (`c = 1/sqrt 2`), `m = s < 0 ? s : -s`, `q = s s`,
/// near zero `P(q) s + 1/2`, the lower tail `exp2(q (-log2 e) + Q(u))` with
/// `u = -12 (1 / (m - 2)) - 3`, 0 when `m + 4 < 0`; `far = x < 0 ? tail : 1 - tail`,
/// `Phi = m + 1 < 0 ? far : near`; the value `x Phi`, the derivative
/// `Phi + x exp2(q (-log2 e)) / sqrt(2 pi)`. Polynomials by Horner's rule, highest power first.
pub(crate) fn normal_gated_f64(x: f64) -> (f64, f64) {
    let horner = |c: &[f32], v: f64| {
        c.iter().rev().skip(1).fold(f64::from(c[c.len() - 1]), |p, &k| p * v + f64::from(k))
    };
    let minus_log2_e = -f64::from(std::f32::consts::LOG2_E);
    let s = x * f64::from(std::f32::consts::FRAC_1_SQRT_2);
    let m = if s < 0.0 { s } else { -s };
    let square = s * s;
    let near = horner(&uopc_tile::GELU_NEAR_ZERO, square) * s + 0.5;
    let u = -12.0 * (1.0 / (m - 2.0)) - 3.0;
    let tail = (square * minus_log2_e + horner(&uopc_tile::GELU_LOG2_TAIL, u)).exp2();
    let tail = if m + uopc_tile::ERF_SATURATION < 0.0 { 0.0 } else { tail };
    let far = if x < 0.0 { tail } else { 1.0 - tail };
    let cdf = if m + 1.0 < 0.0 { far } else { near };
    let density = (square * minus_log2_e).exp2() * f64::from(uopc_tile::GELU_DENSITY);
    (x * cdf, cdf + x * density)
}
