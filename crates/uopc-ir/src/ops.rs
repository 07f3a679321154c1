//! The operations a UOp node can carry, with their non-node arguments: axis kinds, ALU and
//! reduction ops, constants, host data, tile operations.

use crate::dtype::DType;
use crate::ids::{AllocSlot, BufferSlot, RangeId, VarSlot};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
pub use uopc_tile::GemmShape;

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

/// A dense operation on row-major tiles (the CPU's "tensor core"): each operand is a
/// `rows x cols` block starting at its INDEX, consecutive rows `ld` elements apart (extents and
/// strides count elements of the operand's own dtype). Operands are f32, except that a GEMM's A
/// and B may both be BF16 or both F16 (C stays f32): the operand dtypes, not the op, say which
/// kernel runs, so one descriptor serves all three and the expansion widens 16-bit operands
/// with an explicit CAST; and the P tile of [`TileOp::SoftmaxUpdateRounded`] is BF16 or F16
/// (or its F32 score tile itself); a [`TileOp::Convert`] takes a 16-bit and an F32 block.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TileOp {
    /// `C = A · B`, or `C += A · B` with `accumulate`. Sources `[A, B, C]`. A is `m x k`
    /// (stored `k x m` when `a_trans`), B is `k x n` (stored `n x k` when `b_trans`), C is `m x n`.
    /// The descriptor is the micro-kernel's own ([`GemmShape`]), so the IR, its reference
    /// expansion and the kernel it calls cannot disagree on a field.
    Gemm(GemmShape),
    /// One online-softmax step of FlashAttention-2 on a score tile. Sources
    /// `[S, row_max, row_sum, O]`: S is `rows x cols` (stride `lds`) of base-2 scores before
    /// the factor `scale`, row_max and row_sum hold `rows` values, O is `rows x d` (stride
    /// `ldo`). Per row, with `x = scale * S`: `m' = max(m, max_j x)`, `a = exp2(m - m')`,
    /// `S = exp2(x - m')` (S becomes P), `l = l a + sum_j P`, `O *= a`, `m = m'`. A row whose
    /// scaled scores and max are all `-inf` keeps `l` and `O` and gets `P = 0`. A factor lets
    /// the score GEMM read unscaled queries in place; see `uopc_tile::softmax_update_scaled`.
    SoftmaxUpdate {
        /// Rows of S and O.
        rows: usize,
        /// Keys in the tile.
        cols: usize,
        /// Row stride of S.
        lds: usize,
        /// Columns of O touched.
        d: usize,
        /// Row stride of O.
        ldo: usize,
        /// The factor applied to every score, as `f32::to_bits` (1.0's bits when the scores
        /// come scaled).
        scale: u32,
    },
    /// The online-softmax step of 16-bit attention. Sources `[S, row_max, row_sum, O, P]`:
    /// S (f32, `rows x cols`, stride `lds`) holds unscaled scores; P (`rows x cols`, stride
    /// `ldp`) is only written, either a tile of dtype `round_to` (then S is only read) or S
    /// itself (the same INDEX node, F32, `ldp == lds`: the rounded values replace the scores,
    /// for a `P · V` GEMM that reads an f32 A in place); row_max, row_sum and O as in
    /// [`TileOp::SoftmaxUpdate`]. Per row, with `x = scale * S` (`scale` is an f32's bits, so
    /// the op stays `Eq` and `Hash`): `m' = max(m, max_j x)`, `a = exp2(m - m')`,
    /// `P = round(exp2(x - m'))` to `round_to`, `l = l a + sum_j P` (the rounded weights the
    /// `P · V` GEMM applies), `O *= a`, `m = m'`. A row whose scaled scores and max are all
    /// `-inf` keeps `l` and `O` and gets `P = 0`. See `uopc_tile::softmax_update_rounded` and
    /// `uopc_tile::softmax_update_rounded_in_place`.
    SoftmaxUpdateRounded {
        /// Rows of S, P and O.
        rows: usize,
        /// Keys in the tile.
        cols: usize,
        /// Row stride of S.
        lds: usize,
        /// Columns of O touched.
        d: usize,
        /// Row stride of O.
        ldo: usize,
        /// Row stride of P.
        ldp: usize,
        /// The factor applied to every score, as `f32::to_bits`.
        scale: u32,
        /// The 16-bit type every probability is rounded to (BF16 or F16): P's own dtype, or
        /// the values an F32 P holds.
        round_to: DType,
    },
    /// The probabilities of a score tile recomputed from the per-row base-2 log-sum-exp (the
    /// backward pass of attention). Sources `[S, lse]`: S is `rows x cols` (stride `ld`) of
    /// base-2 scores, lse holds `rows` values. Per row: `S = exp2(S - lse)` (S becomes P), and
    /// a row with `lse = -inf` (it saw no key) gets `P = 0`. See `uopc_tile::softmax_recompute`.
    SoftmaxRecompute {
        /// Rows of S.
        rows: usize,
        /// Keys in the tile.
        cols: usize,
        /// Row stride of S.
        ld: usize,
    },
    /// A dtype conversion of a block. Sources `[S, D]`: S (`rows x cols`, stride `lds`) is
    /// read, D (`rows x cols`, stride `ldd`) is written: `D = S` in D's dtype, BF16 or F16
    /// widened exactly to F32, or F32 rounded to nearest even to BF16 or F16 (the rounding of
    /// a CAST). Generated code converts 16-bit values four at a time with integer operations;
    /// this op converts a whole block with the CPU's conversion instructions. See
    /// `uopc_tile::convert::convert_block`.
    Convert {
        /// Rows of S and D.
        rows: usize,
        /// Elements per row.
        cols: usize,
        /// Row stride of S.
        lds: usize,
        /// Row stride of D.
        ldd: usize,
    },
    /// The softmax gradient of a tile. Sources `[P, dP, delta]`: P and dP are `rows x cols`
    /// (stride `ld`), delta holds `rows` values. `dP = P * (dP - delta)` per row, exactly 0
    /// where `P == 0` (a key outside the softmax leaks no NaN). See `uopc_tile::softmax_grad`.
    SoftmaxGrad {
        /// Rows of the tiles.
        rows: usize,
        /// Keys in the tile.
        cols: usize,
        /// Row stride of P and dP.
        ld: usize,
    },
    /// One online step of a row logsumexp over a block read in place. Sources
    /// `[X, row_max, row_sum]`: X is `rows x cols` (stride `ld`) and only read, row_max and
    /// row_sum hold `rows` values. Per row, with `c` the f32 whose bits are `scale`:
    /// `m' = max(m, max_j X)` (a NaN in `m` or the row gives NaN), `l = l a + sum_j exp2(c (X -
    /// m'))` with `a = exp2(c (m - m'))`, but `a = 1` when `m == m'`, and a row with `m' = -inf`
    /// keeps `l`; then `m = m'`. The maximum stays in X's units, so fed a row in blocks from
    /// `(-inf, 0)` the state ends at the row's exact maximum and its shifted sum of
    /// exponentials. See `uopc_tile::max_sum_exp`.
    MaxSumExp {
        /// Rows of X.
        rows: usize,
        /// Elements of each row taken.
        cols: usize,
        /// Row stride of X.
        ld: usize,
        /// The factor of every exponent, as `f32::to_bits` (so the op stays `Eq` and `Hash`).
        scale: u32,
    },
    /// The shifted exponential of a block of rows into another block. Sources `[X, shift, Y]`:
    /// X is `rows x cols` (stride `ldx`) and only read, shift holds `rows` values, Y is
    /// `rows x cols` (stride `ldy`) and only written. Per element, with `c` the f32 whose bits
    /// are `scale`: `Y = exp2(c (X - shift[r]))`, the exponent formed as written (the
    /// difference, then the product), so a softmax's second pass over rows whose state
    /// [`TileOp::MaxSumExp`] found computes what the loop would. See `uopc_tile::exp_rows`.
    ExpRows {
        /// Rows of X and Y.
        rows: usize,
        /// Elements of each row.
        cols: usize,
        /// Row stride of X.
        ldx: usize,
        /// Row stride of Y.
        ldy: usize,
        /// The factor of every exponent, as `f32::to_bits`.
        scale: u32,
    },
}

/// How a [`TileOp`] uses one of its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileOperand {
    /// Elements from the operand's first one to one past the last it may touch.
    pub extent: usize,
    /// Read by the op.
    pub reads: bool,
    /// Written by the op.
    pub writes: bool,
}

/// Elements a `rows x cols` block with row stride `ld` spans (0 when empty).
pub fn block_extent(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 { 0 } else { (rows - 1).saturating_mul(ld).saturating_add(cols) }
}

impl TileOp {
    /// The operands, in source order.
    pub fn operands(&self) -> Vec<TileOperand> {
        let op = |extent, reads, writes| TileOperand { extent, reads, writes };
        match *self {
            TileOp::Gemm(g @ GemmShape { m, n, k, lda, ldb, ldc, accumulate, .. }) => {
                let (ar, ac) = g.a_dims();
                // A B in panels: one stored row of `k * w` per panel.
                let (br, bc) = g.b_dims();
                let none = m == 0 || n == 0 || k == 0;
                vec![
                    op(if none { 0 } else { block_extent(ar, ac, lda) }, true, false),
                    op(if none { 0 } else { block_extent(br, bc, ldb) }, true, false),
                    op(block_extent(m, n, ldc), accumulate, true),
                ]
            }
            TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo, .. } => vec![
                op(block_extent(rows, cols, lds), true, true),
                op(rows, true, true),
                op(rows, true, true),
                op(block_extent(rows, d, ldo), true, true),
            ],
            TileOp::SoftmaxUpdateRounded { rows, cols, lds, d, ldo, ldp, .. } => vec![
                op(block_extent(rows, cols, lds), true, false),
                op(rows, true, true),
                op(rows, true, true),
                op(block_extent(rows, d, ldo), true, true),
                op(block_extent(rows, cols, ldp), false, true),
            ],
            TileOp::SoftmaxRecompute { rows, cols, ld } => {
                vec![
                    op(block_extent(rows, cols, ld), true, true),
                    op(if cols == 0 { 0 } else { rows }, true, false),
                ]
            }
            TileOp::SoftmaxGrad { rows, cols, ld } => vec![
                op(block_extent(rows, cols, ld), true, false),
                op(block_extent(rows, cols, ld), true, true),
                op(if cols == 0 { 0 } else { rows }, true, false),
            ],
            TileOp::MaxSumExp { rows, cols, ld, .. } => {
                // With no columns the op touches nothing, not even the running state.
                let state = if cols == 0 { 0 } else { rows };
                vec![
                    op(block_extent(rows, cols, ld), true, false),
                    op(state, true, true),
                    op(state, true, true),
                ]
            }
            TileOp::Convert { rows, cols, lds, ldd } => {
                vec![
                    op(block_extent(rows, cols, lds), true, false),
                    op(block_extent(rows, cols, ldd), false, true),
                ]
            }
            TileOp::ExpRows { rows, cols, ldx, ldy, .. } => vec![
                op(block_extent(rows, cols, ldx), true, false),
                op(if cols == 0 { 0 } else { rows }, true, false),
                op(block_extent(rows, cols, ldy), false, true),
            ],
        }
    }

    /// Rows and columns of each stored operand with its row stride, in source order.
    pub fn blocks(&self) -> Vec<(usize, usize, usize)> {
        match *self {
            TileOp::Gemm(g @ GemmShape { m, n, lda, ldb, ldc, .. }) => {
                let ((ar, ac), (br, bc)) = (g.a_dims(), g.b_dims());
                vec![(ar, ac, lda), (br, bc, ldb), (m, n, ldc)]
            }
            TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo, .. } => {
                vec![(rows, cols, lds), (1, rows, rows), (1, rows, rows), (rows, d, ldo)]
            }
            TileOp::SoftmaxUpdateRounded { rows, cols, lds, d, ldo, ldp, .. } => {
                vec![(rows, cols, lds), (1, rows, rows), (1, rows, rows), (rows, d, ldo), (rows, cols, ldp)]
            }
            TileOp::SoftmaxRecompute { rows, cols, ld } => vec![(rows, cols, ld), (1, rows, rows)],
            TileOp::SoftmaxGrad { rows, cols, ld } => {
                vec![(rows, cols, ld), (rows, cols, ld), (1, rows, rows)]
            }
            TileOp::MaxSumExp { rows, cols, ld, .. } => {
                vec![(rows, cols, ld), (1, rows, rows), (1, rows, rows)]
            }
            TileOp::Convert { rows, cols, lds, ldd } => vec![(rows, cols, lds), (rows, cols, ldd)],
            TileOp::ExpRows { rows, cols, ldx, ldy, .. } => {
                vec![(rows, cols, ldx), (1, rows, rows), (rows, cols, ldy)]
            }
        }
    }

    /// Floating-point operations of one execution (an exp2 counted as one).
    pub fn flops(&self) -> u64 {
        match *self {
            TileOp::Gemm(GemmShape { m, n, k, .. }) => 2 * (m * n * k) as u64,
            TileOp::SoftmaxUpdate { rows, cols, d, .. } => (rows * (4 * cols + d + 4)) as u64,
            // The scaling multiply per score besides the f32 step's work.
            TileOp::SoftmaxUpdateRounded { rows, cols, d, .. } => (rows * (5 * cols + d + 4)) as u64,
            TileOp::SoftmaxRecompute { rows, cols, .. } => (2 * rows * cols) as u64,
            TileOp::SoftmaxGrad { rows, cols, .. } => (2 * rows * cols) as u64,
            // Per element a maximum, a subtraction, the scaling and the sum's addition.
            TileOp::MaxSumExp { rows, cols, .. } => (5 * rows * cols) as u64,
            // A conversion is no arithmetic.
            TileOp::Convert { .. } => 0,
            // A subtraction, the scaling and the exponential per element.
            TileOp::ExpRows { rows, cols, .. } => (3 * rows * cols) as u64,
        }
    }
}
