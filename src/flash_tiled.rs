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

use crate::attention::LOG2E;
use crate::masked_attention::M_FLOOR;
use uopc_ir::{AxisType, DType, GemmShape, TileOp, UOp, alloc, buffer, f32c, range, sink, tile};
use uopc_jit::{JitError, JitOptions, OptLevel, Program};

/// Output columns per register tile of the `P · V` update in [`flash_tiled_ir`]: two F32X4
/// per query row, so the default 4-row block keeps 8 accumulators in registers.
const PV_COLS: usize = 8;

/// Reduce steps per trip of `flash_tiled`'s register tiles. With two, regalloc spilled one
/// score accumulator per trip (a store and reload in its FMA chain); four fit. Interleaved with
/// two steps, single thread (`cargo xtask bench attention --variants flash_tiled --threads 1`),
/// three rounds at N = 2048: 43.5 / 44.4 / 42.1 ms against 49.3 / 63.8 / 50.3 ms.
const FLASH_TILE_STEPS: usize = 4;

/// Query blocks per THREAD task of [`flash_tiled_ir`] (fewer when they do not divide the
/// blocks). Interleaved runs of `profile_flash_tiled` (best of 3, two threads, N = 4096):
/// 1 group 87.7 ms, 4 groups 82.4 ms, 8 groups 81.0 ms; one thread at N = 1024 (best of 6):
/// 9.89, 9.77 and 9.60 ms.
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
    /// over more keys. `profile_flash_tiled 1024 64` on one thread, interleaved, best of 4:
    /// 4x16 8.60 ms, 4x32 8.53 ms, 4x64 8.47 ms; two threads, best of 5: 4x8 4.76 ms, 4x16
    /// 4.41 ms, 4x32 4.19 ms.
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
pub fn flash_tiled_prep_ir(n: usize, d: usize, bc: usize) -> UOp {
    let np = padded_keys(n, bc);
    let f32t = DType::F32;
    let (k, v) = (buffer(0, f32t, n * d), buffer(1, f32t, n * d));
    let (kp, vp) = (buffer(2, f32t, np * d), buffer(3, f32t, np * d));
    let b = range(np / bc, 0, AxisType::Thread);
    let c = range(bc, 1, AxisType::Loop);
    let e = range(d, 2, AxisType::Loop);
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
pub fn flash_tiled_queries_ir(n: usize, d: usize, br: usize) -> UOp {
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let (q, qt) = (buffer(0, DType::F32, n * d), buffer(1, DType::F32, n * d));
    let t = range(n / br, 0, AxisType::Thread);
    let e = range(d, 1, AxisType::Loop);
    let b = range(br, 2, AxisType::Loop);
    let x = q.index((&t * br + &b) * d + &e).load() * scale;
    sink(&[qt.index(&t * (d * br) + &e * br + &b).store(x).end(&[b, e, t])])
}

/// FlashAttention-2 for one head: buffers 0 = Q pre-scaled by `log2(e)/sqrt(d)` and
/// transposed per query block (`n*d`, from [`flash_tiled_queries_ir`]), 1 = K padded and 2 = V
/// padded (from [`flash_tiled_prep_ir`]), 3 = output (`n*d`). Scores are base 2, as in
/// [`crate::attention::online_attention_ir`].
///
/// The query rows of a block are the vector lanes wherever rows are independent: the score
/// tile is kept transposed (`S^T`, one F32X4 of `br` rows per key), so the row maxima, the
/// rescale factors, `P = exp2(S - m)` and the row sums are whole-vector operations with no
/// reduction across lanes.
pub fn flash_tiled_ir(n: usize, d: usize, tiling: FlashTiling) -> UOp {
    let br = crate::attention::query_block(n, tiling.query_block);
    let bc = tiling.key_block.max(1);
    let np = padded_keys(n, bc);
    let f32t = DType::F32;
    let qt = buffer(0, f32t, n * d);
    let kp = buffer(1, f32t, np * d);
    let vp = buffer(2, f32t, np * d);
    let out = buffer(3, f32t, n * d);

    let mut slot = 0;
    let mut next = |len: usize| {
        slot += 1;
        alloc(slot - 1, f32t, len)
    };
    // Running max of row b at [b], running sum at [br + b], the key block's rescale factor at
    // [2br + b]: in memory, not registers, so they do not hold xmm registers across the key
    // loop or the output update.
    // Each THREAD task takes `groups` query blocks and runs all of them against one key block
    // before the next: the block's K and V (16 KiB at D = 64, Bc = 32) are then read from L1 by
    // all but the first, instead of streamed from L2 by each.
    let groups = (1..=QUERY_GROUPS).rev().find(|g| (n / br).is_multiple_of(*g)).unwrap_or(1);
    let state = next(3 * br * groups);
    let o = next(br * d * groups);
    let acc: Vec<UOp> = (0..br * bc).map(|_| next(1)).collect();
    let s_tile = next(br * bc);
    let p_tile = next(br * bc);
    let pv_acc: Vec<UOp> = (0..br * PV_COLS).map(|_| next(1)).collect();

    let t = range(n / (br * groups), 0, AxisType::Thread);
    let th = std::slice::from_ref(&t);
    let st = state.after(th);
    let oi = o.after(th);
    let zs = range(3 * br * groups, 6 + 2 * br, AxisType::Loop);
    let is_max = zs.modulo(3 * br as i64).lt(br as i64);
    let init_state = st.index(&zs).store(is_max.where_(f32c(M_FLOOR), f32c(0.0))).end(&[zs]);
    let z = range(br * d * groups, 1, AxisType::Loop);
    let init_o = oi.index(&z).store(0.0f32).end(&[z]);

    let kb = range(np / bc, 2, AxisType::Reduce);
    let g = range(groups, 10 + 2 * br + bc.div_ceil(SCORE_KEYS), AxisType::Loop);
    let tk = [t.clone(), kb.clone(), g.clone()];
    // Query block (t, g): its rows in Q^T, its row state and its output tile.
    let block = &t * groups + &g;
    let sbase = &g * (3 * br);
    let obase = &g * (br * d);
    // S^T = K_blk · Q_blk^T: one accumulator per (key, row); each key's k[e] is broadcast
    // against the vector of the rows' q[e]. The keys go in groups of SCORE_KEYS, one loop over
    // the head each, so a group's accumulators fit the registers however long the key block.
    let ai: Vec<UOp> = acc.iter().map(|x| x.after(&tk)).collect();
    let si = s_tile.after(&tk);
    // One SINK of score stores per key group. Each group starts after the previous group's
    // scores are stored: otherwise its loop may run while they are still in registers, and
    // they spill.
    let mut s_stores: Vec<UOp> = Vec::new();
    for (g, first) in (0..bc).step_by(SCORE_KEYS).enumerate() {
        let keys = first..bc.min(first + SCORE_KEYS);
        let id = if g == 0 { 3 } else { 8 + 2 * br + g };
        let e = range(d, id, AxisType::Reduce);
        let mut updates = Vec::new();
        for c in keys.clone() {
            let kv = kp.index((&kb * bc + c as i64) * d + &e).load();
            for b in 0..br {
                let a = &ai[c * br + b];
                let init = match s_stores.last() {
                    Some(p) => a.after(std::slice::from_ref(p)).index(0).store(0.0f32),
                    None => a.index(0).store(0.0f32),
                };
                let at = a.after(&[init, e.clone()]).index(0);
                let qv = qt.index(&block * (d * br) + &e * br + b as i64).load();
                updates.push(at.store(at.load() + &kv * qv));
            }
        }
        let dot = sink(&updates).end(&[e]);
        let after_dot = std::slice::from_ref(&dot);
        let mut group_stores = Vec::new();
        for (x, a) in ai.iter().enumerate().take(keys.end * br).skip(keys.start * br) {
            let mut s = a.after(after_dot).index(0).load();
            if np != n {
                s = (&kb * bc + (x / br) as i64).lt(n as i64).where_(s, f32c(f32::NEG_INFINITY));
            }
            group_stores.push(si.index(x as i64).store(s));
        }
        s_stores.push(sink(&group_stores));
    }
    let s_done = sink(&s_stores);
    let s_ready = si.after(std::slice::from_ref(&s_done));

    // The online-softmax update of the block, rows as lanes: new max, rescale factor, P^T and
    // the new row sums in one pass over the block's keys.
    let pi = p_tile.after(&tk);
    let rb = range(br, 4, AxisType::Loop);
    let row = st.after(&[init_state.clone(), kb.clone(), s_done.clone()]);
    let rs = &sbase + &rb;
    let m_old = row.index(&rs).load();
    let score = |c: usize| s_ready.index(&rb + (c * br) as i64).load();
    // The block's max as a balanced tree: a chain of 32 maxima is 32 latencies on the way to
    // every exponential of the block, a tree five.
    let m_new = pairwise(&(0..bc).map(score).collect::<Vec<_>>(), |a, b| a.maximum(b)).maximum(&m_old);
    let corr = (&m_old - &m_new).exp2();
    // The exponentials read the scores again, after the new max is stored: holding all of the
    // block's scores in registers from the max to here would spill them at larger blocks.
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
    // A chain, unlike the max: nothing of the block waits for the sum (a tree measured the same).
    let l_new = row.index(&rs + br as i64).load() * &corr + sum.expect("a key block has keys");
    // The sum's store first: the linearizer then evaluates the running sum next to each
    // exponential, instead of holding all of them for a sum at the end.
    softmax.insert(0, row.index(&rs + br as i64).store(l_new));
    softmax.push(row.index(&rs + (2 * br) as i64).store(&corr));
    let softmax_loop = sink(&softmax).end(&[rb]);
    // O = O * corr + P · V_blk. Columns in chunks of PV_COLS: per chunk a register tile of
    // br x PV_COLS accumulators reduces over the block's keys (two F32X4 per row, fed by one
    // broadcast of p and two vector loads of V per key), then the output tile is rescaled and
    // the tile added. Columns past the last whole chunk take one vectorized loop over them.
    // The row state and the rescale factors are in memory before the output update: held in
    // registers across it, they would crowd out its tile.
    let state_done = softmax_loop;
    let after_state = std::slice::from_ref(&state_done);
    let mut updates_kb = vec![state_done.clone()];
    let p_ready = pi.after(after_state);
    let mut od = oi.after(&[init_o, kb.clone(), g.clone(), state_done.clone()]);
    let chunks = d / PV_COLS;
    if chunks > 0 {
        let dc = range(chunks, 7 + 2 * br, AxisType::Loop);
        let c3 = range(bc, 8 + 2 * br, AxisType::Reduce);
        let tkd = [t.clone(), kb.clone(), g.clone(), dc.clone()];
        let pa: Vec<UOp> = pv_acc.iter().map(|x| x.after(&tkd)).collect();
        let mut pv_updates = Vec::new();
        for b in 0..br {
            let pv = p_ready.index(&c3 * br as i64 + b as i64).load();
            for j in 0..PV_COLS {
                let a = &pa[b * PV_COLS + j];
                let init = a.index(0).store(0.0f32);
                let at = a.after(&[init, c3.clone()]).index(0);
                let vv = vp.index((&kb * bc + &c3) * d + &dc * PV_COLS as i64 + j as i64).load();
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
                st.after(&[state_done.clone(), pv_loop.clone()]).index(&sbase + (2 * br + b) as i64).load();
            for j in 0..PV_COLS {
                let at = od_tile.index(&obase + &dc * PV_COLS as i64 + (b * d + j) as i64);
                o_updates
                    .push(at.store(at.load() * &cb + pa[b * PV_COLS + j].after(tile_done).index(0).load()));
            }
        }
        let chunk_loop = sink(&o_updates).end(&[dc]);
        // The column loop below reads and writes the same tile: it goes after this one.
        od = od.after(std::slice::from_ref(&chunk_loop));
        updates_kb.push(chunk_loop);
    }
    if chunks * PV_COLS < d {
        let first = chunks * PV_COLS;
        let dd = range(d - first, 4 + 2 * br, AxisType::Loop);
        let col = &dd + first as i64;
        let mut o_updates = Vec::new();
        for b in 0..br {
            let at = od.index(&obase + &col + (b * d) as i64);
            let mut x = at.load() * st.after(after_state).index(&sbase + (2 * br + b) as i64).load();
            for c in 0..bc {
                let pv = p_ready.index((c * br + b) as i64).load();
                x = x + pv * vp.index((&kb * bc + c as i64) * d + &col).load();
            }
            o_updates.push(at.store(x));
        }
        updates_kb.push(sink(&o_updates).end(&[dd]));
    }
    let key_loop = sink(&updates_kb).end(&[g, kb]);

    let d2 = range(d, 5 + 2 * br, AxisType::Loop);
    let g2 = range(groups, 11 + 2 * br + bc.div_ceil(SCORE_KEYS), AxisType::Loop);
    let done = std::slice::from_ref(&key_loop);
    let stores: Vec<UOp> = (0..br)
        .map(|b| {
            let lb = st.after(done).index(&g2 * (3 * br) + (br + b) as i64).load();
            out.index(((&t * groups + &g2) * br + b) * d + &d2)
                .store(oi.after(done).index(&g2 * (br * d) + &d2 + (b * d) as i64).load() * lb.recip())
        })
        .collect();
    sink(&[sink(&stores).end(&[d2, g2, t])])
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
        let br = crate::attention::query_block(n, tiling.query_block);
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

/// FlashAttention-2 on tile ops: buffers 0 = Q pre-scaled by `log2(e)/sqrt(d)` (`n*d`, see
/// [`FlashTileOps`]), 1 = K, 2 = V (`n*d`, row-major, as given), 3 = output (`n*d`).
///
/// One THREAD iteration owns `br` query rows (rounded down to a divisor of `n`) and streams the
/// keys in blocks of `bc`: per block a tile GEMM `S = Q_blk · K_blk^T`, the online-softmax tile
/// update (row max, `P = exp2(S - m)`, row sums, rescale of the output tile), and a tile GEMM
/// `O += P · V_blk`; the score and output tiles live on the stack. A last, narrower block takes
/// the keys left over. The division by the row sums happens once at the end, in plain loop IR.
pub fn flash_tile_ops_ir(n: usize, d: usize, tiling: FlashTiling) -> UOp {
    flash_tile_ops_program(n, d, tiling, false, None)
}

/// Causal [`flash_tile_ops_ir`]: query row `i` sees keys `j <= i`. Keys wholly before a query
/// block run unmasked, in key blocks (a divisor of the query block, or a multiple of it that
/// divides `n`, then query-block-wide blocks up to the block's first row); keys after the
/// block are skipped (the key loops end where the query block does). The square on the
/// diagonal goes in strips of up to 64 keys: strip `j` is multiplied only for the rows that
/// see it, and only its top square is masked, by a loop writing `-inf` above the diagonal.
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
    let br = crate::attention::query_block(n, tiling.query_block);
    // Causal: keys in blocks of the largest multiple of br that divides n and is at most the
    // key block, then in blocks of br up to the diagonal; with a key block below br, in the
    // largest divisor of br at most the key block (no br-blocks needed).
    let bc = if causal && tiling.key_block < br {
        crate::attention::query_block(br, tiling.key_block)
    } else if causal {
        (1..=(tiling.key_block / br).max(1))
            .rev()
            .map(|m| m * br)
            .find(|b| n.is_multiple_of(*b))
            .unwrap_or(br)
    } else {
        tiling.key_block.clamp(1, n)
    };
    let (full, rest) = (n / bc, n % bc);
    let f32t = DType::F32;
    let [q, k, v, out] = [0, 1, 2, 3].map(|slot| buffer(slot, f32t, n * d));
    // Causal diagonal strips are w keys wide (see below).
    let w = crate::attention::query_block(br, 64);
    let tile_cols = if causal { bc.max(w) } else { bc };
    // Query blocks per THREAD task and keys per super-block (see `L2Blocking`); (1, n) is the
    // plain loop, every query block streaming all keys on its own.
    let (group, keys) = match l2 {
        Some(b) if !causal => b.fit(n, br, bc).unwrap_or((1, n)),
        _ => (1, n),
    };
    let rows = group * br;
    let (s, o, mx, l) = (
        alloc(0, f32t, br * tile_cols),
        alloc(1, f32t, rows * d),
        alloc(2, f32t, rows),
        alloc(3, f32t, rows),
    );

    let t = range(n / rows, 0, AxisType::Thread);
    let th = std::slice::from_ref(&t);
    let (si, oi, mi, li) = (s.after(th), o.after(th), mx.after(th), l.after(th));
    let z = range(rows * d, 1, AxisType::Loop);
    let init_o = oi.index(&z).store(0.0f32).end(&[z]);
    let r = range(rows, 2, AxisType::Loop);
    let init_ml = sink(&[mi.index(&r).store(f32c(f32::NEG_INFINITY)), li.index(&r).store(0.0f32)]).end(&[r]);

    // One key block of `cols` keys starting at key `first`, after the effects `prev`, for the
    // query rows r0 .. br of the block; with `mask_ids`, the block's top cols x cols square
    // loses the keys after each row (the block starts on the diagonal), using those two
    // range ids.
    let block = |first: &UOp,
                 cols: usize,
                 prev: &[UOp],
                 rows_at: (&UOp, &UOp),
                 r0: usize,
                 mask_ids: Option<(usize, usize)>|
     -> UOp {
        // rows_at: the query block's first row in Q, and its first row in the state (m, l, O).
        let (q_row, state_row) = rows_at;
        let rows = br - r0;
        let scores = TileOp::Gemm(GemmShape {
            m: rows,
            n: cols,
            k: d,
            lda: d,
            ldb: d,
            ldc: cols,
            a_trans: false,
            b_trans: true,
            accumulate: false,
        });
        let q_first = (q_row + r0 as i64) * d;
        let mut g1 = tile(scores, &[q.index(q_first), k.index(first * d), si.after(prev).index(0)]);
        if let Some((rid, cid)) = mask_ids {
            // Row r hides keys r+1 .. cols, the strict upper triangle. The min only tells the
            // verifier's interval bounds that the index stays in the tile.
            let rr = range(cols, rid, AxisType::Loop);
            let cc = range(-&rr + (cols as i64 - 1), cid, AxisType::Loop);
            let at = -((-(&rr * (cols + 1) + 1 + &cc)).maximum(-((cols * cols - 1) as i64)));
            g1 = si.after(std::slice::from_ref(&g1)).index(at).store(f32c(f32::NEG_INFINITY)).end(&[cc, rr]);
        }
        let after_g1 = std::slice::from_ref(&g1);
        let mut state = prev.to_vec();
        state.push(g1.clone());
        let update = TileOp::SoftmaxUpdate { rows, cols, lds: cols, d, ldo: d };
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
        let pv = TileOp::Gemm(GemmShape {
            m: rows,
            n: d,
            k: cols,
            lda: cols,
            ldb: d,
            ldc: d,
            a_trans: false,
            b_trans: false,
            accumulate: true,
        });
        tile(
            pv,
            &[
                si.after(after_sm).index(0),
                v.index(first * d),
                oi.after(after_sm).index((state_row + r0 as i64) * d),
            ],
        )
    };
    let done = if causal {
        // Query rows q0 .. q0 + br of block t see keys 0 ..= q0 + r. Keys before q0 are all
        // visible: whole bc-blocks first, then br-blocks up to q0; the br x br block at q0 is
        // the only one the diagonal crosses, and the only one masked. Later keys are skipped.
        let q0 = &t * br;
        let zero = uopc_ir::idx(0);
        let at = (&q0, &zero);
        let big = q0.idiv(bc as i64);
        let kb = range(&big, 3, AxisType::Reduce);
        let far = block(&(&kb * bc), bc, &[init_o, init_ml, kb.clone()], at, 0, None).end(&[kb]);
        // The keys from big * bc to q0 in blocks of br (none when bc divides br). ks stays
        // below that count, so the start stays below q0; the min only tells the verifier's
        // interval bounds (they do not see that ks and big are correlated).
        let near = if bc >= br {
            let ks = range((&q0 - &big * bc).idiv(br as i64), 6, AxisType::Reduce);
            let start = &big * bc + &ks * br;
            let near_first = -((-start).maximum(-((n - br) as i64)));
            block(&near_first, br, &[far, ks.clone()], at, 0, None).end(&[ks])
        } else {
            far
        };
        // The diagonal square in strips of `w` keys: strip j is seen only by rows j*w.., so
        // its GEMMs and softmax update run on those rows, and only its top w x w square is
        // masked (keys after the row).
        let mut prev = near;
        for j in 0..br / w {
            let r0 = j * w;
            prev = block(&(&q0 + r0 as i64), w, &[prev], at, r0, Some((7 + 2 * j, 8 + 2 * j)));
        }
        prev
    } else if group > 1 || keys < n {
        // Second-level blocking: super-block sb of the keys is streamed by every query block
        // g of the task before the next one, so it comes from L2 after the first block.
        let sb = range(n / keys, 9, AxisType::Reduce);
        let g = range(group, 10, AxisType::Loop);
        let kb = range(keys / bc, 3, AxisType::Reduce);
        let (q_row, state_row) = ((&t * group + &g) * br, &g * br);
        let first = &sb * keys + &kb * bc;
        let prev = [init_o, init_ml, sb.clone(), g.clone(), kb.clone()];
        block(&first, bc, &prev, (&q_row, &state_row), 0, None).end(&[kb, g, sb])
    } else {
        let q_row = &t * br;
        let zero = uopc_ir::idx(0);
        let at = (&q_row, &zero);
        let kb = range(full, 3, AxisType::Reduce);
        let key_loop = block(&(&kb * bc), bc, &[init_o, init_ml, kb.clone()], at, 0, None).end(&[kb]);
        if rest > 0 {
            let first = uopc_ir::idx((full * bc) as i64);
            block(&first, rest, std::slice::from_ref(&key_loop), at, 0, None)
        } else {
            key_loop
        }
    };
    let after = std::slice::from_ref(&done);
    let e = range(d, 4, AxisType::Loop);
    let rr = range(rows, 5, AxisType::Loop);
    let lr = li.after(after).index(&rr).load();
    let st =
        out.index((&t * rows + &rr) * d + &e).store(oi.after(after).index(&rr * d + &e).load() * lr.recip());
    sink(&[st.end(&[e, rr, t])])
}

/// The prologue of [`flash_tile_ops_ir`]: buffer 1 = buffer 0 (`n*d`) times `log2(e)/sqrt(d)`.
pub fn scale_queries_ir(n: usize, d: usize) -> UOp {
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let (q, qs) = (buffer(0, DType::F32, n * d), buffer(1, DType::F32, n * d));
    let i = range(n, 0, AxisType::Thread);
    let e = range(d, 1, AxisType::Loop);
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
    pub fn compile(n: usize, d: usize, tiling: FlashTiling) -> Result<Self, JitError> {
        Self::compile_with(n, d, tiling, false)
    }

    /// [`FlashTileOps::compile`], causal when `causal` (see [`flash_tile_ops_causal_ir`]).
    pub fn compile_with(n: usize, d: usize, tiling: FlashTiling, causal: bool) -> Result<Self, JitError> {
        if causal {
            Self::build(n, d, tiling, flash_tile_ops_causal_ir, "flash_tile_ops_causal")
        } else {
            Self::build(n, d, tiling, flash_tile_ops_ir, "flash_tile_ops")
        }
    }

    /// [`FlashTileOps::compile`] with second-level blocking (see [`L2Blocking`]).
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
/// D = 64) still fit the stack. Single thread, `cargo xtask bench attention --variants
/// flash_tile_ops --threads 1 --flash-tile RxC`, two rounds: 256x128 took 2.54 / 2.44 ms at
/// N = 1024 and 38.9 / 41.0 ms at N = 4096, 128x128 2.59 / 3.82 and 39.3 / 42.4, 64x256
/// 3.67 / 3.00 and 47.5 / 44.5.
pub const TILE_OPS_TILING: FlashTiling = FlashTiling { query_block: 256, key_block: 128 };

/// Block sizes for causal [`FlashTileOps`]: the same 256 query rows against 128 keys as
/// [`TILE_OPS_TILING`]; the diagonal square goes in strips of 64 keys, each multiplied only
/// for the rows that see it (see [`flash_tile_ops_causal_ir`]). At N = 2048, against the full
/// kernel in the same run, three runs took 0.59, 0.61 and 0.53 of its time; the previous
/// causal form (128x256 blocks, a whole masked 128x128 square) took 0.61-0.62.
pub const CAUSAL_TILE_OPS_TILING: FlashTiling = FlashTiling { query_block: 256, key_block: 128 };

/// Second-level blocking for [`FlashTileOps::compile_l2`]: two query blocks per task share
/// super-blocks of 1024 keys (512 KiB of K and V at D = 64, a quarter of this CPU's 2 MiB L2).
pub const TILE_OPS_L2: L2Blocking = L2Blocking { query_blocks: 2, keys: 1024 };

/// Block sizes for [`TILE_OPS_L2`]: 256 query rows against 64 keys, so two output tiles
/// (2 x 64 KiB at D = 64) and the score tile (64 KiB) fit the 256 KiB of stack a kernel may use.
pub const TILE_OPS_L2_TILING: FlashTiling = FlashTiling { query_block: 256, key_block: 64 };

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
