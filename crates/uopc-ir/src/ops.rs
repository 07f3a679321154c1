//! The operations a UOp node can carry, with their non-node arguments: axis kinds, ALU and
//! reduction ops, constants, host data, tile operations.

use crate::dtype::DType;
use crate::ids::{AllocSlot, BufferSlot, RangeId, VarSlot};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
pub use uopc_tile::GemmShape;
pub use uopc_tile::ops::{Half, TileOp, TileOperand, block_extent};

/// How a RANGE's loop is executed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AxisType {
    /// Iterations run in parallel: the runtime splits this range across rayon tasks.
    Thread,
    /// An ordinary sequential loop over an output axis.
    Loop,
    /// A sequential loop over a reduced axis.
    Reduce,
    /// An output axis expanded in registers (constant trip count, unrolled by the lowering).
    Upcast,
    /// A reduce axis expanded in registers.
    Unroll,
}

impl AxisType {
    /// Short lowercase name used by the printer.
    pub fn name(self) -> &'static str {
        match self {
            AxisType::Thread => "thread",
            AxisType::Loop => "loop",
            AxisType::Reduce => "reduce",
            AxisType::Upcast => "upcast",
            AxisType::Unroll => "unroll",
        }
    }
}

/// One-input ALU operations.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `2^x`; `exp2(-inf) == 0`.
    Exp2,
    /// `log2(x)`.
    Log2,
    /// `sqrt(x)`.
    Sqrt,
    /// `1 / x`.
    Recip,
}

/// Two-input ALU operations.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// The NaN-propagating maximum, as torch's and numpy's: NaN if either operand is NaN
    /// (a NaN `a` is returned as is), otherwise `if a > b { a } else { b }` (so of two equal
    /// zeros it yields `b`). Reductions built on it propagate NaN too.
    Max,
    /// `a < b`, a Bool.
    CmpLt,
    /// `a != b`, a Bool.
    CmpNe,
    /// Integer division truncating toward zero; division by zero yields 0.
    IDiv,
    /// Remainder with the sign of the dividend; modulo zero yields 0.
    Mod,
}

/// The combining operation of a REDUCE.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ReduceOp {
    /// Sum; identity 0.
    Add,
    /// Maximum; identity -inf (or the dtype's minimum).
    Max,
}

impl ReduceOp {
    /// The ALU op that combines two partial results.
    pub fn binary(self) -> BinaryOp {
        match self {
            ReduceOp::Add => BinaryOp::Add,
            ReduceOp::Max => BinaryOp::Max,
        }
    }

    /// The identity element for `dtype`.
    pub fn identity(self, dtype: DType) -> ConstValue {
        match (self, dtype.is_float()) {
            (ReduceOp::Add, true) => ConstValue::float(0.0),
            (ReduceOp::Add, false) => ConstValue::Int(0),
            (ReduceOp::Max, true) => ConstValue::float(f64::NEG_INFINITY),
            (ReduceOp::Max, false) if dtype == DType::I32 => ConstValue::Int(i32::MIN as i64),
            (ReduceOp::Max, false) => ConstValue::Int(i64::MIN),
        }
    }
}

/// A constant. Floats are stored as bits so that constants hash and compare structurally.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ConstValue {
    /// A truth value.
    Bool(bool),
    /// An integer (I32 constants are stored widened).
    Int(i64),
    /// A float, as the bits of an `f64`.
    Float(u64),
}

impl ConstValue {
    /// A float constant.
    pub fn float(v: f64) -> Self {
        ConstValue::Float(v.to_bits())
    }

    /// The value as an f64 (bools as 0/1).
    pub fn as_f64(self) -> f64 {
        match self {
            ConstValue::Bool(b) => b as i64 as f64,
            ConstValue::Int(i) => i as f64,
            ConstValue::Float(bits) => f64::from_bits(bits),
        }
    }

    /// The value as an i64 (floats truncated and saturated, NaN to 0, as Rust's `as`).
    pub fn as_i64(self) -> i64 {
        match self {
            ConstValue::Bool(b) => b as i64,
            ConstValue::Int(i) => i,
            ConstValue::Float(bits) => f64::from_bits(bits) as i64,
        }
    }

    /// The value converted to `dtype` with the IR's CAST semantics.
    pub fn cast(self, dtype: DType) -> ConstValue {
        match dtype {
            DType::Bool => ConstValue::Bool(match self {
                ConstValue::Bool(b) => b,
                ConstValue::Int(i) => i != 0,
                ConstValue::Float(bits) => f64::from_bits(bits) != 0.0,
            }),
            DType::I32 => ConstValue::Int(match self {
                ConstValue::Float(bits) => f64::from_bits(bits) as i32 as i64,
                other => other.as_i64() as i32 as i64,
            }),
            DType::I64 => ConstValue::Int(self.as_i64()),
            // Integers round to f32 once (through f64 they could round twice).
            DType::F32 => ConstValue::float(match self {
                ConstValue::Int(i) => i as f32 as f64,
                other => other.as_f64() as f32 as f64,
            }),
            DType::F64 => ConstValue::float(self.as_f64()),
            // Through the F32 value (as the CAST from F64 rounds), then to nearest even.
            DType::BF16 => {
                ConstValue::float(half::bf16::from_f32(self.cast(DType::F32).as_f64() as f32).to_f64())
            }
            DType::F16 => {
                ConstValue::float(half::f16::from_f32(self.cast(DType::F32).as_f64() as f32).to_f64())
            }
        }
    }
}

impl fmt::Display for ConstValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConstValue::Bool(b) => write!(f, "{b}"),
            ConstValue::Int(i) => write!(f, "{i}"),
            ConstValue::Float(bits) => {
                let v = f64::from_bits(bits);
                if v.is_infinite() {
                    f.write_str(if v > 0.0 { "inf" } else { "-inf" })
                } else if v == v.trunc() && v.abs() < 1e15 {
                    write!(f, "{v:.1}")
                } else {
                    write!(f, "{v}")
                }
            }
        }
    }
}

/// Host data held by a tensor-level DATA leaf. Compared by identity, never by contents.
#[derive(Clone)]
pub struct DataRef(pub Arc<dyn std::any::Any + Send + Sync>);

impl PartialEq for DataRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for DataRef {}
impl Hash for DataRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.0) as *const u8 as usize).hash(state)
    }
}
impl fmt::Debug for DataRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataRef({:p})", Arc::as_ptr(&self.0) as *const u8)
    }
}

/// The operation of a node, with its non-UOp arguments.
///
/// Sources (`UOp` inputs) are listed in each variant's doc as `src[...]`.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Op {
    /// A constant scalar. No sources.
    Const(ConstValue),
    /// A kernel parameter: caller-owned memory of `len` elements, passed in argument `slot`.
    Buffer { slot: BufferSlot, len: usize },
    /// Kernel-local storage of `len` elements (a register or a stack array).
    Alloc { slot: AllocSlot, len: usize },
    /// A scalar kernel argument (a "variable"): an INDEX value the caller passes at every run,
    /// in variable slot `slot`, declared to lie in `lo..=hi`. No sources.
    ///
    /// It is usable wherever an index expression is, above all as a RANGE end, so one
    /// compiled program serves every value (a KV cache's length changing each step). Every
    /// bounds proof treats it as the interval `[lo, hi]`: buffers keep their static lengths and
    /// must hold for `hi`. Slots are argument positions, numbered densely from 0; runners reject
    /// a value outside `lo..=hi` before anything runs.
    Var { slot: VarSlot, lo: i64, hi: i64 },
    /// A loop variable taking values `0..end`; `src[0]` is the end (an index expression).
    Range { id: RangeId, axis: AxisType },
    /// Closes a range: `src[0]` is the body (stores, sinks), `src[1]` the RANGE.
    End,
    /// `src[0]` viewed after all of `src[1..]` (stores, ENDs, or RANGEs to live inside).
    After,
    /// An address: `src[0]` a buffer view (BUFFER, ALLOC or AFTER of one), `src[1]` the element index.
    Index,
    /// Reads `src[0]`, an INDEX.
    Load,
    /// Writes `src[1]` to `src[0]`, an INDEX.
    Store,
    /// Groups effects; no value.
    Sink,
    /// A one-input ALU op on `src[0]`.
    Unary(UnaryOp),
    /// A two-input ALU op on `src[0]`, `src[1]`.
    Binary(BinaryOp),
    /// `src[0] ? src[1] : src[2]`.
    Where,
    /// `src[0]` converted to this node's dtype.
    Cast,
    /// A dense tile operation on f32 memory: an effect like STORE, whose sources are INDEX
    /// nodes naming each operand's first element (see [`TileOp`]).
    Tile(TileOp),
    // ---- tensor level ----
    /// A tensor-level input placeholder with the given shape (filled from argument `slot`).
    Param { slot: usize, shape: Vec<usize> },
    /// A realized tensor's host data (identity-compared), with its shape.
    Data { data: DataRef, shape: Vec<usize> },
    /// The positions `0, 1, .., n - 1` as a tensor of shape `[n]` in the node's dtype: a value
    /// computed from the index, never read from memory, so a comparison of positions (a causal
    /// or banded mask) stays an expression of the loop ranges the compiler can reason about.
    /// No sources.
    Arange(usize),
    /// `src[0]` viewed with a new shape of the same element count.
    Reshape(Vec<usize>),
    /// `src[0]` broadcast: axes of size 1 stretched to the given shape.
    Expand(Vec<usize>),
    /// `src[0]` with its axes reordered: output axis k is input axis `perm[k]`.
    Permute(Vec<usize>),
    /// `src[0]` restricted to `begin..end` on each axis.
    Shrink(Vec<(usize, usize)>),
    /// Reduction of the trailing `axes` axes of `src[0]`.
    Reduce { op: ReduceOp, axes: usize },
    /// Marks `src[0]` to be materialized into its own buffer.
    Stage,
    /// `src[0]`, through which gradients do not flow.
    Detach,
    /// `src[0]`, whose gradient with respect to `src[1]` is given by a rule (a tensor-level
    /// closure held in the `DataRef`) rather than by differentiating `src[0]`: for composite
    /// functions such as a series whose derivative has a closed form. Like DETACH, it only
    /// matters to autograd and is dropped before kernelizing.
    GradientRule(DataRef),
    /// The sources (all of one shape) stacked along a new leading axis.
    Stack,
    /// The output of a hand-written loop program over the sources (see [`CustomKernel`]).
    Custom(CustomKernel),
}

/// A tensor-level node computed by a given loop program instead of one derived from the graph:
/// a hand-written kernel (such as fused attention) placed in a graph, planned, cached and run
/// like the kernels the compiler cuts itself.
///
/// The program's BUFFER slot `i < n` reads source `i`, materialized contiguous and row-major
/// (`numel` of its shape); slot `n` is the output, `numel(shape)` elements of the node's dtype,
/// which the program must write completely (or slots `n ..` are the parts of the output, see
/// `output_parts`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct CustomKernel {
    /// The kernel's name in plans and debug output.
    pub name: String,
    /// The loop program.
    pub program: crate::UOp,
    /// The output shape.
    pub shape: Vec<usize>,
    /// Element counts of the program's output slots `n, n + 1, ..` when it writes several
    /// f32 outputs (the node's value is their concatenation, `shape` being its flat length);
    /// empty for the usual single output.
    pub output_parts: Vec<usize>,
    /// The same value as a graph of ordinary tensor ops over the same sources, if there is
    /// one: what autograd differentiates when there is no `vjp` (and a reference for tests).
    pub equivalent: Option<crate::UOp>,
    /// A gradient rule the tensor layer attached (opaque here, compared by identity), which
    /// autograd calls instead of differentiating `equivalent`.
    pub vjp: Option<DataRef>,
}

impl Op {
    /// True for ALU ops (including WHERE and CAST).
    pub fn is_alu(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast)
    }

    /// True for tensor-level movement ops.
    pub fn is_movement(&self) -> bool {
        matches!(self, Op::Reshape(_) | Op::Expand(_) | Op::Permute(_) | Op::Shrink(_))
    }

    /// Upper-case name, as printed.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Const(_) => "CONST",
            Op::Buffer { .. } => "BUFFER",
            Op::Alloc { .. } => "ALLOC",
            Op::Var { .. } => "VAR",
            Op::Range { .. } => "RANGE",
            Op::End => "END",
            Op::After => "AFTER",
            Op::Index => "INDEX",
            Op::Load => "LOAD",
            Op::Store => "STORE",
            Op::Sink => "SINK",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "NEG",
                UnaryOp::Exp2 => "EXP2",
                UnaryOp::Log2 => "LOG2",
                UnaryOp::Sqrt => "SQRT",
                UnaryOp::Recip => "RECIP",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "ADD",
                BinaryOp::Sub => "SUB",
                BinaryOp::Mul => "MUL",
                BinaryOp::Max => "MAX",
                BinaryOp::CmpLt => "CMPLT",
                BinaryOp::CmpNe => "CMPNE",
                BinaryOp::IDiv => "IDIV",
                BinaryOp::Mod => "MOD",
            },
            Op::Where => "WHERE",
            Op::Cast => "CAST",
            Op::Tile(TileOp::Gemm(_)) => "TILE_GEMM",
            Op::Tile(TileOp::SoftmaxUpdate { .. }) => "TILE_SOFTMAX",
            Op::Tile(TileOp::SoftmaxUpdateRounded { .. }) => "TILE_SOFTMAX_ROUNDED",
            Op::Tile(TileOp::SoftmaxRecompute { .. }) => "TILE_SOFTMAX_RECOMPUTE",
            Op::Tile(TileOp::SoftmaxGrad { .. }) => "TILE_SOFTMAX_GRAD",
            Op::Tile(TileOp::MaxSumExp { .. }) => "TILE_MAX_SUM_EXP",
            Op::Tile(TileOp::Convert { .. }) => "TILE_CONVERT",
            Op::Tile(TileOp::ExpRows { .. }) => "TILE_EXP_ROWS",
            Op::Tile(TileOp::Activation { .. }) => "TILE_ACTIVATION",
            Op::Tile(TileOp::ActivationGrad { .. }) => "TILE_ACTIVATION_GRAD",
            Op::Tile(TileOp::Softcap { .. }) => "TILE_SOFTCAP",
            Op::Tile(TileOp::ScoreRamp { .. }) => "TILE_SCORE_RAMP",
            Op::Param { .. } => "PARAM",
            Op::Arange(_) => "ARANGE",
            Op::Data { .. } => "DATA",
            Op::Reshape(_) => "RESHAPE",
            Op::Expand(_) => "EXPAND",
            Op::Permute(_) => "PERMUTE",
            Op::Shrink(_) => "SHRINK",
            Op::Reduce { .. } => "REDUCE",
            Op::Stage => "STAGE",
            Op::Detach => "DETACH",
            Op::GradientRule(_) => "GRADIENT_RULE",
            Op::Stack => "STACK",
            Op::Custom(_) => "CUSTOM",
        }
    }
}
