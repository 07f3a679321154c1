//! FlashAttention-2 on tile ops: per block of query rows and block of keys, a tile GEMM for
//! the scores, the online-softmax tile update and a tile GEMM for `P · V`, each a call into
//! the `uopc-tile` micro-kernels; causal and second-level-blocked (L2) forms.

use crate::LOG2E;
use crate::flash_tiled::FlashTiling;
use crate::query_block;
use uopc_ir::{AxisType, DType, GemmShape, ProgramBuilder, TileOp, UOp, buffer, f32c, sink, tile};
use uopc_jit::{JitError, Program};

/// FlashAttention-2 on tile ops: buffers 0 = Q pre-scaled by `log2(e)/sqrt(d)` (`n*d`, see
/// [`FlashTileOps`]), 1 = K, 2 = V (`n*d`, row-major, as given), 3 = output (`n*d`).
///
/// One THREAD iteration owns `br` query rows (rounded down to a divisor of `n`) and streams the
/// keys in blocks of `bc`: per block a tile GEMM `S = Q_blk · K_blk^T`, the online-softmax tile
/// update (row max, `P = exp2(S - m)`, row sums, rescale of the output tile), and a tile GEMM
/// `O += P · V_blk`; the score and output tiles live on the stack. A last, narrower block takes
/// the keys left over. The division by the row sums happens once at the end, in plain loop IR.
///
/// # Panics
///
/// If `n` is 0 ([`FlashTileOps::compile`] rejects that with an error instead).
#[must_use]
pub fn flash_tile_ops_ir(n: usize, d: usize, tiling: FlashTiling) -> UOp {
    flash_tile_ops_program(n, d, tiling, false, None)
}

/// Causal [`flash_tile_ops_ir`]: query row `i` sees keys `j <= i`. Keys wholly before a query
/// block run unmasked, in key blocks (a divisor of the query block, or a multiple of it that
/// divides `n`, then query-block-wide blocks up to the block's first row); keys after the
/// block are skipped (the key loops end where the query block does). The square on the
/// diagonal goes in strips of up to 64 keys: strip `j` is multiplied only for the rows that
/// see it, and only its top square is masked, by a loop writing `-inf` above the diagonal.
#[must_use]
pub fn flash_tile_ops_causal_ir(n: usize, d: usize, tiling: FlashTiling) -> UOp {
    flash_tile_ops_program(n, d, tiling, true, None)
}

/// Second-level blocking for [`flash_tile_ops_ir`] at large `n`: each THREAD task takes
/// `query_blocks` query blocks and streams the keys in super-blocks of `keys` keys; every
/// query block of the task runs its key blocks of one super-block before the next
/// super-block, so that super-block's K and V (`2 * keys * d * 4` bytes) come from L2 for
/// all query blocks but the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L2Blocking {
    /// Query blocks per THREAD task (rounded down to a divisor of the number of blocks).
    pub query_blocks: usize,
    /// Keys per super-block (rounded down to a multiple of the key block dividing `n`).
    pub keys: usize,
}

impl L2Blocking {
    /// `(query blocks per task, keys per super-block)` for `n` keys and queries in blocks of
    /// `br` queries and `bc` keys, or `None` when no super-block fits (then the plain loop runs).
    fn fit(self, n: usize, br: usize, bc: usize) -> Option<(usize, usize)> {
        let blocks = n / br;
        let group = (1..=self.query_blocks.min(blocks)).rev().find(|g| blocks.is_multiple_of(*g))?;
        let keys = (1..=self.keys / bc).rev().map(|m| m * bc).find(|k| n.is_multiple_of(*k))?;
        Some((group, keys))
    }
}

/// [`flash_tile_ops_ir`] with second-level blocking (see [`L2Blocking`]); without a fitting
/// blocking it is [`flash_tile_ops_ir`].
///
/// # Panics
///
/// If `n` is 0, as [`flash_tile_ops_ir`].
#[must_use]
pub fn flash_tile_ops_l2_ir(n: usize, d: usize, tiling: FlashTiling, l2: L2Blocking) -> UOp {
    flash_tile_ops_program(n, d, tiling, false, Some(l2))
}

fn flash_tile_ops_program(
    n: usize,
    d: usize,
    tiling: FlashTiling,
    causal: bool,
    l2: Option<L2Blocking>,
) -> UOp {
    let mut pb = ProgramBuilder::new();
    let k = TileKernel::new(&mut pb, n, d, tiling, causal, l2);
    let init = [k.init_o.clone(), k.init_ml.clone()];
    let done = if causal {
        k.causal_keys(&mut pb, init)
    } else if k.group > 1 || k.keys < n {
        k.l2_keys(&mut pb, init)
    } else {
        k.plain_keys(&mut pb, init)
    };
    k.normalize(&mut pb, &done)
}

/// What the parts of [`flash_tile_ops_program`] share: sizes, buffers, and the THREAD task's
/// scratch (score tile, output tile, running max and sum of its rows).
struct TileKernel {
    n: usize,
    d: usize,
    /// Query rows per block.
    br: usize,
    /// Keys per block.
    bc: usize,
    /// Query blocks per THREAD task and keys per super-block (see [`L2Blocking`]); (1, n) is
    /// the plain loop, every query block streaming all keys on its own.
    group: usize,
    keys: usize,
    /// Query rows per THREAD task.
    rows: usize,
    /// Width of the causal diagonal strips.
    strip: usize,
    q: UOp,
    k: UOp,
    v: UOp,
    out: UOp,
    t: UOp,
    si: UOp,
    oi: UOp,
    mi: UOp,
    li: UOp,
    init_o: UOp,
    init_ml: UOp,
}

impl TileKernel {
    /// The block sizes, buffers and scratch, and the THREAD loop with its output tile zeroed
    /// and its running max and sum initialized.
    fn new(
        pb: &mut ProgramBuilder,
        n: usize,
        d: usize,
        tiling: FlashTiling,
        causal: bool,
        l2: Option<L2Blocking>,
    ) -> Self {
        let br = query_block(n, tiling.query_block);
        // Causal: keys in blocks of the largest multiple of br that divides n and is at most the
        // key block, then in blocks of br up to the diagonal; with a key block below br, in the
        // largest divisor of br at most the key block (no br-blocks needed).
        let bc = if causal && tiling.key_block < br {
            query_block(br, tiling.key_block)
        } else if causal {
            (1..=(tiling.key_block / br).max(1))
                .rev()
                .map(|m| m * br)
                .find(|b| n.is_multiple_of(*b))
                .unwrap_or(br)
        } else {
            tiling.key_block.clamp(1, n)
        };
        let f32t = DType::F32;
        let [q, k, v, out] = [0, 1, 2, 3].map(|slot| buffer(slot, f32t, n * d));
        // Causal diagonal strips are `strip` keys wide (see `causal_keys`).
        let strip = query_block(br, 64);
        let tile_cols = if causal { bc.max(strip) } else { bc };
        let (group, keys) = match l2 {
            Some(b) if !causal => b.fit(n, br, bc).unwrap_or((1, n)),
            _ => (1, n),
        };
        let rows = group * br;
        let (s, o, mx, l) = (
            pb.alloc(f32t, br * tile_cols),
            pb.alloc(f32t, rows * d),
            pb.alloc(f32t, rows),
            pb.alloc(f32t, rows),
        );

        let t = pb.range(n / rows, AxisType::Thread);
        let th = std::slice::from_ref(&t);
        let (si, oi, mi, li) = (s.after(th), o.after(th), mx.after(th), l.after(th));
        let z = pb.range(rows * d, AxisType::Loop);
        let init_o = oi.index(&z).store(0.0f32).end(&[z]);
        let r = pb.range(rows, AxisType::Loop);
        let init_ml =
            sink(&[mi.index(&r).store(f32c(f32::NEG_INFINITY)), li.index(&r).store(0.0f32)]).end(&[r]);
        TileKernel {
            n,
            d,
            br,
            bc,
            group,
            keys,
            rows,
            strip,
            q,
            k,
            v,
            out,
            t,
            si,
            oi,
            mi,
            li,
            init_o,
            init_ml,
        }
    }

    /// One key block of `cols` keys starting at key `first`, after the effects `prev`, for
    /// the query block whose first row is `rows_at.0` in Q and `rows_at.1` in the row state
    /// (m, l, O): the score GEMM, the online-softmax tile update and the `P · V` GEMM.
    ///
    /// With `diagonal_from: Some(r0)`, the block starts on the diagonal at row `r0`: only rows
    /// `r0 .. br` see it, and its top `cols x cols` square loses the keys after each row.
    fn key_block(
        &self,
        pb: &mut ProgramBuilder,
        first: &UOp,
        cols: usize,
        prev: &[UOp],
        rows_at: (&UOp, &UOp),
        diagonal_from: Option<usize>,
    ) -> UOp {
        let TileKernel { d, br, ref q, ref k, ref v, ref si, ref mi, ref li, ref oi, .. } = *self;
        let (q_row, state_row) = rows_at;
        let r0 = diagonal_from.unwrap_or(0);
        let rows = br - r0;
        let scores = TileOp::Gemm(GemmShape::dense(rows, cols, d, false, true, false));
        let q_first = (q_row + r0 as i64) * d;
        let mut g1 = tile(scores, &[q.index(q_first), k.index(first * d), si.after(prev).index(0)]);
        if diagonal_from.is_some() {
            // Row r hides keys r+1 .. cols, the strict upper triangle. The min only tells the
            // verifier's interval bounds that the index stays in the tile.
            let rr = pb.range(cols, AxisType::Loop);
            let cc = pb.range(-&rr + (cols as i64 - 1), AxisType::Loop);
            let at = -((-(&rr * (cols + 1) + 1 + &cc)).maximum(-((cols * cols - 1) as i64)));
            g1 = si.after(std::slice::from_ref(&g1)).index(at).store(f32c(f32::NEG_INFINITY)).end(&[cc, rr]);
        }
        let after_g1 = std::slice::from_ref(&g1);
        let mut state = prev.to_vec();
        state.push(g1.clone());
        let update = TileOp::SoftmaxUpdate { rows, cols, lds: cols, d, ldo: d, scale: 1f32.to_bits() };
        let sm = tile(
            update,
            &[
                si.after(after_g1).index(0),
                mi.after(&state).index(state_row + r0 as i64),
                li.after(&state).index(state_row + r0 as i64),
                oi.after(&state).index((state_row + r0 as i64) * d),
            ],
        );
        let after_sm = std::slice::from_ref(&sm);
        let pv = TileOp::Gemm(GemmShape::dense(rows, d, cols, false, false, true));
        tile(
            pv,
            &[
                si.after(after_sm).index(0),
                v.index(first * d),
                oi.after(after_sm).index((state_row + r0 as i64) * d),
            ],
        )
    }

    /// The causal key loops after the initializations `init`.
    ///
    /// Query rows q0 .. q0 + br of block t see keys 0 ..= q0 + r. Keys before q0 are all
    /// visible: whole bc-blocks first, then br-blocks up to q0; the br x br block at q0 is the
    /// only one the diagonal crosses, and the only one masked. Later keys are skipped.
    fn causal_keys(&self, pb: &mut ProgramBuilder, init: [UOp; 2]) -> UOp {
        let TileKernel { n, br, bc, strip, ref t, .. } = *self;
        let q0 = t * br;
        let zero = uopc_ir::idx(0);
        let at = (&q0, &zero);
        let big = q0.idiv(bc as i64);
        let kb = pb.range(&big, AxisType::Reduce);
        let [init_o, init_ml] = init;
        let far = self.key_block(pb, &(&kb * bc), bc, &[init_o, init_ml, kb.clone()], at, None).end(&[kb]);
        // The keys from big * bc to q0 in blocks of br (none when bc divides br). ks stays
        // below that count, so the start stays below q0; the min only tells the verifier's
        // interval bounds (they do not see that ks and big are correlated).
        let near = if bc >= br {
            let ks = pb.range((&q0 - &big * bc).idiv(br as i64), AxisType::Reduce);
            let start = &big * bc + &ks * br;
            let near_first = -((-start).maximum(-((n - br) as i64)));
            self.key_block(pb, &near_first, br, &[far, ks.clone()], at, None).end(&[ks])
        } else {
            far
        };
        // The diagonal square in strips of `strip` keys: strip j is seen only by rows
        // j*strip.., so its GEMMs and softmax update run on those rows, and only its top
        // square is masked (keys after the row).
        let mut prev = near;
        for j in 0..br / strip {
            let r0 = j * strip;
            prev = self.key_block(pb, &(&q0 + r0 as i64), strip, &[prev], at, Some(r0));
        }
        prev
    }

    /// Second-level blocking after the initializations `init`: super-block sb of the keys is
    /// streamed by every query block g of the task before the next one, so it comes from L2
    /// after the first block.
    fn l2_keys(&self, pb: &mut ProgramBuilder, init: [UOp; 2]) -> UOp {
        let TileKernel { n, br, bc, group, keys, ref t, .. } = *self;
        let sb = pb.range(n / keys, AxisType::Reduce);
        let g = pb.range(group, AxisType::Loop);
        let kb = pb.range(keys / bc, AxisType::Reduce);
        let (q_row, state_row) = ((t * group + &g) * br, &g * br);
        let first = &sb * keys + &kb * bc;
        let [init_o, init_ml] = init;
        let prev = [init_o, init_ml, sb.clone(), g.clone(), kb.clone()];
        self.key_block(pb, &first, bc, &prev, (&q_row, &state_row), None).end(&[kb, g, sb])
    }

    /// The plain key loop after the initializations `init`: whole key blocks, then one
    /// narrower block of the keys left over.
    fn plain_keys(&self, pb: &mut ProgramBuilder, init: [UOp; 2]) -> UOp {
        let TileKernel { n, br, bc, ref t, .. } = *self;
        let (full, rest) = (n / bc, n % bc);
        let q_row = t * br;
        let zero = uopc_ir::idx(0);
        let at = (&q_row, &zero);
        let kb = pb.range(full, AxisType::Reduce);
        let [init_o, init_ml] = init;
        let key_loop =
            self.key_block(pb, &(&kb * bc), bc, &[init_o, init_ml, kb.clone()], at, None).end(&[kb]);
        if rest > 0 {
            let first = uopc_ir::idx((full * bc) as i64);
            self.key_block(pb, &first, rest, std::slice::from_ref(&key_loop), at, None)
        } else {
            key_loop
        }
    }

    /// The division of every output row by its running sum after the key loops `done`, and
    /// the program's SINK.
    fn normalize(&self, pb: &mut ProgramBuilder, done: &UOp) -> UOp {
        let TileKernel { d, rows, ref out, ref t, ref oi, ref li, .. } = *self;
        let after = std::slice::from_ref(done);
        let e = pb.range(d, AxisType::Loop);
        let rr = pb.range(rows, AxisType::Loop);
        let lr = li.after(after).index(&rr).load();
        let st = out
            .index((t * rows + &rr) * d + &e)
            .store(oi.after(after).index(&rr * d + &e).load() * lr.recip());
        sink(&[st.end(&[e, rr, t.clone()])])
    }
}

/// The prologue of [`flash_tile_ops_ir`]: buffer 1 = buffer 0 (`n*d`) times `log2(e)/sqrt(d)`.
#[must_use]
pub fn scale_queries_ir(n: usize, d: usize) -> UOp {
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let (q, qs) = (buffer(0, DType::F32, n * d), buffer(1, DType::F32, n * d));
    let mut pb = ProgramBuilder::new();
    let i = pb.range(n, AxisType::Thread);
    let e = pb.range(d, AxisType::Loop);
    sink(&[qs.index(&i * d + &e).store(q.index(&i * d + &e).load() * scale).end(&[e, i])])
}

/// `flash_tiled` on tile ops, compiled: the query scaling and the attention kernel.
pub struct FlashTileOps {
    prep: Program,
    main: Program,
    d: usize,
    qs: Vec<f32>,
}

impl FlashTileOps {
    /// Compiles both programs for `n` keys and queries of head dimension `d`.
    ///
    /// # Errors
    ///
    /// [`JitError::Unsupported`] when `n`, `d` or a block size is 0; the [`JitError`] of
    /// [`Program::compile`] otherwise.
    ///
    /// # Examples
    ///
    /// Plain and causal, against the f64 references:
    ///
    /// ```rust
    /// use uopc_kernels::flash_tile_ops::FlashTileOps;
    /// use uopc_kernels::flash_tiled::FlashTiling;
    /// use uopc_kernels::reference::{attention_f64, causal_attention_f64, max_abs_err};
    ///
    /// let (n, d) = (48, 16);
    /// let x = |seed: usize| -> Vec<f32> {
    ///     (0..n * d).map(|i| ((i * 37 + seed) % 23) as f32 * 0.08 - 0.9).collect()
    /// };
    /// let (q, k, v) = (x(1), x(2), x(3));
    /// let tiling = FlashTiling { query_block: 16, key_block: 32 }; // a narrower last key block
    /// let mut out = vec![0.0f32; n * d];
    ///
    /// let mut flash = FlashTileOps::compile(n, d, tiling)?;
    /// assert_eq!(flash.shape(), (n, d));
    /// flash.run(&q, &k, &v, &mut out)?;
    /// assert!(max_abs_err(&out, &attention_f64(&q, &k, &v, n, d)) < 1e-5);
    ///
    /// let mut causal = FlashTileOps::compile_with(n, d, tiling, true)?;
    /// causal.run(&q, &k, &v, &mut out)?;
    /// assert!(max_abs_err(&out, &causal_attention_f64(&q, &k, &v, n, d)) < 1e-5);
    ///
    /// assert!(flash.run(&q, &k, &v[1..], &mut out).is_err()); // V one element short
    /// # Ok::<(), uopc_jit::JitError>(())
    /// ```
    pub fn compile(n: usize, d: usize, tiling: FlashTiling) -> Result<Self, JitError> {
        Self::compile_with(n, d, tiling, false)
    }

    /// [`FlashTileOps::compile`], causal when `causal` (see [`flash_tile_ops_causal_ir`]).
    ///
    /// # Errors
    ///
    /// As [`FlashTileOps::compile`].
    pub fn compile_with(n: usize, d: usize, tiling: FlashTiling, causal: bool) -> Result<Self, JitError> {
        if causal {
            Self::build(n, d, tiling, flash_tile_ops_causal_ir, "flash_tile_ops_causal")
        } else {
            Self::build(n, d, tiling, flash_tile_ops_ir, "flash_tile_ops")
        }
    }

    /// [`FlashTileOps::compile`] with second-level blocking (see [`L2Blocking`]).
    ///
    /// # Errors
    ///
    /// As [`FlashTileOps::compile`].
    ///
    /// # Examples
    ///
    /// ```rust
    /// use uopc_kernels::flash_tile_ops::{FlashTileOps, L2Blocking};
    /// use uopc_kernels::flash_tiled::FlashTiling;
    /// use uopc_kernels::reference::{attention_f64, max_abs_err};
    ///
    /// let (n, d) = (64, 8);
    /// let x = |seed: usize| -> Vec<f32> {
    ///     (0..n * d).map(|i| ((i * 41 + seed) % 29) as f32 * 0.06 - 0.85).collect()
    /// };
    /// let (q, k, v) = (x(1), x(2), x(3));
    /// // Two query blocks of 16 per task, keys in super-blocks of 32 (two key blocks of 16).
    /// let tiling = FlashTiling { query_block: 16, key_block: 16 };
    /// let l2 = L2Blocking { query_blocks: 2, keys: 32 };
    /// let mut flash = FlashTileOps::compile_l2(n, d, tiling, l2)?;
    /// let mut out = vec![0.0f32; n * d];
    /// flash.run(&q, &k, &v, &mut out)?;
    /// assert!(max_abs_err(&out, &attention_f64(&q, &k, &v, n, d)) < 1e-5);
    /// # Ok::<(), uopc_jit::JitError>(())
    /// ```
    pub fn compile_l2(n: usize, d: usize, tiling: FlashTiling, l2: L2Blocking) -> Result<Self, JitError> {
        Self::build(n, d, tiling, |n, d, t| flash_tile_ops_l2_ir(n, d, t, l2), "flash_tile_ops_l2")
    }

    fn build(
        n: usize,
        d: usize,
        tiling: FlashTiling,
        program: impl Fn(usize, usize, FlashTiling) -> UOp,
        name: &str,
    ) -> Result<Self, JitError> {
        if n == 0 || d == 0 || tiling.key_block == 0 || tiling.query_block == 0 {
            return Err(JitError::Unsupported("flash_tiled needs positive n, d and block sizes".into()));
        }
        Ok(FlashTileOps {
            prep: Program::compile(&scale_queries_ir(n, d), "flash_scale_q")?,
            main: Program::compile(&program(n, d, tiling), name)?,
            d,
            qs: vec![0.0; n * d],
        })
    }

    /// `out = softmax(q k^T / sqrt(d)) v`, all `n*d` row-major; lengths are checked.
    ///
    /// # Errors
    ///
    /// [`JitError::Argument`] when a slice does not have `n * d` elements.
    pub fn run(&mut self, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) -> Result<(), JitError> {
        self.prep.run_f32(&[q], &mut [&mut self.qs])?;
        self.main.run_f32(&[&self.qs, k, v], &mut [out])
    }

    /// The attention kernel.
    pub fn kernel(&self) -> &Program {
        &self.main
    }

    /// `(n, d)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.qs.len() / self.d, self.d)
    }
}

/// Block sizes for [`FlashTileOps`]: 256 query rows against 128 keys. Every query block
/// streams all of K and V through the micro-kernels, which pack each block they read, so
/// taller query blocks pack less; the score tile (128 KiB) and the output tile (64 KiB at
/// D = 64) still fit the stack. It was the fastest of 256x128, 128x128 and 64x256 at N = 1024
/// and N = 4096 (`docs/bench/flash-tile-ops-tiling.json`).
pub const TILE_OPS_TILING: FlashTiling = FlashTiling { query_block: 256, key_block: 128 };

/// Block sizes for causal [`FlashTileOps`]: the same 256 query rows against 128 keys as
/// [`TILE_OPS_TILING`]; the diagonal square goes in strips of 64 keys, each multiplied only
/// for the rows that see it (see [`flash_tile_ops_causal_ir`]), so the causal kernel takes
/// a little more than half the full kernel's time (`docs/bench/flash-tile-ops-tiling.json`).
pub const CAUSAL_TILE_OPS_TILING: FlashTiling = FlashTiling { query_block: 256, key_block: 128 };

/// Second-level blocking for [`FlashTileOps::compile_l2`]: two query blocks per task share
/// super-blocks of 1024 keys (512 KiB of K and V at D = 64, a quarter of this CPU's 2 MiB L2).
pub const TILE_OPS_L2: L2Blocking = L2Blocking { query_blocks: 2, keys: 1024 };

/// Block sizes for [`TILE_OPS_L2`]: 256 query rows against 64 keys, so two output tiles
/// (2 x 64 KiB at D = 64) and the score tile (64 KiB) fit the 256 KiB of stack a kernel may use.
pub const TILE_OPS_L2_TILING: FlashTiling = FlashTiling { query_block: 256, key_block: 64 };
