//! The verifier's per-node rules: arity, the kind of each source and the dtypes an op takes
//! and gives ([`check_types`]), before the scope, order and bounds checks of the program.

use super::{err, view_base};
use crate::dtype::DType;
use crate::error::{IrError, IrErrorKind};
use crate::uop::{BinaryOp, ConstValue, Op, TileOp, UOp, UnaryOp};
use uopc_tile::GemmShape;

fn is_value(u: &UOp) -> bool {
    matches!(u.op(), Op::Const(_) | Op::Var { .. } | Op::Range { .. } | Op::Load) || u.op().is_alu()
}

/// `Ok` when `u` has `n` sources.
fn expect_arity(u: &UOp, n: usize) -> Result<(), IrError> {
    let got = u.src().len();
    if got == n {
        Ok(())
    } else {
        Err(err(IrErrorKind::Structure, u, format!("expects {n} sources, has {got}")))
    }
}

pub(super) fn check_types(u: &UOp) -> Result<(), IrError> {
    let s = u.src();
    let arity = |n: usize| expect_arity(u, n);
    let dt = |k: usize| s[k].dtype();
    if u.op().is_alu() || matches!(u.op(), Op::Store | Op::Index | Op::Range { .. }) {
        // Operands that are values (not buffers, views or effects).
        let first_value = if matches!(u.op(), Op::Store | Op::Index) { 1 } else { 0 };
        if let Some(bad) = s.iter().skip(first_value).find(|x| !is_value(x)) {
            return Err(err(IrErrorKind::Structure, u, format!("operand {} is not a value", bad.short())));
        }
    }
    match u.op() {
        Op::Const(c) => {
            arity(0)?;
            // The value must be one the dtype can hold: the backend materializes it at that width.
            let fits = match (c, u.dtype()) {
                (ConstValue::Bool(_), DType::Bool) => true,
                (ConstValue::Int(v), DType::I32) => i32::try_from(*v).is_ok(),
                (ConstValue::Int(_), DType::I64) => true,
                (ConstValue::Float(_), d) | (ConstValue::Int(_), d) => d.is_float() || d.is_half(),
                _ => false,
            };
            if !fits {
                return Err(err(IrErrorKind::DType, u, format!("constant {c} does not fit {}", u.dtype())));
            }
        }
        Op::Buffer { .. } | Op::Alloc { .. } => arity(0)?,
        Op::Var { lo, hi, .. } => {
            arity(0)?;
            if u.dtype() != DType::INDEX {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("a variable must be {}, is {}", DType::INDEX, u.dtype()),
                ));
            }
            if lo > hi {
                return Err(err(
                    IrErrorKind::Structure,
                    u,
                    format!("declared bounds {lo}..={hi} are empty (lo must not exceed hi)"),
                ));
            }
        }
        Op::Range { .. } => {
            arity(1)?;
            if !dt(0).is_int() {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("range end must be an integer, is {}", dt(0)),
                ));
            }
        }
        Op::End => arity(2)?,
        Op::After if s.is_empty() => arity(1)?,
        Op::Index | Op::Load | Op::Store => check_memory_types(u)?,
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast => check_alu_types(u)?,
        Op::After if u.dtype() != dt(0) => {
            return Err(err(
                IrErrorKind::DType,
                u,
                format!("AFTER dtype {} differs from its view's {}", u.dtype(), dt(0)),
            ));
        }
        Op::Sink | Op::After => {}
        Op::Tile(t) => check_tile_types(u, t)?,
        _ => {
            return Err(err(
                IrErrorKind::Structure,
                u,
                "tensor-level op in a loop program (rangeify it first)",
            ));
        }
    }
    Ok(())
}

/// The rules of tile op `t` at node `u`: one INDEX per operand, the dtype pairs its operands
/// may take, and row strides at least as wide as each operand's rows.
fn check_tile_types(u: &UOp, t: &TileOp) -> Result<(), IrError> {
    let s = u.src();
    let dt = |k: usize| s[k].dtype();
    if s.len() != t.operands().len() {
        return Err(err(
            IrErrorKind::Structure,
            u,
            format!("expects {} sources, has {}", t.operands().len(), s.len()),
        ));
    }
    for x in s {
        if !matches!(x.op(), Op::Index) {
            return Err(err(IrErrorKind::Structure, u, format!("operand {} is not an INDEX", x.short())));
        }
    }
    // A GEMM multiplies f32, bf16 or f16 operands (both alike, or an f32 A with an f16
    // B, which the tile library widens while packing B) into an f32 C (or, for two bf16
    // operands, a bf16 C it overwrites, and likewise f16: see `rounds_into_half`); the rounded
    // softmax rounds to BF16 or F16 (its type says so) and writes its P tile (operand 4)
    // in that dtype, or over its F32 score tile (the same node, the same stride); every
    // other operand is f32.
    if let &TileOp::SoftmaxUpdateRounded { round_to, lds, ldp, .. } = t {
        let round_to = DType::from(round_to);
        let over_scores = s[4] == s[0] && ldp == lds;
        if s[4].dtype() != round_to && !over_scores {
            return Err(err(
                IrErrorKind::DType,
                u,
                format!(
                    "P operand {} is {} and not the score tile with its stride, so it must be \
                     {round_to}",
                    s[4].short(),
                    s[4].dtype()
                ),
            ));
        }
    }
    if let TileOp::Gemm(g) = t {
        check_gemm_operands(u, g)?;
    }
    if matches!(t, TileOp::Convert { .. }) {
        let (from, to) = (dt(0), dt(1));
        if !((from.is_half() && to == DType::F32) || (from == DType::F32 && to.is_half())) {
            return Err(err(
                IrErrorKind::DType,
                u,
                format!(
                    "conversion from {} ({from}) to {} ({to}): want BF16 or F16 to F32, or F32 to \
                     BF16 or F16",
                    s[0].short(),
                    s[1].short()
                ),
            ));
        }
    }
    for (k, x) in s.iter().enumerate() {
        let want = match t {
            // Checked together above.
            TileOp::Gemm(_) if k < 2 => continue,
            // Two 16-bit operands may write a C of their type that they overwrite: the f32
            // sums, rounded.
            TileOp::Gemm(g) if k == 2 && rounds_into_half(g, dt(0), dt(1), x.dtype()) => continue,
            TileOp::Convert { .. } => continue,
            TileOp::SoftmaxUpdateRounded { .. } if k == 4 => continue,
            _ => DType::F32,
        };
        if x.dtype() != want {
            return Err(err(
                IrErrorKind::DType,
                u,
                format!("operand {} is {}, not {want}", x.short(), x.dtype()),
            ));
        }
    }
    for (k, (rows, cols, ld)) in t.blocks().into_iter().enumerate() {
        if rows > 1 && ld < cols {
            return Err(err(
                IrErrorKind::Structure,
                u,
                format!("operand {k}: row stride {ld} is less than its {cols} columns"),
            ));
        }
    }
    Ok(())
}

/// The dtypes a GEMM's A and B may take together, and with B in panels or pair panels.
fn check_gemm_operands(u: &UOp, g: &GemmShape) -> Result<(), IrError> {
    let s = u.src();
    let dt = |k: usize| s[k].dtype();
    if g.b_pair_panels
        && (dt(0) != DType::BF16
            || dt(1) != DType::BF16
            || g.b_panel_width != uopc_tile::PAIR_PANEL_WIDTH
            || g.b_trans)
    {
        return Err(err(
            IrErrorKind::DType,
            u,
            format!(
                "GEMM with B {} in pair panels of {}: want BF16 A and B ({}, {}), panels of {} \
                 and B not transposed",
                s[1].short(),
                g.b_panel_width,
                dt(0),
                dt(1),
                uopc_tile::PAIR_PANEL_WIDTH
            ),
        ));
    }
    let (a, b) = (dt(0), dt(1));
    if g.b_panel_width != 0
        && !g.b_pair_panels
        && (g.b_trans || !(a == DType::F32 || a.is_half()) || b != DType::F32)
    {
        return Err(err(
            IrErrorKind::DType,
            u,
            format!(
                "GEMM with B {} in panels of {}: want F32 B and an F32, BF16 or F16 A ({a}, \
                     {b}), and B not transposed",
                s[1].short(),
                g.b_panel_width
            ),
        ));
    }
    let paired = a == b && (a == DType::F32 || a.is_half());
    let widened_b = a == DType::F32 && b.is_half();
    let widened_a = a.is_half() && b == DType::F32;
    if !(paired || widened_b || widened_a) {
        return Err(err(
            IrErrorKind::DType,
            u,
            format!(
                "GEMM operands A {} ({a}) and B {} ({b}): want both F32, both BF16, both F16, or \
                 F32 with F16 or BF16 either way round",
                s[0].short(),
                s[1].short()
            ),
        ));
    }
    Ok(())
}

/// Whether a GEMM of A and B of dtypes `a` and `b` may write a C of dtype `c` other than F32:
/// a BF16 C of two BF16 operands or an F16 C of two F16 ones, overwritten (the f32 sums
/// rounded once, which a C of too few bits cannot carry between calls) and with B not in
/// panels.
fn rounds_into_half(g: &GemmShape, a: DType, b: DType, c: DType) -> bool {
    let same_half = matches!(c, DType::BF16 | DType::F16) && a == c && b == c;
    same_half && !g.accumulate && g.b_panel_width == 0
}

/// The rules of INDEX, LOAD and STORE at `u`: a view indexed by an integer, and loads and
/// stores through an INDEX in the buffer's dtype.
fn check_memory_types(u: &UOp) -> Result<(), IrError> {
    let s = u.src();
    let dt = |k: usize| s[k].dtype();
    let arity = |n: usize| expect_arity(u, n);
    match u.op() {
        Op::Index => {
            arity(2)?;
            if view_base(&s[0]).is_none() {
                return Err(err(
                    IrErrorKind::Structure,
                    u,
                    "INDEX of something that is not a BUFFER or ALLOC view",
                ));
            }
            if !dt(1).is_int() {
                return Err(err(IrErrorKind::DType, u, format!("index must be an integer, is {}", dt(1))));
            }
            if u.dtype() != dt(0) {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("INDEX dtype {} differs from its buffer's {}", u.dtype(), dt(0)),
                ));
            }
        }
        Op::Load => {
            arity(1)?;
            if !matches!(s[0].op(), Op::Index) {
                return Err(err(IrErrorKind::Structure, u, "LOAD of something that is not an INDEX"));
            }
            if u.dtype() != dt(0) {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("LOAD dtype {} differs from the buffer's {}", u.dtype(), dt(0)),
                ));
            }
        }
        Op::Store => {
            arity(2)?;
            if !matches!(s[0].op(), Op::Index) {
                return Err(err(IrErrorKind::Structure, u, "STORE to something that is not an INDEX"));
            }
            if dt(1) != dt(0) {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("stores a {} value into a {} buffer", dt(1), dt(0)),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The rules of the ALU ops at `u`: operand and result dtypes of unary and binary ops,
/// WHERE and CAST (16-bit floats only stored, loaded and cast).
fn check_alu_types(u: &UOp) -> Result<(), IrError> {
    let s = u.src();
    let dt = |k: usize| s[k].dtype();
    let arity = |n: usize| expect_arity(u, n);
    match u.op() {
        Op::Unary(op) => {
            arity(1)?;
            let float_only = !matches!(op, UnaryOp::Neg);
            // 16-bit floats are storage types: arithmetic on them needs a CAST to F32 first.
            let no_arithmetic = u.dtype() == DType::Bool || u.dtype().is_half();
            if dt(0) != u.dtype() || (float_only && !u.dtype().is_float()) || no_arithmetic {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("{} is not defined for {}", u.op().name(), dt(0)),
                ));
            }
        }
        Op::Binary(op) => {
            arity(2)?;
            if dt(0) != dt(1) {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("operand dtypes differ: {} and {}", dt(0), dt(1)),
                ));
            }
            let want = if matches!(op, BinaryOp::CmpLt | BinaryOp::CmpNe) { DType::Bool } else { dt(0) };
            if u.dtype() != want {
                return Err(err(IrErrorKind::DType, u, format!("result must be {want}, is {}", u.dtype())));
            }
            let ok = match op {
                _ if dt(0).is_half() => false,
                BinaryOp::IDiv | BinaryOp::Mod => dt(0).is_int(),
                BinaryOp::CmpNe => true,
                _ => dt(0) != DType::Bool,
            };
            if !ok {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("{} is not defined for {}", u.op().name(), dt(0)),
                ));
            }
        }
        Op::Where => {
            arity(3)?;
            if dt(0) != DType::Bool {
                return Err(err(IrErrorKind::DType, u, format!("condition must be bool, is {}", dt(0))));
            }
            if dt(1) != dt(2) || dt(1) != u.dtype() {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!("branch dtypes differ: {} and {}", dt(1), dt(2)),
                ));
            }
        }
        Op::Cast => {
            arity(1)?;
            // A 16-bit float converts only to and from floats: its rounding is defined from an
            // f32 or an f64 value, and integers reach it through an explicit CAST to F32.
            let float_like = |d: DType| d.is_float() || d.is_half();
            if (u.dtype().is_half() || dt(0).is_half()) && !(float_like(u.dtype()) && float_like(dt(0))) {
                return Err(err(
                    IrErrorKind::DType,
                    u,
                    format!(
                        "CAST from {} to {} (16-bit floats cast only to and from floats)",
                        dt(0),
                        u.dtype()
                    ),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}
