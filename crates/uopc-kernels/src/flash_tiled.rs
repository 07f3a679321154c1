//! `flash_tiled`: FlashAttention-2 tiling in plain loop IR.
//!
//! Each THREAD task owns a few blocks of `Br` query rows and streams the keys in blocks of
//! `Bc`, running every query block of the task against one key block before the next. The
//! `Br` rows of a query block are the F32X4 lanes: per key block, the score tile is computed
//! transposed (`S^T = K_blk · Q_blk^T`, a register-tiled GEMM over the head dimension with
//! each key broadcast against the rows' vector), the online-softmax update (new max, rescale
//! factor, `P^T = exp2(S^T - m)`, row sums) is one whole-vector pass, and the output tile
//! `O[Br x D]` is rescaled and accumulates `P · V_blk` through a register tile per 8 columns.
//! The division by the row sums happens once at the end.
//!
//! Two prologue programs lay the operands out for this: Q scaled and transposed per query
//! block, and K and V padded to whole key blocks (zeros; padded keys are masked to `-inf`).
//! [`FlashTiled`] runs all three.

use crate::LOG2E;
use crate::masked::M_FLOOR;
use crate::query_block;
use uopc_ir::{AxisType, DType, ProgramBuilder, UOp, buffer, f32c, sink};
use uopc_jit::{JitError, JitOptions, OptLevel, Program};

/// Output columns per register tile of the `P · V` update in [`flash_tiled_ir`]: two F32X4
/// per query row, so the default 4-row block keeps 8 accumulators in registers.
const PV_COLS: usize = 8;

/// Reduce steps per trip of `flash_tiled`'s register tiles: four, because with two regalloc
/// spilled one score accumulator per trip (a store and reload in its FMA chain) and four fit
/// (measurements in `docs/bench/flash-tiled-tiling.json`).
const FLASH_TILE_STEPS: usize = 4;

/// Query blocks per THREAD task of [`flash_tiled_ir`] (fewer when they do not divide the
/// blocks): every query block of a group runs against one key block before the next, so
/// the K and V blocks are reused from L1 (measurements in `docs/bench/flash-tiled-tiling.json`).
const QUERY_GROUPS: usize = 8;

/// Keys per register tile of the score GEMM in [`flash_tiled_ir`]: with 4 query rows per
/// F32X4, 8 accumulators, a vector of q and the broadcast k in the 16 xmm registers.
const SCORE_KEYS: usize = 8;

/// Block sizes of [`flash_tiled_ir`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashTiling {
    /// Query rows per THREAD iteration (`Br`); rounded down to a divisor of `n`.
    pub query_block: usize,
    /// Keys per block (`Bc`); the keys are padded to a multiple of it.
    pub key_block: usize,
}

impl Default for FlashTiling {
    /// `Br = 4`, `Bc = 32`: the score tile goes in register tiles of 8 keys (8 F32X4
    /// accumulators, which with their operands fit the 16 xmm registers), and a longer key
    /// block spreads the per-block work (the `P · V` tiles' set-up and the output rescale)
    /// over more keys; past 32 keys the gain on one thread is small (measurements in
    /// `docs/bench/flash-tiled-tiling.json`).
    fn default() -> Self {
        FlashTiling { query_block: 4, key_block: 32 }
    }
}

/// `xs` combined by `op` as a balanced binary tree (first half, then second half), so the
/// result's dependency chain is logarithmic in `xs.len()`; `xs` must not be empty.
fn pairwise(xs: &[UOp], op: impl Fn(&UOp, &UOp) -> UOp + Copy) -> UOp {
    match xs {
        [x] => x.clone(),
        _ => {
            let (a, b) = xs.split_at(xs.len() / 2);
            op(&pairwise(a, op), &pairwise(b, op))
        }
    }
}

/// Keys rounded up to whole blocks of `bc`.
pub fn padded_keys(n: usize, bc: usize) -> usize {
    n.div_ceil(bc.max(1)) * bc.max(1)
}

/// The key prologue: buffers 0 = K, 1 = V (`n*d`, row-major), 2 = K padded and 3 = V padded
/// (`np * d`, row-major), with `np` = [`padded_keys`]; padding is zeros.
///
/// # Panics
///
/// If `bc` is 0 ([`FlashTiled::compile`] rejects that with an error instead).
#[must_use]
pub fn flash_tiled_prep_ir(n: usize, d: usize, bc: usize) -> UOp {
    let np = padded_keys(n, bc);
    let f32t = DType::F32;
    let (k, v) = (buffer(0, f32t, n * d), buffer(1, f32t, n * d));
    let (kp, vp) = (buffer(2, f32t, np * d), buffer(3, f32t, np * d));
    let mut pb = ProgramBuilder::new();
    let b = pb.range(np / bc, AxisType::Thread);
    let c = pb.range(bc, AxisType::Loop);
    let e = pb.range(d, AxisType::Loop);
    let j = &b * bc + &c;
    // keys past n read row n-1 (in bounds) and are replaced by zeros
    let row = -((-&j).maximum(-(n as i64 - 1)));
    let real = j.lt(n as i64);
    let kv = real.where_(k.index(&row * d + &e).load(), f32c(0.0));
    let vv = real.where_(v.index(&row * d + &e).load(), f32c(0.0));
    let st = sink(&[kp.index(&j * d + &e).store(kv), vp.index(&j * d + &e).store(vv)]);
    sink(&[st.end(&[e, c, b])])
}

/// The query prologue: buffer 1 = buffer 0 (`n*d`, row-major) times `log2(e)/sqrt(d)`, each
/// block of `br` rows transposed (`Q_blk^T`, `d x br`), so the `br` rows of one column are one
/// vector for the score tile.
///
/// # Panics
///
/// If `br` is 0 ([`FlashTiled::compile`] passes a positive divisor of `n`).
#[must_use]
pub fn flash_tiled_queries_ir(n: usize, d: usize, br: usize) -> UOp {
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let (q, qt) = (buffer(0, DType::F32, n * d), buffer(1, DType::F32, n * d));
    let mut pb = ProgramBuilder::new();
    let t = pb.range(n / br, AxisType::Thread);
    let e = pb.range(d, AxisType::Loop);
    let b = pb.range(br, AxisType::Loop);
    let x = q.index((&t * br + &b) * d + &e).load() * scale;
    sink(&[qt.index(&t * (d * br) + &e * br + &b).store(x).end(&[b, e, t])])
}

/// FlashAttention-2 for one head: buffers 0 = Q pre-scaled by `log2(e)/sqrt(d)` and
/// transposed per query block (`n*d`, from [`flash_tiled_queries_ir`]), 1 = K padded and 2 = V
/// padded (from [`flash_tiled_prep_ir`]), 3 = output (`n*d`). Scores are base 2, as in
/// [`crate::online::online_attention_ir`].
///
/// The query rows of a block are the vector lanes wherever rows are independent: the score
/// tile is kept transposed (`S^T`, one F32X4 of `br` rows per key), so the row maxima, the
/// rescale factors, `P = exp2(S - m)` and the row sums are whole-vector operations with no
/// reduction across lanes.
#[must_use]
pub fn flash_tiled_ir(n: usize, d: usize, tiling: FlashTiling) -> UOp {
    let mut pb = ProgramBuilder::new();
    let k = TiledKernel::new(&mut pb, n, d, tiling);
    let s_done = k.score_tile(&mut pb);
    let state_done = k.softmax_update(&mut pb, &s_done);
    let key_loop = k.output_update(&mut pb, state_done);
    k.normalize(&mut pb, &key_loop)
}

/// What the parts of [`flash_tiled_ir`] share: sizes, buffers, scratch, and the loops every
/// key block runs in (THREAD task `t`, key block `kb`, query block `g` of the task).
struct TiledKernel {
    d: usize,
    n: usize,
    /// Query rows per block (the vector lanes).
    br: usize,
    /// Keys per block.
    bc: usize,
    /// Keys after padding to whole blocks.
    np: usize,
    /// Query blocks per THREAD task.
    groups: usize,
    qt: UOp,
    kp: UOp,
    vp: UOp,
    out: UOp,
    /// The score accumulators, one per (key, row) of a key block.
    acc: Vec<UOp>,
    s_tile: UOp,
    p_tile: UOp,
    /// The `P · V` register tile's accumulators, one per (row, column of a chunk).
    pv_acc: Vec<UOp>,
    t: UOp,
    kb: UOp,
    g: UOp,
    /// The row state (max, sum, rescale factor per row) and output tile, per THREAD task.
    st: UOp,
    oi: UOp,
    init_state: UOp,
    init_o: UOp,
    /// The query block `(t, g)`, and where its row state and output tile start.
    block: UOp,
    sbase: UOp,
    obase: UOp,
}

impl TiledKernel {
    /// The buffers, the scratch, the THREAD loop with the initialized state and output tiles,
    /// and the key-block and query-block loops.
    fn new(pb: &mut ProgramBuilder, n: usize, d: usize, tiling: FlashTiling) -> Self {
        let br = query_block(n, tiling.query_block);
        let bc = tiling.key_block.max(1);
        let np = padded_keys(n, bc);
        let f32t = DType::F32;
        let qt = buffer(0, f32t, n * d);
        let kp = buffer(1, f32t, np * d);
        let vp = buffer(2, f32t, np * d);
        let out = buffer(3, f32t, n * d);

        // Running max of row b at [b], running sum at [br + b], the key block's rescale factor
        // at [2br + b]: in memory, not registers, so they do not hold xmm registers across the
        // key loop or the output update.
        // Each THREAD task takes `groups` query blocks and runs all of them against one key
        // block before the next: the block's K and V (16 KiB at D = 64, Bc = 32) are then read
        // from L1 by all but the first, instead of streamed from L2 by each.
        let groups = (1..=QUERY_GROUPS).rev().find(|g| (n / br).is_multiple_of(*g)).unwrap_or(1);
        let state = pb.alloc(f32t, 3 * br * groups);
        let o = pb.alloc(f32t, br * d * groups);
        let acc: Vec<UOp> = (0..br * bc).map(|_| pb.alloc(f32t, 1)).collect();
        let s_tile = pb.alloc(f32t, br * bc);
        let p_tile = pb.alloc(f32t, br * bc);
        let pv_acc: Vec<UOp> = (0..br * PV_COLS).map(|_| pb.alloc(f32t, 1)).collect();

        let t = pb.range(n / (br * groups), AxisType::Thread);
        let th = std::slice::from_ref(&t);
        let st = state.after(th);
        let oi = o.after(th);
        let zs = pb.range(3 * br * groups, AxisType::Loop);
        let is_max = zs.modulo(3 * br as i64).lt(br as i64);
        let init_state = st.index(&zs).store(is_max.where_(f32c(M_FLOOR), f32c(0.0))).end(&[zs]);
        let z = pb.range(br * d * groups, AxisType::Loop);
        let init_o = oi.index(&z).store(0.0f32).end(&[z]);

        let kb = pb.range(np / bc, AxisType::Reduce);
        let g = pb.range(groups, AxisType::Loop);
        let block = &t * groups + &g;
        let sbase = &g * (3 * br);
        let obase = &g * (br * d);
        TiledKernel {
            d,
            n,
            br,
            bc,
            np,
            groups,
            qt,
            kp,
            vp,
            out,
            acc,
            s_tile,
            p_tile,
            pv_acc,
            t,
            kb,
            g,
            st,
            oi,
            init_state,
            init_o,
            block,
            sbase,
            obase,
        }
    }

    /// `(t, kb, g)`: the loops a key block's scratch lives inside.
    fn tk(&self) -> [UOp; 3] {
        [self.t.clone(), self.kb.clone(), self.g.clone()]
    }

    /// The score tile `S^T = K_blk · Q_blk^T` into `s_tile` (padded keys `-inf`); returns the
    /// SINK of its stores.
    ///
    /// One accumulator per (key, row); each key's k[e] is broadcast against the vector of the
    /// rows' q[e]. The keys go in groups of SCORE_KEYS, one loop over the head each, so a
    /// group's accumulators fit the registers however long the key block.
    fn score_tile(&self, pb: &mut ProgramBuilder) -> UOp {
        let TiledKernel { d, n, br, bc, np, ref qt, ref kp, ref kb, ref block, .. } = *self;
        let tk = self.tk();
        let ai: Vec<UOp> = self.acc.iter().map(|x| x.after(&tk)).collect();
        let si = self.s_tile.after(&tk);
        // One SINK of score stores per key group. Each group starts after the previous group's
        // scores are stored: otherwise its loop may run while they are still in registers, and
        // they spill.
        let mut s_stores: Vec<UOp> = Vec::new();
        for first in (0..bc).step_by(SCORE_KEYS) {
            let keys = first..bc.min(first + SCORE_KEYS);
            let e = pb.range(d, AxisType::Reduce);
            let mut updates = Vec::new();
            for c in keys.clone() {
                let kv = kp.index((kb * bc + c as i64) * d + &e).load();
                for b in 0..br {
                    let a = &ai[c * br + b];
                    let init = match s_stores.last() {
                        Some(p) => a.after(std::slice::from_ref(p)).index(0).store(0.0f32),
                        None => a.index(0).store(0.0f32),
                    };
                    let at = a.after(&[init, e.clone()]).index(0);
                    let qv = qt.index(block * (d * br) + &e * br + b as i64).load();
                    updates.push(at.store(at.load() + &kv * qv));
                }
            }
            let dot = sink(&updates).end(&[e]);
            let after_dot = std::slice::from_ref(&dot);
            let mut group_stores = Vec::new();
            for (x, a) in ai.iter().enumerate().take(keys.end * br).skip(keys.start * br) {
                let mut s = a.after(after_dot).index(0).load();
                if np != n {
                    s = (kb * bc + (x / br) as i64).lt(n as i64).where_(s, f32c(f32::NEG_INFINITY));
                }
                group_stores.push(si.index(x as i64).store(s));
            }
            s_stores.push(sink(&group_stores));
        }
        sink(&s_stores)
    }

    /// The online-softmax update of the block, rows as lanes: new max, rescale factor, `P^T`
    /// into `p_tile` and the new row sums, in one pass over the block's keys after the score
    /// stores `s_done`. Returns the END of that pass.
    fn softmax_update(&self, pb: &mut ProgramBuilder, s_done: &UOp) -> UOp {
        let TiledKernel { br, bc, ref st, ref sbase, .. } = *self;
        let tk = self.tk();
        let si = self.s_tile.after(&tk);
        let s_ready = si.after(std::slice::from_ref(s_done));
        let pi = self.p_tile.after(&tk);
        let rb = pb.range(br, AxisType::Loop);
        let row = st.after(&[self.init_state.clone(), self.kb.clone(), s_done.clone()]);
        let rs = sbase + &rb;
        let m_old = row.index(&rs).load();
        let score = |c: usize| s_ready.index(&rb + (c * br) as i64).load();
        // The block's max as a balanced tree: a chain of 32 maxima is 32 latencies on the way
        // to every exponential of the block, a tree five.
        let m_new = pairwise(&(0..bc).map(score).collect::<Vec<_>>(), |a, b| a.maximum(b)).maximum(&m_old);
        let corr = (&m_old - &m_new).exp2();
        // The exponentials read the scores again, after the new max is stored: holding all of
        // the block's scores in registers from the max to here would spill them at larger
        // blocks.
        let m_stored = row.index(&rs).store(&m_new);
        let s_again = si.after(&[s_done.clone(), m_stored.clone()]);
        let mut softmax = vec![m_stored];
        let mut sum: Option<UOp> = None;
        for c in 0..bc {
            let p = (s_again.index(&rb + (c * br) as i64).load() - &m_new).exp2();
            softmax.push(pi.index(&rb + (c * br) as i64).store(&p));
            sum = Some(match sum {
                None => p,
                Some(x) => x + p,
            });
        }
        // A chain, unlike the max: nothing of the block waits for the sum (a tree measured the
        // same).
        let l_new = row.index(&rs + br as i64).load() * &corr + sum.expect("a key block has keys");
        // The sum's store first: the linearizer then evaluates the running sum next to each
        // exponential, instead of holding all of them for a sum at the end.
        softmax.insert(0, row.index(&rs + br as i64).store(l_new));
        softmax.push(row.index(&rs + (2 * br) as i64).store(&corr));
        sink(&softmax).end(&[rb])
    }

    /// `O = O * corr + P · V_blk` after the softmax pass `state_done`; returns the END of the
    /// key-block and query-block loops.
    ///
    /// Columns in chunks of PV_COLS: per chunk a register tile of br x PV_COLS accumulators
    /// reduces over the block's keys (two F32X4 per row, fed by one broadcast of p and two
    /// vector loads of V per key), then the output tile is rescaled and the tile added.
    /// Columns past the last whole chunk take one vectorized loop over them. The row state
    /// and the rescale factors are in memory before the output update: held in registers
    /// across it, they would crowd out its tile.
    fn output_update(&self, pb: &mut ProgramBuilder, state_done: UOp) -> UOp {
        let TiledKernel { d, br, bc, ref vp, ref st, ref kb, ref sbase, ref obase, .. } = *self;
        let after_state = std::slice::from_ref(&state_done);
        let mut updates_kb = vec![state_done.clone()];
        let p_ready = self.p_tile.after(&self.tk()).after(after_state);
        let mut od = self.oi.after(&[self.init_o.clone(), kb.clone(), self.g.clone(), state_done.clone()]);
        let chunks = d / PV_COLS;
        if chunks > 0 {
            let chunk_loop = self.output_chunks(pb, &state_done, &p_ready, &od, chunks);
            // The column loop below reads and writes the same tile: it goes after this one.
            od = od.after(std::slice::from_ref(&chunk_loop));
            updates_kb.push(chunk_loop);
        }
        if chunks * PV_COLS < d {
            let first = chunks * PV_COLS;
            let dd = pb.range(d - first, AxisType::Loop);
            let col = &dd + first as i64;
            let mut o_updates = Vec::new();
            for b in 0..br {
                let at = od.index(obase + &col + (b * d) as i64);
                let mut x = at.load() * st.after(after_state).index(sbase + (2 * br + b) as i64).load();
                for c in 0..bc {
                    let pv = p_ready.index((c * br + b) as i64).load();
                    x = x + pv * vp.index((kb * bc + c as i64) * d + &col).load();
                }
                o_updates.push(at.store(x));
            }
            updates_kb.push(sink(&o_updates).end(&[dd]));
        }
        sink(&updates_kb).end(&[self.g.clone(), kb.clone()])
    }

    /// The whole PV_COLS-column chunks of [`TiledKernel::output_update`]: the register tile
    /// of `P · V` per chunk, then the rescale of the output tile `od` plus the tile. Returns
    /// the END of the chunk loop.
    fn output_chunks(
        &self,
        pb: &mut ProgramBuilder,
        state_done: &UOp,
        p_ready: &UOp,
        od: &UOp,
        chunks: usize,
    ) -> UOp {
        let TiledKernel { d, br, bc, ref vp, ref st, ref t, ref kb, ref g, ref sbase, ref obase, .. } = *self;
        let dc = pb.range(chunks, AxisType::Loop);
        let c3 = pb.range(bc, AxisType::Reduce);
        let tkd = [t.clone(), kb.clone(), g.clone(), dc.clone()];
        let pa: Vec<UOp> = self.pv_acc.iter().map(|x| x.after(&tkd)).collect();
        let mut pv_updates = Vec::new();
        for b in 0..br {
            let pv = p_ready.index(&c3 * br as i64 + b as i64).load();
            for j in 0..PV_COLS {
                let a = &pa[b * PV_COLS + j];
                let init = a.index(0).store(0.0f32);
                let at = a.after(&[init, c3.clone()]).index(0);
                let vv = vp.index((kb * bc + &c3) * d + &dc * PV_COLS as i64 + j as i64).load();
                pv_updates.push(at.store(at.load() + &pv * vv));
            }
        }
        let pv_loop = sink(&pv_updates).end(&[c3]);
        let tile_done = std::slice::from_ref(&pv_loop);
        // Read after the tile's loop, so the backend computes each row's update as whole
        // vectors next to its store.
        let od_tile = od.after(tile_done);
        let mut o_updates = Vec::new();
        for b in 0..br {
            let cb =
                st.after(&[state_done.clone(), pv_loop.clone()]).index(sbase + (2 * br + b) as i64).load();
            for j in 0..PV_COLS {
                let at = od_tile.index(obase + &dc * PV_COLS as i64 + (b * d + j) as i64);
                o_updates
                    .push(at.store(at.load() * &cb + pa[b * PV_COLS + j].after(tile_done).index(0).load()));
            }
        }
        sink(&o_updates).end(&[dc])
    }

    /// The division of every output row by its running sum after the key loop, and the
    /// program's SINK.
    fn normalize(&self, pb: &mut ProgramBuilder, key_loop: &UOp) -> UOp {
        let TiledKernel { d, br, groups, ref out, ref st, ref oi, ref t, .. } = *self;
        let d2 = pb.range(d, AxisType::Loop);
        let g2 = pb.range(groups, AxisType::Loop);
        let done = std::slice::from_ref(key_loop);
        let stores: Vec<UOp> = (0..br)
            .map(|b| {
                let lb = st.after(done).index(&g2 * (3 * br) + (br + b) as i64).load();
                out.index(((t * groups + &g2) * br + b) * d + &d2)
                    .store(oi.after(done).index(&g2 * (br * d) + &d2 + (b * d) as i64).load() * lb.recip())
            })
            .collect();
        sink(&[sink(&stores).end(&[d2, g2, t.clone()])])
    }
}

/// `flash_tiled` compiled: the prologues (Q scaled and transposed per block; K and V padded)
/// and the attention kernel, with their scratch buffers.
pub struct FlashTiled {
    queries: Program,
    prep: Program,
    main: Program,
    n: usize,
    d: usize,
    qt: Vec<f32>,
    kp: Vec<f32>,
    vp: Vec<f32>,
}

impl FlashTiled {
    /// Compiles the three programs for `n` keys and queries of head dimension `d`.
    ///
    /// # Errors
    ///
    /// As [`FlashTiled::compile_with`].
    ///
    /// # Examples
    ///
    /// 40 keys padded to two key blocks of 32, against the f64 reference:
    ///
    /// ```rust
    /// use uopc_kernels::flash_tiled::{FlashTiled, FlashTiling};
    /// use uopc_kernels::reference::{attention_f64, max_abs_err};
    ///
    /// let (n, d) = (40, 8);
    /// let x = |seed: usize| -> Vec<f32> {
    ///     (0..n * d).map(|i| ((i * 37 + seed) % 17) as f32 * 0.1 - 0.8).collect()
    /// };
    /// let (q, k, v) = (x(1), x(2), x(3));
    /// let mut flash = FlashTiled::compile(n, d, FlashTiling::default())?;
    /// assert_eq!(flash.padded_keys(), 64);
    /// let mut out = vec![0.0f32; n * d];
    /// flash.run(&q, &k, &v, &mut out)?;
    /// assert!(max_abs_err(&out, &attention_f64(&q, &k, &v, n, d)) < 1e-5);
    /// # Ok::<(), uopc_jit::JitError>(())
    /// ```
    pub fn compile(n: usize, d: usize, tiling: FlashTiling) -> Result<Self, JitError> {
        Self::compile_with(n, d, tiling, &Self::kernel_options())
    }

    /// The options [`FlashTiled::compile`] compiles the attention kernel with. Kept in emitted
    /// order (`none`): both register tiles then take several steps per trip, and every splat
    /// stays one broadcast load feeding the FMA's tied operand. At `speed` the e-graph merges
    /// the broadcasts and reorders the tiles' loads, which costs more than its GVN and LICM
    /// save in the softmax part.
    pub fn kernel_options() -> JitOptions {
        JitOptions { opt_level: OptLevel::None, tile_steps: FLASH_TILE_STEPS, ..JitOptions::default() }
    }

    /// [`FlashTiled::compile`] with `kernel` as the attention kernel's options (the prologues
    /// keep the defaults).
    ///
    /// # Errors
    ///
    /// [`JitError::Unsupported`] when `n`, `d` or a block size is 0; the [`JitError`] of
    /// compiling one of the three programs otherwise.
    pub fn compile_with(
        n: usize,
        d: usize,
        tiling: FlashTiling,
        kernel: &JitOptions,
    ) -> Result<Self, JitError> {
        if n == 0 || d == 0 || tiling.key_block == 0 || tiling.query_block == 0 {
            return Err(JitError::Unsupported("flash_tiled needs positive n, d and block sizes".into()));
        }
        let np = padded_keys(n, tiling.key_block);
        let br = query_block(n, tiling.query_block);
        Ok(FlashTiled {
            queries: Program::compile(&flash_tiled_queries_ir(n, d, br), "flash_tiled_queries")?,
            prep: Program::compile(&flash_tiled_prep_ir(n, d, tiling.key_block), "flash_tiled_prep")?,
            main: Program::compile_with(&flash_tiled_ir(n, d, tiling), "flash_tiled", kernel)?,
            n,
            d,
            qt: vec![0.0; n * d],
            kp: vec![0.0; np * d],
            vp: vec![0.0; np * d],
        })
    }

    /// `out = softmax(q k^T / sqrt(d)) v`, all `n*d` row-major; lengths are checked.
    ///
    /// # Errors
    ///
    /// [`JitError::Argument`] when a slice does not have `n * d` elements.
    pub fn run(&mut self, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) -> Result<(), JitError> {
        self.queries.run_f32(&[q], &mut [&mut self.qt])?;
        self.prep.run_f32(&[k, v], &mut [&mut self.kp, &mut self.vp])?;
        self.main.run_f32(&[&self.qt, &self.kp, &self.vp], &mut [out])
    }

    /// The attention kernel (for its loop IR, CLIF and estimates).
    pub fn kernel(&self) -> &Program {
        &self.main
    }

    /// `(n, d)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.d)
    }

    /// Keys after padding to whole key blocks.
    pub fn padded_keys(&self) -> usize {
        self.vp.len() / self.d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Longest chain of binary operations from `u` down to a leaf.
    fn depth(u: &UOp) -> usize {
        match u.op() {
            uopc_ir::Op::Binary(_) => 1 + u.src().iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn pairwise_is_a_balanced_tree_over_every_input() {
        let a = buffer(0, DType::F32, 32);
        for n in [1usize, 2, 5, 32] {
            let xs: Vec<UOp> = (0..n as i64).map(|k| a.index(k).load()).collect();
            let tree = pairwise(&xs, |x, y| x.maximum(y));
            assert_eq!(depth(&tree), n.next_power_of_two().trailing_zeros() as usize, "n = {n}");
            let loads = UOp::toposort(std::slice::from_ref(&tree))
                .iter()
                .filter(|u| matches!(u.op(), uopc_ir::Op::Load))
                .count();
            assert_eq!(loads, n);
        }
    }
}
