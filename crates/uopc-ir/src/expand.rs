//! The reference lowering of tile ops: each [`TileOp`] rewritten into plain loop IR (RANGE,
//! INDEX, LOAD, STORE, ALU, END) with the interpreter's semantics.
//!
//! The interpreter evaluates a tile op in f64 and rounds each result to f32 once when it is
//! written. The expansion does the same: operands (f32, or a GEMM's bf16 A and B) are loaded
//! and CAST to F64, accumulators are F64 ALLOCs, and only the value stored is CAST back to F32. So `interp::run` gives the same
//! bits for a program and its expansion, in both precisions. The JIT with strict options
//! (`JitOptions::scalar()`) does too: its F64 EXP2 is the same `f64::exp2`.
//!
//! Every load and store goes through the operand's own view (the INDEX's first source), so the
//! expansion keeps the ordering the tile op had: after the view's AFTER dependencies, after
//! loads of that view elsewhere (the linearizer orders loads of a view before stores through
//! it), and before every user, which now depends on the expansion's last END.
//!
//! Limitations:
//! - The softmax update's running max follows `f64::max` (NaNs give way to numbers), but where
//!   `+0.0` meets `-0.0` the interpreter's `f64::max` may return either zero; the expansion
//!   keeps the running max. The difference is the sign of a stored zero maximum.
//! - Two operands of one softmax update passed through the *same* view node make the
//!   linearizer order all loads of that view before all its stores within a row, which the two
//!   loops over S and O cannot both satisfy: the expanded program then fails to verify (an
//!   error, never a wrong result). Operands in one buffer through distinct views are fine.

use crate::builder::{alloc, const_of, idx, range, sink};
use crate::dtype::DType;
use crate::linearize::open_ranges_with;
use crate::rewrite::{Pass, Pattern, Revisit, Rule, RuleCx, RuleTable};
use crate::uop::{AxisType, GemmShape, Op, TileOp, UOp};
use std::collections::HashMap;
use std::sync::LazyLock;

/// Rewrites every tile op of `program` into an equivalent loop nest of ordinary ops.
///
/// New RANGE ids and ALLOC slots are above every id and slot the program uses. Each expansion
/// runs in the ranges its tile op ran in, reads and writes through the same views, and takes
/// the tile op's place for its users, so it keeps the tile op's ordering with other effects.
/// A program without tile ops comes back as the same node. A tile op the verifier would reject
/// (operands that are not INDEX nodes, a wrong arity) is left in place for it to report, as
/// is the whole program when one of its ENDs does not close a RANGE.
#[must_use]
pub fn expand_tile_ops(program: &UOp) -> UOp {
    let topo = UOp::toposort(std::slice::from_ref(program));
    if !topo.iter().any(|u| matches!(u.op(), Op::Tile(_))) {
        return program.clone();
    }
    // Lenient: the tile op also lives in the ranges of ENDs around it that it does not use
    // (simplified programs), and those scope its accumulators.
    let Ok(open_ranges) = open_ranges_with(&topo, true) else { return program.clone() };
    let mut fresh = Fresh { range_id: 0, alloc_slot: 0 };
    for u in &topo {
        match u.op() {
            Op::Range { id, .. } => fresh.range_id = fresh.range_id.max(id.index() + 1),
            Op::Alloc { slot, .. } => fresh.alloc_slot = fresh.alloc_slot.max(slot.index() + 1),
            _ => {}
        }
    }
    let mut state = Expansion { open_ranges, fresh };
    let mut memo = HashMap::with_capacity(topo.len());
    EXPAND.run(program, &mut state, &mut memo).0
}

/// What the expansion rule needs beside the node: the ranges each original node runs in, and
/// the next unused ids.
struct Expansion {
    open_ranges: HashMap<UOp, Vec<UOp>>,
    fresh: Fresh,
}

static TILE_OPS: LazyLock<RuleTable<Expansion>> = LazyLock::new(|| {
    let any_tile = Op::Tile(TileOp::SoftmaxUpdate { rows: 0, cols: 0, lds: 0, d: 0, ldo: 0, scale: 0 });
    RuleTable::new(
        "tile_ops",
        vec![Rule::with_cx("expand_tile_op", Pattern::ops(&[any_tile]), expand_tile_op)],
    )
});

/// One walk: each tile op is replaced once, and its expansion is final (it has no tile ops).
static EXPAND: LazyLock<Pass<'static, Expansion>> =
    LazyLock::new(|| Pass::new("expand_tile_ops", vec![&*TILE_OPS], Revisit::Never));

/// A well-formed tile op (its sources rewritten) becomes its loop nest.
fn expand_tile_op(u: &UOp, cx: &mut RuleCx<'_, Expansion>) -> Option<UOp> {
    let Op::Tile(t) = *u.op() else { return None };
    if !well_formed(t, u.src()) {
        return None;
    }
    // Range ends may depend on loads after tile ops, so the scope is rewritten too.
    let scope: Vec<UOp> = cx.state.open_ranges[cx.original()]
        .iter()
        .map(|r| cx.rewritten(r).expect("the ranges a tile op runs in are rewritten before it").clone())
        .collect();
    let ops = Operands { src: u.src(), scope, fresh: &mut cx.state.fresh };
    Some(match t {
        TileOp::Gemm(g) => ops.gemm(g),
        TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo, scale } => {
            ops.softmax(SoftmaxStep { rows, cols, lds, d, ldo, scale: f32::from_bits(scale), rounded: None })
        }
        TileOp::SoftmaxUpdateRounded { rows, cols, lds, d, ldo, ldp, scale, round_to } => {
            ops.softmax(SoftmaxStep {
                rows,
                cols,
                lds,
                d,
                ldo,
                scale: f32::from_bits(scale),
                rounded: Some((ldp, round_to.into())),
            })
        }
        TileOp::SoftmaxRecompute { rows, cols, ld } => ops.recompute(rows, cols, ld),
        TileOp::SoftmaxGrad { rows, cols, ld } => ops.grad(rows, cols, ld),
        TileOp::MaxSumExp { rows, cols, ld, scale } => ops.max_sum_exp(rows, cols, ld, f32::from_bits(scale)),
        TileOp::Convert { rows, cols, lds, ldd } => ops.convert(rows, cols, lds, ldd),
        TileOp::ExpRows { rows, cols, ldx, ldy, scale } => {
            ops.exp_rows(rows, cols, ldx, ldy, f32::from_bits(scale))
        }
        TileOp::Activation { rows, cols, ld, kind } => ops.activation(rows, cols, ld, None, kind),
        TileOp::ActivationGrad { rows, cols, ldx, ldg, kind } => {
            ops.activation(rows, cols, ldx, Some(ldg), kind)
        }
        TileOp::Softcap { rows, cols, ld, inner, outer } => {
            ops.softcap(rows, cols, ld, f32::from_bits(inner), f32::from_bits(outer))
        }
        TileOp::ScoreRamp { rows, cols, ld, scale, slope_scale } => {
            ops.score_ramp(rows, cols, ld, f32::from_bits(scale), f32::from_bits(slope_scale))
        }
    })
}

/// The fields of an online-softmax step, f32 or rounded: P is written over S unless
/// `rounded` gives the row stride of the fifth operand, P, and the dtype P's values are
/// rounded to.
struct SoftmaxStep {
    rows: usize,
    cols: usize,
    lds: usize,
    d: usize,
    ldo: usize,
    scale: f32,
    rounded: Option<(usize, DType)>,
}

fn well_formed(t: TileOp, src: &[UOp]) -> bool {
    src.len() == t.operands().len()
        && src.iter().enumerate().all(|(k, x)| {
            // A GEMM's A and B may be bf16 or f16 (loaded, then widened by the CAST to F64),
            // and so may an overwritten C (stored through a CAST) and the rounded softmax's P
            // (stored through a CAST; an F32 P, the score tile itself, through a 16-bit
            // scratch element).
            let half_ok = match t {
                TileOp::Gemm(g) => k < 2 || !g.accumulate,
                TileOp::Convert { .. } => k < 2,
                TileOp::SoftmaxUpdateRounded { .. } => k == 4,
                _ => false,
            } && x.dtype().is_half();
            matches!(x.op(), Op::Index) && x.src().len() == 2 && (x.dtype() == DType::F32 || half_ok)
        })
}

/// The next unused RANGE id and ALLOC slot.
struct Fresh {
    range_id: usize,
    alloc_slot: usize,
}

impl Fresh {
    fn range(&mut self, end: usize, axis: AxisType) -> UOp {
        self.range_id += 1;
        range(end, self.range_id - 1, axis)
    }

    /// A one-element F64 accumulator declared inside `scope` (so a THREAD range among them
    /// gives every thread its own).
    fn accumulator(&mut self, scope: &[UOp]) -> UOp {
        self.scratch(DType::F64, scope)
    }

    /// A one-element ALLOC of `dtype` declared inside `scope`.
    fn scratch(&mut self, dtype: DType, scope: &[UOp]) -> UOp {
        self.alloc_slot += 1;
        alloc(self.alloc_slot - 1, dtype, 1).after(scope)
    }
}

/// One tile op's operands (rewritten INDEX nodes), the ranges it runs in, and the id source.
struct Operands<'a> {
    src: &'a [UOp],
    scope: Vec<UOp>,
    fresh: &'a mut Fresh,
}

fn f64c(v: f64) -> UOp {
    const_of(v, DType::F64)
}

impl Operands<'_> {
    /// Operand `k`'s view and the index of its first element.
    fn operand(&self, k: usize) -> (&UOp, &UOp) {
        (&self.src[k].src()[0], &self.src[k].src()[1])
    }

    /// The element `offset` past operand `k`'s first one.
    fn at(&self, k: usize, offset: UOp) -> UOp {
        let (view, first) = self.operand(k);
        view.index(first + offset)
    }

    /// An op that touches no element: its operands, grouped, keep its ranges and dependencies.
    fn nothing(&self) -> UOp {
        sink(self.src)
    }

    /// `nest` with the operands it never touches (empty dimensions) beside it: the program
    /// keeps every BUFFER, so its argument slots do not change.
    fn keeping(&self, nest: UOp, untouched: &[usize]) -> UOp {
        if untouched.is_empty() {
            return nest;
        }
        let mut effects = vec![nest];
        effects.extend(untouched.iter().map(|&k| self.src[k].clone()));
        sink(&effects)
    }

    fn scope_with(&self, more: &[&UOp]) -> Vec<UOp> {
        let mut s = self.scope.clone();
        s.extend(more.iter().map(|&r| r.clone()));
        s
    }

    /// `C[i, j] = (accumulate ? C[i, j] : 0) + sum_p A[i, p] B[p, j]`, summed in f64 in `p`
    /// order, rounded to f32 (and then to C's dtype, when that is 16-bit): rows `i` outer,
    /// columns `j` inner, like the interpreter.
    fn gemm(self, g: GemmShape) -> UOp {
        if g.m == 0 || g.n == 0 {
            return self.nothing();
        }
        let i = self.fresh.range(g.m, AxisType::Loop);
        let j = self.fresh.range(g.n, AxisType::Loop);
        let c = self.at(2, &i * g.ldc as i64 + &j);
        let init = if g.accumulate { c.load().cast(DType::F64) } else { f64c(0.0) };
        let total = if g.k == 0 {
            init
        } else {
            let p = self.fresh.range(g.k, AxisType::Reduce);
            let acc = self.fresh.accumulator(&self.scope_with(&[&i, &j]));
            let start = acc.index(0).store(init);
            let inner = acc.after(&[start, p.clone()]);
            let a = if g.a_trans { &p * g.lda as i64 + &i } else { &i * g.lda as i64 + &p };
            let b = match (g.b_panel_width as i64, g.b_trans) {
                (0, true) => &j * g.ldb as i64 + &p,
                (0, false) => &p * g.ldb as i64 + &j,
                // The index of `GemmShape::b_index`, as IR arithmetic.
                (w, _) if g.b_pair_panels => {
                    j.idiv(w) * g.ldb as i64
                        + p.idiv(32) * 1024
                        + j.modulo(32).idiv(16) * 512
                        + p.modulo(32).idiv(2) * 32
                        + j.modulo(16) * 2
                        + p.modulo(2)
                }
                (w, _) => j.idiv(w) * g.ldb as i64 + &p * w + j.modulo(w),
            };
            let product = self.at(0, a).load().cast(DType::F64) * self.at(1, b).load().cast(DType::F64);
            let step = inner.index(0).store(inner.index(0).load() + product);
            acc.after(&[step.end(&[p])]).index(0).load()
        };
        // A 16-bit C holds the f32 sum rounded once more, as the tile library writes it.
        let sum = total.cast(DType::F32);
        let value = if c.dtype() == DType::F32 { sum } else { sum.cast(c.dtype()) };
        let nest = c.store(value).end(&[j, i]);
        self.keeping(nest, if g.k == 0 { &[0, 1] } else { &[] })
    }

    /// Per row, in the interpreter's order: the running max over the scores, `alpha`, P over
    /// S with its sum, `l = l alpha + sum`, `O *= alpha`, the new max. A row whose max stays
    /// `-inf` gets `alpha = 1` and `P = 0` (so no `exp2(-inf - -inf)` NaN reaches memory).
    ///
    /// The scores are multiplied by `step.scale` when loaded (unless it is 1). With
    /// `rounded = Some((ldp, round_to))` this is [`TileOp::SoftmaxUpdateRounded`]: P goes to
    /// operand 4 (stride `ldp`) rounded to `round_to`, the sum adding the rounded values. A P
    /// of that dtype rounds in its store; an F32 P (S itself, each score read before its
    /// probability replaces it) gets the value stored into and reloaded from a one-element
    /// `round_to` ALLOC, which rounds alike in both interpreter precisions (a CAST to a 16-bit
    /// type keeps f64 in the f64 one).
    fn softmax(self, step: SoftmaxStep) -> UOp {
        let SoftmaxStep { rows, cols, lds, d, ldo, scale, rounded } = step;
        if rows == 0 {
            return self.nothing();
        }
        let r = self.fresh.range(rows, AxisType::Loop);
        let row_scope = self.scope_with(&[&r]);
        let row_max = self.at(1, r.clone());
        let m_old = row_max.load().cast(DType::F64);
        let score = |ops: &Self, j: &UOp| ops.at(0, &r * lds as i64 + j);
        // An identity factor multiplies nothing, so unscaled expansions stay as they were.
        let scaled = |s: &UOp| {
            let x = s.load().cast(DType::F64);
            if scale == 1.0 { x } else { x * f64::from(scale) }
        };

        let m_new = if cols == 0 {
            m_old.clone()
        } else {
            let j = self.fresh.range(cols, AxisType::Reduce);
            let acc = self.fresh.accumulator(&row_scope);
            let start = acc.index(0).store(&m_old);
            let inner = acc.after(&[start, j.clone()]);
            let s = scaled(&score(&self, &j));
            // `f64::max` exactly: a NaN score is skipped (MAX keeps its right operand), and
            // a NaN running max gives way to the score.
            let m = inner.index(0).load();
            let step = inner.index(0).store(m.ne(&m).where_(&s, s.maximum(&m)));
            acc.after(&[step.end(&[j])]).index(0).load()
        };
        let live = m_new.ne(f64::NEG_INFINITY);
        let alpha = live.where_((&m_old - &m_new).exp2(), 1.0);

        let sum = if cols == 0 {
            f64c(0.0)
        } else {
            let j = self.fresh.range(cols, AxisType::Reduce);
            let acc = self.fresh.accumulator(&row_scope);
            let start = acc.index(0).store(0.0);
            let inner = acc.after(&[start, j.clone()]);
            let s = score(&self, &j);
            let p = live.where_((scaled(&s) - &m_new).exp2(), 0.0);
            let (write_p, p) = match rounded {
                Some((ldp, round_to)) => {
                    let offset = &r * ldp as i64 + &j;
                    let p_dtype = self.src[4].dtype();
                    let value = if p_dtype == round_to {
                        p.cast(p_dtype)
                    } else {
                        let scratch = self.fresh.scratch(round_to, &self.scope_with(&[&r, &j]));
                        let round = scratch.index(0).store(p.cast(round_to));
                        scratch.after(&[round]).index(0).load().cast(p_dtype)
                    };
                    let write = self.at(4, offset.clone()).store(value);
                    // The sum adds P as stored, read back: a CAST to a 16-bit type keeps the f64
                    // value in the interpreter's f64 mode, a store into P's buffer rounds in both.
                    let (view, first) = self.operand(4);
                    let stored = view.after(std::slice::from_ref(&write)).index(first + offset).load();
                    (write, stored.cast(DType::F64))
                }
                None => (s.store(p.cast(DType::F32)), p),
            };
            let step = inner.index(0).store(inner.index(0).load() + p);
            acc.after(&[sink(&[write_p, step]).end(&[j])]).index(0).load()
        };
        let row_sum = self.at(2, r.clone());
        let mut effects =
            vec![row_sum.store((row_sum.load().cast(DType::F64) * &alpha + sum).cast(DType::F32))];
        if d > 0 {
            let e = self.fresh.range(d, AxisType::Loop);
            let o = self.at(3, &r * ldo as i64 + &e);
            effects.push(o.store((o.load().cast(DType::F64) * &alpha).cast(DType::F32)).end(&[e]));
        }
        effects.push(row_max.store(m_new.cast(DType::F32)));
        let nest = sink(&effects).end(&[r]);
        let untouched: Vec<usize> = [(cols == 0, 0), (d == 0, 3), (rounded.is_some() && cols == 0, 4)]
            .iter()
            .filter(|x| x.0)
            .map(|x| x.1)
            .collect();
        self.keeping(nest, &untouched)
    }

    /// Per row, per column: `D = S` through a CAST to D's dtype (exact for widening; rounding
    /// to a 16-bit D, which the store into D's storage also does in the f64 precision).
    fn convert(self, rows: usize, cols: usize, lds: usize, ldd: usize) -> UOp {
        if rows == 0 || cols == 0 {
            return self.nothing();
        }
        let r = self.fresh.range(rows, AxisType::Loop);
        let j = self.fresh.range(cols, AxisType::Loop);
        let x = self.at(0, &r * lds as i64 + &j).load();
        let nest = self.at(1, &r * ldd as i64 + &j).store(x.cast(self.src[1].dtype())).end(&[j, r]);
        self.keeping(nest, &[])
    }

    /// Per row, per column: `S = lse == -inf ? 0 : exp2(S - lse)`, in f64, rounded once.
    fn recompute(self, rows: usize, cols: usize, ld: usize) -> UOp {
        if rows == 0 || cols == 0 {
            return self.nothing();
        }
        let r = self.fresh.range(rows, AxisType::Loop);
        let j = self.fresh.range(cols, AxisType::Loop);
        let l = self.at(1, r.clone()).load().cast(DType::F64);
        let s = self.at(0, &r * ld as i64 + &j);
        let p = l.ne(f64::NEG_INFINITY).where_((s.load().cast(DType::F64) - &l).exp2(), 0.0);
        s.store(p.cast(DType::F32)).end(&[j, r])
    }

    /// Per element: `Y = exp2(c (X - shift))` in f64, rounded once.
    fn exp_rows(self, rows: usize, cols: usize, ldx: usize, ldy: usize, c: f32) -> UOp {
        if rows == 0 || cols == 0 {
            return self.nothing();
        }
        let r = self.fresh.range(rows, AxisType::Loop);
        let j = self.fresh.range(cols, AxisType::Loop);
        let b = self.at(1, r.clone()).load().cast(DType::F64);
        let x = self.at(0, &r * ldx as i64 + &j).load().cast(DType::F64);
        let y = ((x - b) * f64::from(c)).exp2();
        self.at(2, &r * ldy as i64 + &j).store(y.cast(DType::F32)).end(&[j, r])
    }

    /// Per element, in f64 in the interpreter's order ([`activation_f64`]; exact GELU as
    /// [`normal_gated`]): `z` (and `z'`)
    /// from `x`, `e = exp2(-|z| log2 e)` (`-|z|` as `z < 0 ? z : -z`), `r = 1 / (e + 1)`,
    /// `s = z < 0 ? e r : r`; then `X = x s` in place, or with `ldg` the gradient
    /// `G = G (x (e r r) z' + s)`, rounded once.
    fn activation(
        self,
        rows: usize,
        cols: usize,
        ldx: usize,
        ldg: Option<usize>,
        kind: uopc_tile::Activation,
    ) -> UOp {
        if rows == 0 || cols == 0 {
            return self.nothing();
        }
        let r = self.fresh.range(rows, AxisType::Loop);
        let j = self.fresh.range(cols, AxisType::Loop);
        let at = self.at(0, &r * ldx as i64 + &j);
        let x = at.load().cast(DType::F64);
        if kind == uopc_tile::Activation::Gelu {
            let (value, slope) = normal_gated(&x);
            let Some(ldg) = ldg else {
                return at.store(value.cast(DType::F32)).end(&[j, r]);
            };
            let g = self.at(1, &r * ldg as i64 + &j);
            return g.store((g.load().cast(DType::F64) * slope).cast(DType::F32)).end(&[j, r]);
        }
        let cubic = f64::from(uopc_tile::GELU_CUBIC);
        let twice = f64::from(uopc_tile::GELU_TWICE_SQRT_2_OVER_PI);
        let (z, dz) = match kind {
            uopc_tile::Activation::GeluTanh => {
                let square = &x * &x;
                let z = (&x + &(&(&square * &x) * cubic)) * twice;
                (z, (square * (3.0 * cubic) + 1.0) * twice)
            }
            _ => (x.clone(), x.const_like(1.0)),
        };
        let below = z.lt(0.0);
        let e = (below.where_(&z, -&z) * std::f64::consts::LOG2_E).exp2();
        let rcp = (&e + 1.0).recip();
        let er = &e * &rcp;
        let s = below.where_(&er, &rcp);
        let Some(ldg) = ldg else {
            return at.store((&x * &s).cast(DType::F32)).end(&[j, r]);
        };
        let g = self.at(1, &r * ldg as i64 + &j);
        let d = &(&(&x * &(&er * &rcp)) * &dz) + &s;
        g.store((g.load().cast(DType::F64) * d).cast(DType::F32)).end(&[j, r])
    }

    /// Per element, in f64 in the interpreter's order ([`softcap_f64`]): `y = inner x`,
    /// `e = exp2((y < 0 ? y : -y) 2 log2 e)`, `t = (1 - e) (1 / (1 + e))`, then
    /// `X = (y < 0 ? -t : t) outer`, rounded once.
    fn softcap(self, rows: usize, cols: usize, ld: usize, inner: f32, outer: f32) -> UOp {
        if rows == 0 || cols == 0 {
            return self.nothing();
        }
        let r = self.fresh.range(rows, AxisType::Loop);
        let j = self.fresh.range(cols, AxisType::Loop);
        let at = self.at(0, &r * ld as i64 + &j);
        let y = at.load().cast(DType::F64) * f64::from(inner);
        let below = y.lt(0.0);
        let e = (below.where_(&y, -&y) * f64::from(uopc_tile::SOFTCAP_TWO_LOG2_E)).exp2();
        let t = (-&e + 1.0) * (&e + 1.0).recip();
        let value = below.where_(-&t, &t) * f64::from(outer);
        at.store(value.cast(DType::F32)).end(&[j, r])
    }

    /// `X = scale X + c (origin + j - r)` with `c = slope_scale slope`, in f64 in the
    /// interpreter's order (`origin + j - r` first, then the products and the sum).
    fn score_ramp(self, rows: usize, cols: usize, ld: usize, scale: f32, slope_scale: f32) -> UOp {
        if rows == 0 || cols == 0 {
            return self.nothing();
        }
        let c = self.at(1, idx(0)).load().cast(DType::F64) * f64::from(slope_scale);
        let origin = self.at(2, idx(0)).load().cast(DType::F64);
        let r = self.fresh.range(rows, AxisType::Loop);
        let j = self.fresh.range(cols, AxisType::Loop);
        let at = self.at(0, &r * ld as i64 + &j);
        let position = origin + (&j - &r).cast(DType::F64);
        let value = at.load().cast(DType::F64) * f64::from(scale) + c * position;
        at.store(value.cast(DType::F32)).end(&[j, r])
    }

    /// Per row, in the interpreter's order: the new maximum over the old one and the row (MAX
    /// keeps a NaN from either side), then the sum of `exp2(c (X - m'))` in f64, `l a + sum`
    /// with `a = 1` when the maximum did not move, both rounded once; a row whose maximum stays
    /// `-inf` keeps its sum.
    fn max_sum_exp(self, rows: usize, cols: usize, ld: usize, c: f32) -> UOp {
        if rows == 0 || cols == 0 {
            return self.nothing();
        }
        let c = f64::from(c);
        let r = self.fresh.range(rows, AxisType::Loop);
        let row_scope = self.scope_with(&[&r]);
        let row_max = self.at(1, r.clone());
        let m_old = row_max.load().cast(DType::F64);
        let x = |ops: &Self, j: &UOp| ops.at(0, &r * ld as i64 + j).load().cast(DType::F64);
        let m_new = {
            let j = self.fresh.range(cols, AxisType::Reduce);
            let acc = self.fresh.accumulator(&row_scope);
            let start = acc.index(0).store(&m_old);
            let inner = acc.after(&[start, j.clone()]);
            let step = inner.index(0).store(x(&self, &j).maximum(inner.index(0).load()));
            acc.after(&[step.end(&[j])]).index(0).load()
        };
        let sum = {
            let j = self.fresh.range(cols, AxisType::Reduce);
            let acc = self.fresh.accumulator(&row_scope);
            let start = acc.index(0).store(0.0);
            let inner = acc.after(&[start, j.clone()]);
            let term = ((x(&self, &j) - &m_new) * c).exp2();
            let step = inner.index(0).store(inner.index(0).load() + term);
            acc.after(&[step.end(&[j])]).index(0).load()
        };
        let alpha = m_old.ne(&m_new).where_(((&m_old - &m_new) * c).exp2(), 1.0);
        let row_sum = self.at(2, r.clone());
        let l_old = row_sum.load().cast(DType::F64);
        let l_new = m_new.ne(f64::NEG_INFINITY).where_(&l_old * &alpha + sum, &l_old);
        let effects = [row_sum.store(l_new.cast(DType::F32)), row_max.store(m_new.cast(DType::F32))];
        sink(&effects).end(&[r])
    }

    /// Per row, per column: `dP = P == 0 ? 0 : P * (dP - delta)`, in f64, rounded once.
    fn grad(self, rows: usize, cols: usize, ld: usize) -> UOp {
        if rows == 0 || cols == 0 {
            return self.nothing();
        }
        let r = self.fresh.range(rows, AxisType::Loop);
        let j = self.fresh.range(cols, AxisType::Loop);
        let dl = self.at(2, r.clone()).load().cast(DType::F64);
        let at = &r * ld as i64 + &j;
        let p = self.at(0, at.clone()).load().cast(DType::F64);
        let g = self.at(1, at);
        let ds = p.ne(0.0).where_(&p * (g.load().cast(DType::F64) - dl), 0.0);
        g.store(ds.cast(DType::F32)).end(&[j, r])
    }
}

/// Exact GELU's value and derivative at the f64 value `x`, op for op the interpreter's
/// `normal_gated_f64` (differences as sums of negations, the quotient as a reciprocal's
/// product, both exact rewrites).
fn normal_gated(x: &UOp) -> (UOp, UOp) {
    let horner = |c: &[f32], v: &UOp| {
        c.iter().rev().skip(1).fold(v.const_like(f64::from(c[c.len() - 1])), |p, &k| &(&p * v) + f64::from(k))
    };
    let minus_log2_e = -f64::from(std::f32::consts::LOG2_E);
    let s = x * f64::from(std::f32::consts::FRAC_1_SQRT_2);
    let m = s.lt(0.0).where_(&s, -&s);
    let square = &s * &s;
    let near = &(&horner(&uopc_tile::GELU_NEAR_ZERO, &square) * &s) + 0.5;
    let u = &((&m + -2.0).recip() * -12.0) + -3.0;
    let tail = (&(&square * minus_log2_e) + &horner(&uopc_tile::GELU_LOG2_TAIL, &u)).exp2();
    let tail = (&m + uopc_tile::ERF_SATURATION).lt(0.0).where_(0.0, &tail);
    let far = x.lt(0.0).where_(&tail, &(-&tail + 1.0));
    let cdf = (&m + 1.0).lt(0.0).where_(&far, &near);
    let density = (&square * minus_log2_e).exp2() * f64::from(uopc_tile::GELU_DENSITY);
    (x * &cdf, &cdf + &(x * &density))
}
