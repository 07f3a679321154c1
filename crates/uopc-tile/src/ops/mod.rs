//! The tile ops, one descriptor each, owned by the crate whose micro-kernels run them: the
//! fields of a call, the operands it reads and writes ([`TileOp::operands`]), its work
//! ([`TileOp::flops`]), and the flat arguments of the `extern "C"` entry generated code calls
//! ([`TileOp::call`], [`TileEntry`]). The IR's tile op is [`TileOp`] itself; its verifier, its
//! interpreter and the JIT's call read it from here, so a new tile op is its variant here, its
//! micro-kernel and its row of [`TileEntry`].

use std::fmt;

use crate::convert::conversion_code;
use crate::gemm::GemmDesc;
use crate::shapes::GemmShape;

/// The element type of a tile operand: it picks a GEMM's kernel and a conversion's direction.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Elem {
    /// f32.
    F32,
    /// bf16.
    Bf16,
    /// IEEE half precision.
    F16,
}

/// A 16-bit floating-point type, which a rounded softmax step rounds its probabilities to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Half {
    /// bf16.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl fmt::Display for Half {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Half::Bf16 => "bf16",
            Half::F16 => "f16",
        })
    }
}

/// A dense operation on row-major tiles (the CPU's "tensor core"), the descriptor of one call
/// of this crate's micro-kernels: each operand is a `rows x cols` block, consecutive rows `ld`
/// elements apart (extents and strides count elements of the operand's own type). Operands are
/// f32, except that a GEMM's A and B may be 16-bit (C stays f32): the operand types, not the
/// op, say which kernel runs ([`TileOp::call`]), so one descriptor serves them all; the P tile
/// of [`TileOp::SoftmaxUpdateRounded`] is BF16 or F16 (or its F32 score tile itself); a
/// [`TileOp::Convert`] takes a 16-bit and an F32 block. The IR's tile op is this type: its
/// verifier reads [`TileOp::operands`], its interpreter the fields, and the JIT passes
/// [`TileOp::call`]'s arguments to the entry it names.
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
        /// The 16-bit type every probability is rounded to: P's own type, or the values an
        /// F32 P holds.
        round_to: Half,
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
    /// An activation function in place over a block. Sources `[X]`: X is `rows x cols`
    /// (stride `ld`), read and written: `X = kind(X)` per element, with the formulas of
    /// [`crate::Activation`] (`x sigmoid(z)`, the sigmoid through `exp2(-|z| log2 e)`, or
    /// exact GELU's `x Phi(x)`).
    /// See `uopc_tile::activate`.
    Activation {
        /// Rows of X.
        rows: usize,
        /// Elements of each row.
        cols: usize,
        /// Row stride of X.
        ld: usize,
        /// The function.
        kind: crate::Activation,
    },
    /// Logit soft-capping in place over a block. Sources `[X]`: X is `rows x cols` (stride
    /// `ld`), read and written: `X = outer tanh(inner X)` per element, with `inner` and `outer`
    /// the f32s whose bits the fields hold, tanh as `(1 - e) / (1 + e)`, `e = exp2(-2 log2(e)
    /// |inner X|)`, given the sign of `inner X`. See `uopc_tile::softcap`.
    Softcap {
        /// Rows of X.
        rows: usize,
        /// Elements of each row.
        cols: usize,
        /// Row stride of X.
        ld: usize,
        /// The factor inside the tanh, as `f32::to_bits`.
        inner: u32,
        /// The factor of the result, as `f32::to_bits`.
        outer: u32,
    },
    /// A score tile's scale and a bias linear in the positions, in place (ALiBi's `slope (k -
    /// q)`). Sources `[S, slope, origin]`: S is `rows x cols` (stride `ld`), read and written;
    /// slope and origin hold one f32 each, only read. Per element of row `r`, column `j`:
    /// `S = scale S + c (origin + j - r)` with `c = slope_scale * slope`, in f32 as
    /// `fma(scale, S, fma(c, j, c (origin - r)))`. See `uopc_tile::score_ramp`.
    ScoreRamp {
        /// Rows of S.
        rows: usize,
        /// Elements of each row.
        cols: usize,
        /// Row stride of S.
        ld: usize,
        /// The factor of every score, as `f32::to_bits`.
        scale: u32,
        /// The factor of the slope operand, as `f32::to_bits`.
        slope_scale: u32,
    },
    /// The backward of [`TileOp::Activation`]: a gradient block scaled by the derivative at
    /// the saved input. Sources `[X, G]`: X is `rows x cols` (stride `ldx`) and only read, G
    /// (stride `ldg`) is read and written: `G = G * kind'(X)`, with the formulas of
    /// `uopc_tile::activate_grad`.
    ActivationGrad {
        /// Rows of X and G.
        rows: usize,
        /// Elements of each row.
        cols: usize,
        /// Row stride of X.
        ldx: usize,
        /// Row stride of G.
        ldg: usize,
        /// The function whose derivative is taken.
        kind: crate::Activation,
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
            TileOp::Activation { rows, cols, ld, .. } | TileOp::Softcap { rows, cols, ld, .. } => {
                vec![op(block_extent(rows, cols, ld), true, true)]
            }
            TileOp::ScoreRamp { rows, cols, ld, .. } => {
                let scalar = usize::from(rows > 0 && cols > 0);
                vec![
                    op(block_extent(rows, cols, ld), true, true),
                    op(scalar, true, false),
                    op(scalar, true, false),
                ]
            }
            TileOp::ActivationGrad { rows, cols, ldx, ldg, .. } => {
                vec![
                    op(block_extent(rows, cols, ldx), true, false),
                    op(block_extent(rows, cols, ldg), true, true),
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
            TileOp::Activation { rows, cols, ld, .. } | TileOp::Softcap { rows, cols, ld, .. } => {
                vec![(rows, cols, ld)]
            }
            TileOp::ScoreRamp { rows, cols, ld, .. } => vec![(rows, cols, ld), (1, 1, 1), (1, 1, 1)],
            TileOp::ActivationGrad { rows, cols, ldx, ldg, .. } => vec![(rows, cols, ldx), (rows, cols, ldg)],
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
            // The two products inside, the exponential, the difference, sum and division, and
            // the product with `outer`.
            TileOp::Softcap { rows, cols, .. } => (7 * rows * cols) as u64,
            // Two multiply-adds per element.
            TileOp::ScoreRamp { rows, cols, .. } => (4 * rows * cols) as u64,
            // The sigmoid's negation, scaling, exponential, sum, division, select and the
            // product with x; GELU's argument adds two products, a multiply-add and a scaling.
            // Exact GELU: two polynomials (14 multiply-adds), the tail's division and
            // exponential, four selects and the product.
            TileOp::Activation { rows, cols, kind, .. } => {
                let per = match kind {
                    crate::Activation::GeluTanh => 11,
                    crate::Activation::Silu => 7,
                    crate::Activation::Gelu => 30,
                };
                (per * rows * cols) as u64
            }
            // The forward's sigmoid, its slope, the derivative's multiply-add and the product
            // with G; GELU's argument and its derivative add five; exact GELU's forward adds
            // the density's exponential, a product and a multiply-add.
            TileOp::ActivationGrad { rows, cols, kind, .. } => {
                let per = match kind {
                    crate::Activation::GeluTanh => 15,
                    crate::Activation::Silu => 10,
                    crate::Activation::Gelu => 36,
                };
                (per * rows * cols) as u64
            }
        }
    }
}

/// An `extern "C"` entry point of this crate that generated code calls: every parameter an
/// integer register (the operands' addresses, then the descriptor's fields), returning a
/// status. [`TileEntry::address`] is where it is in this process.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TileEntry {
    /// `uopc_tile_gemm_f32`: f32 A and B.
    Gemm,
    /// `uopc_tile_gemm_bf16`: bf16 A and B.
    GemmBf16,
    /// `uopc_tile_gemm_f16`: f16 A and B.
    GemmF16,
    /// `uopc_tile_gemm_f32_f16`: f32 A, f16 B.
    GemmF32F16,
    /// `uopc_tile_gemm_f32_bf16`: f32 A, bf16 B.
    GemmF32Bf16,
    /// `uopc_tile_gemm_f16_f32`: f16 A, f32 B.
    GemmF16F32,
    /// `uopc_tile_gemm_bf16_f32`: bf16 A, f32 B.
    GemmBf16F32,
    /// `uopc_tile_gemm_bf16_rounded`: bf16 A and B, C rounded to bf16.
    GemmBf16Rounded,
    /// `uopc_tile_gemm_f16_rounded`: f16 A and B, C rounded to f16.
    GemmF16Rounded,
    /// `uopc_tile_softmax_update_f32`.
    SoftmaxUpdate,
    /// `uopc_tile_softmax_update_rounded`: P in a 16-bit tile of its own.
    SoftmaxUpdateRounded,
    /// `uopc_tile_softmax_update_rounded_in_place`: P over the f32 scores.
    SoftmaxUpdateRoundedInPlace,
    /// `uopc_tile_softmax_recompute_f32`.
    SoftmaxRecompute,
    /// `uopc_tile_softmax_grad_f32`.
    SoftmaxGrad,
    /// `uopc_tile_max_sum_exp_f32`.
    MaxSumExp,
    /// `uopc_tile_convert_block`.
    Convert,
    /// `uopc_tile_exp_rows_f32`.
    ExpRows,
    /// `uopc_tile_activation_f32`.
    Activation,
    /// `uopc_tile_activation_grad_f32`.
    ActivationGrad,
    /// `uopc_tile_softcap_f32`.
    Softcap,
    /// `uopc_tile_score_ramp_f32`.
    ScoreRamp,
}

impl TileEntry {
    /// Every entry, each once, in the order they were added (the order a JIT declares them,
    /// which its printed functions number).
    pub const ALL: [TileEntry; 21] = [
        TileEntry::Gemm,
        TileEntry::SoftmaxUpdate,
        TileEntry::SoftmaxRecompute,
        TileEntry::SoftmaxGrad,
        TileEntry::GemmBf16,
        TileEntry::GemmF16,
        TileEntry::SoftmaxUpdateRounded,
        TileEntry::GemmF32F16,
        TileEntry::GemmF32Bf16,
        TileEntry::MaxSumExp,
        TileEntry::SoftmaxUpdateRoundedInPlace,
        TileEntry::Convert,
        TileEntry::ExpRows,
        TileEntry::GemmF16F32,
        TileEntry::GemmBf16F32,
        TileEntry::Activation,
        TileEntry::ActivationGrad,
        TileEntry::GemmBf16Rounded,
        TileEntry::GemmF16Rounded,
        TileEntry::Softcap,
        TileEntry::ScoreRamp,
    ];

    /// The symbol it is exported and registered under.
    pub fn symbol(self) -> &'static str {
        self.row().0
    }

    /// Its parameters: operand addresses, then integer fields (the call's arity).
    pub fn params(self) -> usize {
        let (_, operands, fields) = self.row();
        operands + fields
    }

    /// Symbol, operand count and field count: the one table of the entries' signatures, which
    /// [`TileOp::call`] fills (a test checks every entry against it).
    fn row(self) -> (&'static str, usize, usize) {
        match self {
            TileEntry::Gemm => ("uopc_tile_gemm_f32", 3, GEMM_FIELDS),
            TileEntry::GemmBf16 => ("uopc_tile_gemm_bf16", 3, GEMM_FIELDS),
            TileEntry::GemmF16 => ("uopc_tile_gemm_f16", 3, GEMM_FIELDS),
            TileEntry::GemmF32F16 => ("uopc_tile_gemm_f32_f16", 3, GEMM_FIELDS),
            TileEntry::GemmF32Bf16 => ("uopc_tile_gemm_f32_bf16", 3, GEMM_FIELDS),
            TileEntry::GemmF16F32 => ("uopc_tile_gemm_f16_f32", 3, GEMM_FIELDS),
            TileEntry::GemmBf16F32 => ("uopc_tile_gemm_bf16_f32", 3, GEMM_FIELDS),
            TileEntry::GemmBf16Rounded => ("uopc_tile_gemm_bf16_rounded", 3, GEMM_FIELDS),
            TileEntry::GemmF16Rounded => ("uopc_tile_gemm_f16_rounded", 3, GEMM_FIELDS),
            // rows, cols, lds, ldo, d, scale
            TileEntry::SoftmaxUpdate => ("uopc_tile_softmax_update_f32", 4, 6),
            // rows, cols, lds, ldo, d, ldp, scale, is_f16
            TileEntry::SoftmaxUpdateRounded => ("uopc_tile_softmax_update_rounded", 5, 8),
            // rows, cols, lds, ldo, d, scale, is_f16
            TileEntry::SoftmaxUpdateRoundedInPlace => ("uopc_tile_softmax_update_rounded_in_place", 4, 7),
            // rows, cols, ld
            TileEntry::SoftmaxRecompute => ("uopc_tile_softmax_recompute_f32", 2, 3),
            // rows, cols, ld
            TileEntry::SoftmaxGrad => ("uopc_tile_softmax_grad_f32", 3, 3),
            // rows, cols, ld, scale
            TileEntry::MaxSumExp => ("uopc_tile_max_sum_exp_f32", 3, 4),
            // rows, cols, lds, ldd, conversion code
            TileEntry::Convert => ("uopc_tile_convert_block", 2, 5),
            // rows, cols, ldx, ldy, scale
            TileEntry::ExpRows => ("uopc_tile_exp_rows_f32", 3, 5),
            // rows, cols, ld, activation code
            TileEntry::Activation => ("uopc_tile_activation_f32", 1, 4),
            // rows, cols, ldx, ldg, activation code
            TileEntry::ActivationGrad => ("uopc_tile_activation_grad_f32", 2, 5),
            // rows, cols, ld, inner, outer
            TileEntry::Softcap => ("uopc_tile_softcap_f32", 1, 5),
            // rows, cols, ld, scale, slope_scale
            TileEntry::ScoreRamp => ("uopc_tile_score_ramp_f32", 3, 5),
        }
    }
}

/// The integer fields of a GEMM entry: [`GemmDesc`]'s seven.
const GEMM_FIELDS: usize = 7;

/// One call of a tile op's micro-kernel from generated code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileCall {
    /// The entry point called.
    pub entry: TileEntry,
    /// How many of the op's operands, from the first in source order, the entry takes (their
    /// addresses are its first arguments).
    pub operands: usize,
    /// The arguments after the addresses: the descriptor's fields, in the entry's order.
    pub fields: Vec<i64>,
}

impl TileOp {
    /// The entry that runs this op on operands of types `elems` (in source order, as the IR's
    /// verifier allowed them) and the arguments it takes: the kernel is picked by the operand
    /// types where the op has several (a GEMM's A and B, a conversion's direction, a rounded
    /// softmax step whose P is the f32 score tile itself).
    pub fn call(&self, elems: &[Elem]) -> TileCall {
        let elem = |i: usize| elems.get(i).copied().unwrap_or(Elem::F32);
        let usize_field = |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
        let call = |entry, operands, fields: &[usize]| TileCall {
            entry,
            operands,
            fields: fields.iter().map(|&x| usize_field(x)).collect(),
        };
        match *self {
            TileOp::Gemm(shape) => {
                let g = GemmDesc::from(&shape);
                let entry = match (elem(0), elem(1)) {
                    (Elem::Bf16, Elem::Bf16) if elem(2) == Elem::Bf16 => TileEntry::GemmBf16Rounded,
                    (Elem::F16, Elem::F16) if elem(2) == Elem::F16 => TileEntry::GemmF16Rounded,
                    (Elem::Bf16, Elem::F32) => TileEntry::GemmBf16F32,
                    (Elem::F16, Elem::F32) => TileEntry::GemmF16F32,
                    (Elem::Bf16, _) => TileEntry::GemmBf16,
                    (Elem::F16, _) => TileEntry::GemmF16,
                    (_, Elem::F16) => TileEntry::GemmF32F16,
                    (_, Elem::Bf16) => TileEntry::GemmF32Bf16,
                    _ => TileEntry::Gemm,
                };
                TileCall { entry, operands: 3, fields: vec![g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.flags] }
            }
            TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo, scale } => {
                let mut c = call(TileEntry::SoftmaxUpdate, 4, &[rows, cols, lds, ldo, d]);
                c.fields.push(i64::from(scale));
                c
            }
            TileOp::SoftmaxUpdateRounded { rows, cols, lds, d, ldo, ldp, scale, round_to } => {
                // P (the fifth operand) of f32 is the score tile itself: the in-place entry,
                // which takes no P.
                let mut c = if elem(4) == Elem::F32 {
                    call(TileEntry::SoftmaxUpdateRoundedInPlace, 4, &[rows, cols, lds, ldo, d])
                } else {
                    call(TileEntry::SoftmaxUpdateRounded, 5, &[rows, cols, lds, ldo, d, ldp])
                };
                c.fields.extend([i64::from(scale), i64::from(round_to == Half::F16)]);
                c
            }
            TileOp::SoftmaxRecompute { rows, cols, ld } => {
                call(TileEntry::SoftmaxRecompute, 2, &[rows, cols, ld])
            }
            TileOp::SoftmaxGrad { rows, cols, ld } => call(TileEntry::SoftmaxGrad, 3, &[rows, cols, ld]),
            TileOp::MaxSumExp { rows, cols, ld, scale } => {
                let mut c = call(TileEntry::MaxSumExp, 3, &[rows, cols, ld]);
                c.fields.push(i64::from(scale));
                c
            }
            TileOp::Convert { rows, cols, lds, ldd } => {
                let code = match (elem(0), elem(1)) {
                    (Elem::F16, _) => conversion_code::F16_TO_F32,
                    (Elem::Bf16, _) => conversion_code::BF16_TO_F32,
                    (_, Elem::F16) => conversion_code::F32_TO_F16,
                    _ => conversion_code::F32_TO_BF16,
                };
                let mut c = call(TileEntry::Convert, 2, &[rows, cols, lds, ldd]);
                c.fields.push(code);
                c
            }
            TileOp::ExpRows { rows, cols, ldx, ldy, scale } => {
                let mut c = call(TileEntry::ExpRows, 3, &[rows, cols, ldx, ldy]);
                c.fields.push(i64::from(scale));
                c
            }
            TileOp::Activation { rows, cols, ld, kind } => {
                let mut c = call(TileEntry::Activation, 1, &[rows, cols, ld]);
                c.fields.push(kind.code());
                c
            }
            TileOp::Softcap { rows, cols, ld, inner, outer } => {
                let mut c = call(TileEntry::Softcap, 1, &[rows, cols, ld]);
                c.fields.extend([i64::from(inner), i64::from(outer)]);
                c
            }
            TileOp::ScoreRamp { rows, cols, ld, scale, slope_scale } => {
                let mut c = call(TileEntry::ScoreRamp, 3, &[rows, cols, ld]);
                c.fields.extend([i64::from(scale), i64::from(slope_scale)]);
                c
            }
            TileOp::ActivationGrad { rows, cols, ldx, ldg, kind } => {
                let mut c = call(TileEntry::ActivationGrad, 2, &[rows, cols, ldx, ldg]);
                c.fields.push(kind.code());
                c
            }
        }
    }
}

#[cfg(test)]
mod tests;
