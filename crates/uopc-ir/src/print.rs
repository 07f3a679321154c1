//! Pretty printers: a loop program as nested loops, and any graph as one line per node.

use crate::error::IrError;
use crate::linearize::{Linear, Stmt, linearize};
use crate::uop::{BinaryOp, GemmShape, Op, TileOp, UOp, UnaryOp};
use std::collections::HashMap;
use std::fmt::Write;

/// One line per node, sources first: `%7 = ADD f32 (%3, %5)`.
#[must_use]
pub fn print_graph(root: &UOp) -> String {
    let mut out = String::new();
    for u in UOp::toposort(std::slice::from_ref(root)) {
        let _ = writeln!(out, "{u:?}");
    }
    out
}

/// A loop program rendered as nested loops (C-like pseudo code).
///
/// # Errors
///
/// The [`IrError`] of [`linearize`] when the program cannot be ordered into loops.
///
/// # Examples
///
/// ```rust
/// use uopc_ir::{AxisType, DType, buffer, print_program, range, sink};
///
/// let (a, out) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 4));
/// let k = range(4, 0, AxisType::Loop);
/// let text = print_program(&sink(&[out.index(&k).store(a.index(&k).load() * 2.0f32).end(&[k])]))?;
/// assert!(text.starts_with("buf0: f32[4]\nbuf1: f32[4]\n"));
/// assert!(text.contains("for r0 in 0..4 (loop) {"));
/// assert!(text.contains("buf1[r0] = "));
/// # Ok::<(), uopc_ir::IrError>(())
/// ```
pub fn print_program(program: &UOp) -> Result<String, IrError> {
    Ok(print_linear(&linearize(program)?))
}

/// An already linearized program rendered as nested loops.
#[must_use]
pub fn print_linear(lin: &Linear) -> String {
    let mut p = Printer { names: HashMap::new(), inline_depth: HashMap::new(), out: String::new() };
    for b in &lin.buffers {
        if let Op::Buffer { slot, len } = b.op() {
            let _ = writeln!(p.out, "buf{slot}: {}[{len}]", b.dtype());
        }
    }
    for v in &lin.vars {
        if let Op::Var { slot, lo, hi } = v.op() {
            let _ = writeln!(p.out, "var{slot}: {} in {lo}..={hi}", v.dtype());
        }
    }
    for a in &lin.allocs {
        if let Op::Alloc { slot, len } = a.op() {
            let _ = writeln!(p.out, "local acc{slot}: {}[{len}]", a.dtype());
        }
    }
    p.block(&lin.root, 0);
    p.out
}

struct Printer {
    names: HashMap<UOp, String>,
    /// Nesting depth of integer expressions shown inline (deep ones get a name instead, so
    /// printing never recurses deeply).
    inline_depth: HashMap<UOp, usize>,
    out: String,
}

/// Integer expressions nest inline up to this depth.
const MAX_INLINE_DEPTH: usize = 8;

fn binary_symbol(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "+",
        BinaryOp::Sub => "-",
        BinaryOp::Mul => "*",
        BinaryOp::CmpLt => "<",
        BinaryOp::CmpNe => "!=",
        BinaryOp::IDiv => "/",
        BinaryOp::Mod => "%",
        BinaryOp::Max => "max",
    }
}

impl Printer {
    fn expr(&self, u: &UOp) -> String {
        if let Some(n) = self.names.get(u) {
            return n.clone();
        }
        match u.op() {
            Op::Const(c) => c.to_string(),
            Op::Range { id, .. } => format!("r{id}"),
            Op::Buffer { slot, .. } => format!("buf{slot}"),
            Op::Alloc { slot, .. } => format!("acc{slot}"),
            Op::Var { slot, .. } => format!("var{slot}"),
            Op::After | Op::Index | Op::Load | Op::Binary(_) | Op::Unary(_) | Op::Where | Op::Cast => {
                self.value_expr(u)
            }
            other => format!("<{}>", other.name()),
        }
    }

    /// The text of a node computed from its sources, through the op's typed view; a node whose
    /// sources do not fit its op prints as `<OP?>`, since the printer must show what a failed
    /// verification is about rather than panic on it.
    fn value_expr(&self, u: &UOp) -> String {
        if let Some(a) = u.as_after() {
            self.expr(a.base)
        } else if let Some(i) = u.as_index() {
            let base = u.indexed_base().map(|b| self.expr(b)).unwrap_or_else(|| "?".into());
            format!("{base}[{}]", self.expr(i.offset))
        } else if let Some(index) = u.as_load() {
            self.expr(index)
        } else if let Some((op, a, b)) = u.as_binary() {
            match op {
                BinaryOp::Max => format!("max({}, {})", self.expr(a), self.expr(b)),
                _ => format!("({} {} {})", self.expr(a), binary_symbol(op), self.expr(b)),
            }
        } else if let Some((op, a)) = u.as_unary() {
            match op {
                UnaryOp::Neg => format!("-{}", self.expr(a)),
                _ => format!("{}({})", u.op().name().to_lowercase(), self.expr(a)),
            }
        } else if let Some(w) = u.as_where() {
            format!("({} ? {} : {})", self.expr(w.cond), self.expr(w.then), self.expr(w.otherwise))
        } else if let Some(x) = u.as_cast() {
            format!("({}){}", u.dtype(), self.expr(x))
        } else {
            format!("<{}?>", u.op().name())
        }
    }

    /// Records `u` as inline and says whether it stays inline (not too deep).
    fn inline(&mut self, u: &UOp) -> bool {
        let depth =
            1 + u.src().iter().map(|s| self.inline_depth.get(s).copied().unwrap_or(0)).max().unwrap_or(0);
        if depth > MAX_INLINE_DEPTH {
            return false;
        }
        self.inline_depth.insert(u.clone(), depth);
        true
    }

    fn block(&mut self, body: &[Stmt], depth: usize) {
        let pad = "  ".repeat(depth);
        for s in body {
            match s {
                Stmt::Loop { range, body } => {
                    let (end, axis) = match range.as_range() {
                        Some(r) => (self.expr(r.end), r.axis.name()),
                        None => ("?".into(), ""),
                    };
                    let _ = writeln!(self.out, "{pad}for {} in 0..{end} ({axis}) {{", self.expr(range));
                    self.block(body, depth + 1);
                    let _ = writeln!(self.out, "{pad}}}");
                }
                Stmt::Op(u) => match u.op() {
                    Op::Store if let Some(s) = u.as_store() => {
                        let _ = writeln!(self.out, "{pad}{} = {};", self.expr(s.index), self.expr(s.value));
                    }
                    Op::Tile(t) => {
                        let args: Vec<String> = u.src().iter().map(|x| self.expr(x)).collect();
                        let what = match t {
                            TileOp::Gemm(GemmShape {
                                m,
                                n,
                                k,
                                a_trans,
                                b_trans,
                                accumulate,
                                b_panel_width,
                                b_pair_panels,
                                parallel,
                                ..
                            }) => {
                                format!(
                                    "tile_gemm {m}x{n}x{k}{}{}{}{}{}",
                                    if *a_trans { " A^T" } else { "" },
                                    if *b_trans { " B^T" } else { "" },
                                    match (b_panel_width, b_pair_panels) {
                                        (0, _) => String::new(),
                                        (w, true) => format!(" B in pair panels of {w}"),
                                        (w, false) => format!(" B in panels of {w}"),
                                    },
                                    if *accumulate { " +=" } else { "" },
                                    if *parallel { " (split over the pool)" } else { "" }
                                )
                            }
                            TileOp::SoftmaxUpdate { rows, cols, d, scale, .. } => {
                                let scale = f32::from_bits(*scale);
                                if scale == 1.0 {
                                    format!("tile_softmax {rows}x{cols} d={d}")
                                } else {
                                    format!("tile_softmax {rows}x{cols} d={d} scale={scale}")
                                }
                            }
                            TileOp::SoftmaxUpdateRounded { rows, cols, d, scale, round_to, .. } => {
                                format!(
                                    "tile_softmax_rounded {rows}x{cols} d={d} scale={} to={round_to}",
                                    f32::from_bits(*scale)
                                )
                            }
                            TileOp::SoftmaxRecompute { rows, cols, .. } => {
                                format!("tile_softmax_recompute {rows}x{cols}")
                            }
                            TileOp::SoftmaxGrad { rows, cols, .. } => {
                                format!("tile_softmax_grad {rows}x{cols}")
                            }
                            TileOp::MaxSumExp { rows, cols, scale, .. } => {
                                format!("tile_max_sum_exp {rows}x{cols} scale={}", f32::from_bits(*scale))
                            }
                            TileOp::Convert { rows, cols, .. } => {
                                format!("tile_convert {rows}x{cols}")
                            }
                            TileOp::ExpRows { rows, cols, scale, .. } => {
                                format!("tile_exp_rows {rows}x{cols} scale={}", f32::from_bits(*scale))
                            }
                            TileOp::Activation { rows, cols, kind, .. } => {
                                format!("tile_activation {rows}x{cols} {kind:?}")
                            }
                            TileOp::ActivationGrad { rows, cols, kind, .. } => {
                                format!("tile_activation_grad {rows}x{cols} {kind:?}")
                            }
                            TileOp::Softcap { rows, cols, inner, outer, .. } => format!(
                                "tile_softcap {rows}x{cols} {} tanh({} x)",
                                f32::from_bits(*outer),
                                f32::from_bits(*inner)
                            ),
                            TileOp::ScoreRamp { rows, cols, scale, slope_scale, .. } => format!(
                                "tile_score_ramp {rows}x{cols} {} x + {} slope (origin + j - r)",
                                f32::from_bits(*scale),
                                f32::from_bits(*slope_scale)
                            ),
                        };
                        let _ = writeln!(self.out, "{pad}{what}({});", args.join(", "));
                    }
                    // Integer index math is shown inline where it is used, unless deeply nested.
                    _ if u.dtype().is_int() && !matches!(u.op(), Op::Load) && self.inline(u) => {}
                    Op::Load | Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast => {
                        let name = format!("v{}", u.id());
                        let _ = writeln!(self.out, "{pad}{} {name} = {};", u.dtype(), self.expr(u));
                        self.names.insert(u.clone(), name);
                    }
                    _ => {}
                },
            }
        }
    }
}
