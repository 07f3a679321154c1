//! What the tile ops' micro-kernels (under `x86`) and their front ends share: the shapes of
//! a GEMM tile and of the softmax and score-tile steps, the constants of the vector `exp2`, and the NaN check the
//! updates take before a shortcut. A leaf: it imports nothing of the crate but its errors.

use crate::TileError;
use crate::error::span;

/// Polynomial coefficients `c0..c6` of `2^f ≈ sum c_i f^i` on `[-0.5, 0.5]` (minimax relative
/// error, rounded to f32). Decimal values: 1, 0.693147182, 0.240226462, 0.0555032864,
/// 0.00961848907, 0.00133999309, 0.000153458124.
pub(crate) const EXP2_C: [f32; 7] = [
    1.0,
    f32::from_bits(0x3f31_7218),
    f32::from_bits(0x3e75_fded),
    f32::from_bits(0x3d63_576a),
    f32::from_bits(0x3c1d_96de),
    f32::from_bits(0x3aaf_a2b5),
    f32::from_bits(0x3920_e99a),
];
/// Polynomial coefficients `c0..c6` of `2^f ≈ sum c_i f^i` on `[0, 1)` (minimax relative
/// error with `c0 = 1`, rounded to f32): the AVX-512 `exp2`, which reduces `x` to its
/// fraction above `floor(x)` rather than to the nearest integer. Decimal values: 1,
/// 0.693147063, 0.240229309, 0.0554852821, 0.00967544969, 0.00124678633, 0.000216128523.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const EXP2_UNIT_C: [f32; 7] = [
    1.0,
    f32::from_bits(0x3f31_7216),
    f32::from_bits(0x3e75_feac),
    f32::from_bits(0x3d63_4489),
    f32::from_bits(0x3c1e_85c7),
    f32::from_bits(0x3aa3_6b35),
    f32::from_bits(0x3962_a08f),
];
/// Lower clamp of the vector `exp2`'s argument, keeping `n + 127` a valid biased exponent.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const EXP2_LO: f32 = -127.0;
/// Upper clamp: `n = 128` is the exponent pattern of infinity.
pub(crate) const EXP2_HI: f32 = 128.0;
/// `exp2(x)` is exactly 0 for `x <= EXP2_ZERO_BELOW` (and NaN), rather than a subnormal.
pub(crate) const EXP2_ZERO_BELOW: f32 = -126.5;

/// Shape of one softmax update: `S` is `rows x cols` (leading dimension `lds`), `O` is
/// `rows x d` (leading dimension `ldo`); `row_max` and `row_sum` hold `rows` floats each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SoftmaxShape {
    /// Rows of S and O (queries in the block).
    pub rows: usize,
    /// Columns of S (keys in the block).
    pub cols: usize,
    /// Leading dimension of S.
    pub lds: usize,
    /// Leading dimension of O.
    pub ldo: usize,
    /// Columns of O (the head dimension).
    pub d: usize,
}

impl SoftmaxShape {
    /// A shape with dense rows (`lds = cols`, `ldo = d`).
    pub fn dense(rows: usize, cols: usize, d: usize) -> SoftmaxShape {
        SoftmaxShape { rows, cols, lds: cols, ldo: d, d }
    }

    /// Elements `[s, o]` that S and O span (minimum slice lengths).
    ///
    /// # Errors
    ///
    /// [`TileError::LeadingDim`] when `lds < cols` or `ldo < d` with two or more rows;
    /// [`TileError::Overflow`] when an extent does not fit in `usize`.
    pub fn extents(&self) -> Result<[usize; 2], TileError> {
        Ok([span("s", self.rows, self.cols, self.lds)?, span("o", self.rows, self.d, self.ldo)?])
    }
}

/// Shape of one elementwise score-tile step: `rows x cols` tiles with row stride `ld`, and
/// `rows` per-row scalars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScoreTileShape {
    /// Rows of the tiles (queries in the block).
    pub rows: usize,
    /// Columns (keys in the block).
    pub cols: usize,
    /// Row stride of every tile operand.
    pub ld: usize,
}

impl ScoreTileShape {
    /// A shape with dense rows (`ld = cols`).
    pub fn dense(rows: usize, cols: usize) -> ScoreTileShape {
        ScoreTileShape { rows, cols, ld: cols }
    }

    /// Elements one tile operand spans (its minimum slice length).
    ///
    /// # Errors
    ///
    /// [`TileError::LeadingDim`] when `ld < cols` with two or more rows;
    /// [`TileError::Overflow`] when the extent does not fit in `usize`.
    pub fn extent(&self) -> Result<usize, TileError> {
        span("s", self.rows, self.cols, self.ld)
    }

    /// The shape a flat C entry's `i64` sizes give, with its extent, or `None` when a size is
    /// negative or the extent is invalid.
    pub(crate) fn from_flat(rows: i64, cols: i64, ld: i64) -> Option<(ScoreTileShape, usize)> {
        let u = |x: i64| usize::try_from(x).ok();
        let sh = ScoreTileShape { rows: u(rows)?, cols: u(cols)?, ld: u(ld)? };
        let n = sh.extent().ok()?;
        Some((sh, n))
    }
}

/// Whether `scale * row[j]` is NaN for some `j < cols`.
///
/// Every update's row maximum skips NaN, so a row whose block held a NaN score among only
/// `-inf`s (masked keys) would look like one that has seen nothing yet; the updates ask this
/// before taking that shortcut, and take the general path instead, where `-inf - -inf` makes
/// the row NaN throughout. Only such rows ask, so it is scalar on every ISA (written without
/// an early exit, so that it vectorizes).
///
/// # Safety
///
/// `row` is readable for `cols` floats.
pub(crate) unsafe fn any_scaled_nan(row: *const f32, cols: usize, scale: f32) -> bool {
    // SAFETY: the caller's contract.
    let row = unsafe { std::slice::from_raw_parts(row, cols) };
    row.iter().fold(false, |any, &x| any | (x * scale).is_nan())
}

/// Columns of one pair panel ([`GemmShape::b_pair_panels`]).
pub const PAIR_PANEL_WIDTH: usize = 32;
/// k rows of one step of a pair panel.
const PAIR_PANEL_K: usize = 32;
/// Elements of one step of a pair panel (32 k rows of 32 columns).
const PAIR_PANEL_STEP: usize = 1024;

/// Shape, layout and mode of one GEMM tile: `C[m x n] (+)= A[m x k] · B[k x n]`.
///
/// Storage is row-major with explicit leading dimensions (elements between consecutive stored
/// rows). `a_trans` means A is stored as its `k x m` transpose (`A[i, p]` at `p * lda + i`),
/// otherwise `m x k` (`A[i, p]` at `i * lda + p`); likewise `b_trans` stores B as `n x k`
/// (`B[p, j]` at `j * ldb + p`) instead of `k x n` (`p * ldb + j`). C is `m x n` (`i * ldc + j`).
///
/// With `b_panel_width = w > 0`, B is stored in panels of `w` columns instead (the layout
/// [`pack_panels`](crate::pack_panels) writes): `B[p, j]` at `(j / w) * ldb + p * w + j % w`,
/// so `ldb` is the distance between panels. A B used by many GEMMs is packed once that way
/// and the micro-kernel reads it where it lies, rather than each GEMM packing it again. Only
/// the f32 GEMM takes it, untransposed.
///
/// With `b_pair_panels` as well (and `b_panel_width` [`PAIR_PANEL_WIDTH`]), B is stored as the
/// bf16 GEMM packs it for its tile kernels ([`pack_pair_panels_bf16`](crate::pack_pair_panels_bf16)
/// writes it): panel `q` from `q * ldb` holds k in steps of 32, step `t` the 1024 elements from
/// `q * ldb + 1024 t`, columns 0-15 of the panel in its first half and 16-31 in its second, each
/// half 16 rows of k pairs ([`GemmShape::b_index`] gives each element's place). A panel spans
/// `k.div_ceil(32) * 1024` elements, the last step's rows past k zero (the kernels multiply
/// them). Only the bf16 GEMM takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// A is stored transposed (`k x m`).
    pub a_trans: bool,
    /// B is stored transposed (`n x k`).
    pub b_trans: bool,
    /// Leading dimension of A's storage (at least its stored row length when it has 2+ rows).
    pub lda: usize,
    /// Leading dimension of B's storage.
    pub ldb: usize,
    /// Leading dimension of C.
    pub ldc: usize,
    /// `true`: `C += A · B`. `false`: `C = A · B`, and C is never read (it may hold NaNs).
    pub accumulate: bool,
    /// 0: B is stored as `b_trans` says. `w > 0`: B is stored in panels of `w` columns, `ldb`
    /// apart (see above).
    pub b_panel_width: usize,
    /// `true`: B's panels are pair panels (see above); `b_panel_width` must then be
    /// [`PAIR_PANEL_WIDTH`].
    pub b_pair_panels: bool,
    /// `true`: the f32 GEMM may cut C into blocks of whole register tiles (by rows, or by
    /// columns when there are too few rows) and run them as tasks on the calling thread's rayon
    /// pool. For a product whose size has no divisor that cuts it evenly over the cores, which
    /// a caller splitting by exact blocks could not use. Each block sums in the serial call's
    /// order unless it has so few rows that it takes the few-row kernels, which round
    /// differently. A product of a few rows against a deep row-major B is cut along k instead
    /// ([`crate::depth_split`]), its partial products added into C at the end. The 16-bit
    /// GEMMs and a B in panels ignore it.
    pub parallel: bool,
}

impl GemmShape {
    /// A shape whose operands are stored densely (each leading dimension is the row length).
    pub fn dense(m: usize, n: usize, k: usize, a_trans: bool, b_trans: bool, accumulate: bool) -> GemmShape {
        GemmShape {
            m,
            n,
            k,
            a_trans,
            b_trans,
            lda: if a_trans { m } else { k },
            ldb: if b_trans { k } else { n },
            ldc: n,
            accumulate,
            b_panel_width: 0,
            b_pair_panels: false,
            parallel: false,
        }
    }

    /// Stored `(rows, cols)` of A.
    pub fn a_dims(&self) -> (usize, usize) {
        if self.a_trans { (self.k, self.m) } else { (self.m, self.k) }
    }

    /// Stored `(rows, cols)` of B: for panels, one stored row per panel (each `k * w` long, or
    /// `k.div_ceil(32) * 1024` for pair panels).
    pub fn b_dims(&self) -> (usize, usize) {
        match (self.b_panel_width, self.b_trans) {
            (0, true) => (self.n, self.k),
            (0, false) => (self.k, self.n),
            (w, _) if self.b_pair_panels => {
                (self.n.div_ceil(w), self.k.div_ceil(PAIR_PANEL_K) * PAIR_PANEL_STEP)
            }
            (w, _) => (self.n.div_ceil(w), self.k * w),
        }
    }

    /// Where `B[p, j]` lies in B's storage, in elements, for every layout B may have.
    pub fn b_index(&self, p: usize, j: usize) -> usize {
        match (self.b_panel_width, self.b_trans) {
            (0, true) => j * self.ldb + p,
            (0, false) => p * self.ldb + j,
            (w, _) if self.b_pair_panels => {
                (j / w) * self.ldb
                    + (p / PAIR_PANEL_K) * PAIR_PANEL_STEP
                    + (j % 32 / 16) * 512
                    + (p % 32 / 2) * 32
                    + 2 * (j % 16)
                    + p % 2
            }
            (w, _) => (j / w) * self.ldb + p * w + j % w,
        }
    }

    /// Elements `[a, b, c]` each operand spans, i.e. the minimum slice lengths.
    ///
    /// # Errors
    ///
    /// [`TileError::LeadingDim`] when a leading dimension is smaller than the stored row length
    /// of an operand with two or more rows (for panels, `ldb < k * w`);
    /// [`TileError::Overflow`] when an extent does not fit in `usize`;
    /// [`TileError::InvalidLayout`] for a B in panels that is also marked transposed.
    ///
    /// # Examples
    ///
    /// ```rust
    /// use uopc_tile::{GemmShape, TileError};
    ///
    /// // A is 2 x 3 in rows of 4 (one padding element), B 3 x 5, C 2 x 5.
    /// let s = GemmShape { lda: 4, ..GemmShape::dense(2, 5, 3, false, false, false) };
    /// assert_eq!(s.extents(), Ok([4 + 3, 3 * 5, 2 * 5]));
    /// let overlapping = GemmShape { lda: 2, ..s };
    /// assert_eq!(overlapping.extents(), Err(TileError::LeadingDim { operand: "a", ld: 2, cols: 3 }));
    /// ```
    pub fn extents(&self) -> Result<[usize; 3], TileError> {
        if self.b_panel_width != 0 && self.b_trans {
            return Err(TileError::InvalidLayout { operand: "b", reason: "panels are never transposed" });
        }
        if self.b_pair_panels && self.b_panel_width != PAIR_PANEL_WIDTH {
            return Err(TileError::InvalidLayout { operand: "b", reason: "pair panels are 32 columns wide" });
        }
        if self.k.checked_mul(self.b_panel_width).is_none() {
            return Err(TileError::Overflow { operand: "b" });
        }
        let (ar, ac) = self.a_dims();
        let (br, bc) = self.b_dims();
        Ok([span("a", ar, ac, self.lda)?, span("b", br, bc, self.ldb)?, span("c", self.m, self.n, self.ldc)?])
    }

    /// Floating-point operations of the product (`2 m n k`), for throughput figures.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// `C = 0` for `k == 0` without accumulation.
///
/// # Safety
///
/// C's extent is valid for writes.
pub(crate) unsafe fn zero_c(s: &GemmShape, c: *mut f32) {
    for i in 0..s.m {
        // SAFETY: row `i` of C spans `n` floats at `i * ldc`.
        unsafe { std::ptr::write_bytes(c.add(i * s.ldc), 0, s.n) };
    }
}

/// `2 log2(e)` as an f32, the factor of [`crate::softcap`]'s exponent: `exp(-2|y|) = exp2(-|y| 2
/// log2(e))`.
pub const SOFTCAP_TWO_LOG2_E: f32 = 2.0 * std::f32::consts::LOG2_E;
