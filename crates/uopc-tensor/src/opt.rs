//! Kernel opts (upcast, unroll, thread) and the optimizers that choose them per kernel.

use crate::view::{movement_chain, reapply, view_offset};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;
use uopc_ir::{Op, UOp};

/// How one kernel is lowered: which output axes are expanded in registers, how far the last
/// reduce axis is unrolled, and which output axis runs in parallel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Opts {
    /// `(output axis, amount)`: the axis becomes `outer * amount + c` for constants `c`, each
    /// constant a separate copy of the kernel body (and of every reduce accumulator in it).
    /// Ignored when `amount` does not divide the axis.
    pub upcast: Vec<(usize, usize)>,
    /// The innermost reduce axis of every reduce is split as `outer * unroll + c`; the copies
    /// are combined in a balanced tree and share one loop. 1 (or 0) means no unrolling.
    pub unroll: usize,
    /// The output axis run as a THREAD range. Only axis 0 can be threaded (the THREAD range
    /// must be the outermost loop); other values are ignored.
    pub thread: Option<usize>,
    /// With `thread`, how many leading output axes the THREAD range covers, merged into one
    /// range of their product (each axis's index taken back by division and remainder); 0 or
    /// 1 is axis 0 alone. None of them may be upcast (an upcast merged axis is not merged).
    pub thread_axes: usize,
    /// With `thread` on a kernel of one axis longer than 1 (wherever it is), the THREAD range runs over runs of this many
    /// consecutive elements, each an inner loop (which the backend vectorizes, where a THREAD
    /// range of single elements runs scalar code); ignored unless it divides the axis and is
    /// above 1.
    pub thread_split: usize,
}

impl Opts {
    /// The upcast amount of `axis` (1 when not upcast).
    pub fn upcast_of(&self, axis: usize) -> usize {
        self.upcast.iter().rev().find(|(a, _)| *a == axis).map_or(1, |&(_, n)| n.max(1))
    }
}

/// Which contiguous copies the layout pass makes for reduce inputs read through a broadcast.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// No copies.
    None,
    /// Contiguous along the reduce axis (P V reads a transposed copy of V),
    /// for kernels whose reduce loop is vectorized into partial sums.
    #[default]
    ReduceContiguous,
    /// Contiguous along the last output axis (Q K^T reads a transposed copy of K), for kernels
    /// whose register tile packs four output columns into one vector: every tile row then
    /// loads four neighbouring elements at once.
    OutputContiguous,
}

/// Chooses the [`Opts`] of each kernel, and which layout pass runs.
///
/// Optimizers are values passed to a realize call inside
/// [`RealizeOptions`](crate::RealizeOptions); plans are cached per [`Optimizer::cache_key`],
/// so an optimizer's decisions must depend on nothing but its key and the kernel body.
pub trait Optimizer: Send + Sync + fmt::Debug {
    /// The opts for a kernel whose body (tensor-level, inputs as `Param`s) is `body`.
    fn opts(&self, body: &UOp) -> Opts;
    /// The layout pass to run (contiguous copies of strided reduce inputs).
    fn layout(&self) -> Layout {
        Layout::ReduceContiguous
    }
    /// Whether GEMM-shaped kernels become tile GEMMs (calls into the AVX-512 / AVX2
    /// micro-kernels) instead of loop nests.
    fn tile_ops(&self) -> bool {
        false
    }
    /// Identifies this optimizer's decisions; two optimizers with one key must choose alike.
    fn cache_key(&self) -> OptimizerKey;
}

/// What identifies an optimizer's decisions in the plan cache. The optimizers of this crate
/// are keyed by their own parameters; an optimizer defined elsewhere names its kind and the
/// numbers that tell its configurations apart.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OptimizerKey {
    /// [`DefaultOpt`] with these parameters.
    Default(DefaultOpt),
    /// [`FlashOpt`] with these parameters.
    Flash(FlashOpt),
    /// [`NoOpt`].
    NoOpt,
    /// [`FixedOpts`] with these opts.
    Fixed(Opts),
    /// An optimizer defined outside this crate.
    Custom {
        /// Its kind, unique among optimizers (a type name is a good choice).
        kind: &'static str,
        /// Its parameters: equal exactly when two instances decide alike.
        params: Vec<u64>,
    },
}

/// An optimizer shared between options, with its cache key read once when it is wrapped
/// (optimizers are immutable values). Equality and hashing are those of the key, which makes
/// [`RealizeOptions`](crate::RealizeOptions) usable as the plan-cache key.
#[derive(Clone)]
pub struct SharedOptimizer {
    optimizer: Arc<dyn Optimizer>,
    key: OptimizerKey,
}

impl SharedOptimizer {
    /// Wraps `optimizer`.
    pub fn new(optimizer: impl Optimizer + 'static) -> Self {
        SharedOptimizer::from(Arc::new(optimizer) as Arc<dyn Optimizer>)
    }

    /// The key read when the optimizer was wrapped.
    pub fn key(&self) -> &OptimizerKey {
        &self.key
    }
}

impl From<Arc<dyn Optimizer>> for SharedOptimizer {
    fn from(optimizer: Arc<dyn Optimizer>) -> Self {
        let key = optimizer.cache_key();
        SharedOptimizer { optimizer, key }
    }
}

impl Deref for SharedOptimizer {
    type Target = dyn Optimizer;
    fn deref(&self) -> &(dyn Optimizer + 'static) {
        &*self.optimizer
    }
}

impl fmt::Debug for SharedOptimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.optimizer.fmt(f)
    }
}

impl PartialEq for SharedOptimizer {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for SharedOptimizer {}

impl Hash for SharedOptimizer {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

pub(crate) fn has_reduce(body: &UOp) -> bool {
    UOp::toposort(std::slice::from_ref(body)).iter().any(|u| matches!(u.op(), Op::Reduce { .. }))
}

/// Whether some input of `body` is read through a broadcast along output axis `axis`: one
/// of its views (a chain of movement ops over a `Param`, as consumed by compute) has the same
/// offset at index 0 and index 1 of that axis, at two probe points.
pub(crate) fn broadcast_along(body: &UOp, axis: usize) -> bool {
    let nodes = UOp::toposort(std::slice::from_ref(body));
    let is_view = |u: &UOp| u.op().is_movement() || matches!(u.op(), Op::Param { .. });
    // Views consumed by something that is not itself a view.
    let mut views: Vec<&UOp> = Vec::new();
    for u in nodes.iter().filter(|u| !is_view(u)) {
        views.extend(u.src().iter().filter(|s| is_view(s)));
    }
    views.iter().any(|v| {
        let shape = v.shape();
        if shape.len() <= axis || shape[axis] < 2 {
            return false;
        }
        let probes = [vec![0; shape.len()], shape.iter().map(|&s| s / 2).collect::<Vec<_>>()];
        probes.into_iter().all(|mut at| {
            at[axis] = 0;
            let first = view_offset(v, at.clone());
            at[axis] = 1;
            first.is_some() && first == view_offset(v, at)
        })
    })
}

/// Columns one task of a column reduction sums at once: the widest of [`COLUMN_RUNS`] that
/// divides the output's last axis. Each reduce step reads a run of that many neighbouring
/// floats in one row; the rows are a whole row's stride apart, so every step touches another
/// page, and a wider run makes each page (TLB miss) and cache line count for more columns.
fn column_run(size: usize) -> Option<usize> {
    COLUMN_RUNS.into_iter().find(|&c| size.is_multiple_of(c))
}

/// The runs [`column_run`] tries, widest first: 32 floats are two cache lines, and 8 F32X4
/// accumulators, half of x86-64's xmm registers.
const COLUMN_RUNS: [usize; 3] = [32, 16, 8];

/// Whether some input of reduce kernel `body` is read down a column: one of its views has
/// stride 1 along output axis `axis` and another stride along the reduced (last) axis, like
/// the column sums of a bias gradient. Upcasting `axis` then makes each reduce step load
/// neighbouring elements into neighbouring accumulators instead of striding.
pub(crate) fn reduces_down_columns(body: &UOp, axis: usize) -> bool {
    let Some(r) =
        UOp::toposort(std::slice::from_ref(body)).into_iter().find(|u| matches!(u.op(), Op::Reduce { .. }))
    else {
        return false;
    };
    let Some(x) = r.as_reduce().map(|r| r.input) else { return false };
    let rank = x.shape().len();
    if rank < 2 || axis + 1 >= rank {
        return false;
    }
    // Movement ops above an ALU op move its operands alike (a gradient's sum permutes its
    // product), so they are carried down and re-applied to each operand's view.
    let mut stack: Vec<(UOp, Vec<UOp>)> = vec![(x.clone(), Vec::new())];
    while let Some((u, above)) = stack.pop() {
        // Top to bottom: the ops above `u`, then `u`'s own.
        let (own, base) = movement_chain(&u);
        let mut chain = above;
        chain.extend(own);
        if base.op().is_alu() {
            stack.extend(base.src().iter().map(|s| (s.clone(), chain.clone())));
            continue;
        }
        if !matches!(base.op(), Op::Param { .. }) {
            continue;
        }
        let view = reapply(&chain, base);
        let at = |a: Option<usize>| {
            let mut idx = vec![0; rank];
            if let Some(a) = a {
                idx[a] = 1;
            }
            view_offset(&view, idx)
        };
        if let (Some(o), Some(along), Some(down)) = (at(None), at(Some(axis)), at(Some(rank - 1)))
            && along == o + 1
            && down > o + 1
        {
            return true;
        }
    }
    false
}

/// The default: register-tile reduce kernels and thread the first output axis.
///
/// A kernel with a reduce gets its last two output axes upcast by `tile` (a rank-1 output gets
/// one upcast), so each loaded operand feeds several accumulators; with `upcast_needs_reuse`
/// (the default) only axes along which some input is broadcast, where that reuse exists. Axis
/// 0 is threaded when it has more than one element.
///
/// The default is a 4x8 tile with [`Layout::OutputContiguous`]: the backend packs each four
/// neighbouring output columns into one F32X4 accumulator, so the tile is 8 vector
/// accumulators fed per reduce step by 4 broadcast loads and 2 vector loads, which fits
/// x86-64's 16 xmm registers (the GEMM micro-kernel shape).
/// [`Experiments::tile_4x4_opt`](crate::Experiments::tile_4x4_opt) is the earlier 4x4 tile
/// with the reduce-contiguous layout, where the backend vectorizes the reduce loop instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DefaultOpt {
    /// Upcast of the second-to-last and last output axes of reduce kernels.
    pub tile: (usize, usize),
    /// The layout pass.
    pub layout: Layout,
    /// GEMM-shaped kernels (`sum_k A[i,k] B[k,j]` over input views) become tile GEMMs.
    pub tile_ops: bool,
    /// Upcast an output axis only when some input is broadcast along it. Only then does one
    /// load feed several accumulators; otherwise the copies just multiply register pressure
    /// (a softmax row sum upcast over 8 rows runs 8 exp2 chains that spill), and one row at
    /// a time lets the backend vectorize the reduce loop instead.
    pub upcast_needs_reuse: bool,
}

impl Default for DefaultOpt {
    fn default() -> Self {
        DefaultOpt {
            tile: (4, 8),
            layout: Layout::OutputContiguous,
            tile_ops: true,
            upcast_needs_reuse: true,
        }
    }
}

impl DefaultOpt {
    /// The default with every kernel a loop nest (no tile GEMMs): what the JIT's own code
    /// generation reaches.
    pub fn loops() -> Self {
        DefaultOpt { tile_ops: false, ..DefaultOpt::default() }
    }
}

impl Optimizer for DefaultOpt {
    fn opts(&self, body: &UOp) -> Opts {
        let shape = body.shape();
        let mut o = Opts::default();
        if has_reduce(body) {
            let n = shape.len();
            let amounts = if n >= 2 { vec![self.tile.0, self.tile.1] } else { vec![self.tile.1] };
            for (&amount, (a, &size)) in
                amounts.iter().zip(shape.iter().enumerate().skip(n.saturating_sub(2)))
            {
                let down_columns = reduces_down_columns(body, a);
                // A rank-1 column reduction has no second upcast axis, so its run can take the
                // registers a tile's rows would.
                let amount = if down_columns && n == 1 { column_run(size).unwrap_or(amount) } else { amount };
                if amount > 1
                    && size >= amount
                    && size.is_multiple_of(amount)
                    && (!self.upcast_needs_reuse || broadcast_along(body, a) || down_columns)
                {
                    o.upcast.push((a, amount));
                }
            }
        }
        // Leading axes of size 1 (a batch of one) make no loop: the THREAD range merges past
        // them (see `thread_axes`).
        if shape.iter().any(|&s| s > 1) {
            o.thread = Some(0);
        }
        o.thread_axes = thread_axes(shape, &o, has_reduce(body));
        if let Some(j) = single_long_axis(shape)
            && !has_reduce(body)
        {
            o.thread_split = thread_split(shape[j]);
        }
        o
    }
    fn layout(&self) -> Layout {
        self.layout
    }
    fn tile_ops(&self) -> bool {
        self.tile_ops
    }
    fn cache_key(&self) -> OptimizerKey {
        OptimizerKey::Default(*self)
    }
}

/// THREAD iterations a kernel wants at least before its leading axes are merged into one
/// THREAD range: enough for every core of a large server to take several, so that an axis 0 of
/// a few batch items or heads (5 tasks over 2 cores is a 3:2 split) does not decide the balance.
const MIN_THREAD_TASKS: usize = 64;

/// The most iterations a merged THREAD range may have: the compiler proves that its
/// iterations write disjoint memory by enumerating them (a merged index is no single stride
/// times the range), and past its enumeration budget it would run the kernel serially.
const MAX_MERGED_THREAD_TASKS: usize = 1 << 16;

/// How many leading axes of `shape` the THREAD range of `o` covers: axis 0, then the next
/// axes while there are fewer than [`MIN_THREAD_TASKS`] iterations and merging keeps at most
/// [`MAX_MERGED_THREAD_TASKS`], stopping before any upcast axis and, unless the kernel `reduces` (its innermost loop is then the reduce's),
/// before the last axis (the innermost loop, which the vectorizer reads).
fn thread_axes(shape: &[usize], o: &Opts, reduces: bool) -> usize {
    if o.thread != Some(0) {
        return 0;
    }
    let mergeable = if reduces { shape.len() } else { shape.len().saturating_sub(1) };
    let mut merged = 1;
    let mut tasks = shape[0];
    while tasks < MIN_THREAD_TASKS
        && merged < mergeable
        && o.upcast_of(merged) == 1
        && o.upcast_of(0) == 1
        && tasks.saturating_mul(shape[merged]) <= MAX_MERGED_THREAD_TASKS
    {
        tasks *= shape[merged];
        merged += 1;
    }
    merged
}

/// Elements per THREAD iteration of a one-axis elementwise kernel, at most.
const THREAD_RUN_MAX: usize = 1024;
/// The one axis of `shape` longer than 1, when there is exactly one: the axis a kernel's
/// [`Opts::thread_split`] runs over.
pub(crate) fn single_long_axis(shape: &[usize]) -> Option<usize> {
    let mut long = (0..shape.len()).filter(|&k| shape[k] > 1);
    match (long.next(), long.next()) {
        (Some(j), None) => Some(j),
        _ => None,
    }
}

/// The fewest elements per THREAD iteration worth an inner loop: a few vectors' worth.
const THREAD_RUN_MIN: usize = 16;

/// The run of consecutive elements each THREAD iteration of a one-axis elementwise kernel of
/// `n` elements takes: the largest divisor of `n` in [`THREAD_RUN_MIN`]..=[`THREAD_RUN_MAX`]
/// that leaves at least [`MIN_THREAD_TASKS`] iterations, or 0 (no split) when none does.
fn thread_split(n: usize) -> usize {
    (THREAD_RUN_MIN..=THREAD_RUN_MAX)
        .rev()
        .find(|&c| n.is_multiple_of(c) && n / c >= MIN_THREAD_TASKS)
        .unwrap_or(0)
}

/// The optimizer for fully fused attention: upcast the last output axis by
/// `min(size, max_upcast)` (16 by default) so each recomputed q.k value feeds that many output
/// accumulators, and thread axis 0 (one query row per iteration). Written as sums that wait for
/// the maximum, each group of output columns makes its own pass over the keys: two softmax
/// passes plus `D / upcast` output passes. Once they are online sums (see
/// [`online_reductions`](crate::online_reductions)), a last axis of up to 128 is upcast whole,
/// so the maximum, the normalizer and every output column share one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashOpt {
    /// Largest upcast of the last output axis.
    pub max_upcast: usize,
}

impl Default for FlashOpt {
    fn default() -> Self {
        FlashOpt { max_upcast: 16 }
    }
}

impl Optimizer for FlashOpt {
    fn opts(&self, body: &UOp) -> Opts {
        let shape = body.shape();
        let mut o = Opts::default();
        if let Some(&last) = shape.last() {
            // An online group shares one pass over the keys only when every output column of
            // a row is accumulated in it, so its last axis is upcast whole.
            let whole = last <= ONLINE_MAX_UPCAST && crate::online::online_sums_in(body) > 0;
            let upcast = if whole { last } else { last.min(self.max_upcast.max(1)) };
            o.upcast.push((shape.len() - 1, upcast));
        }
        if shape.first().is_some_and(|&s| s > 1) {
            o.thread = Some(0);
        }
        o
    }
    /// An online group over a matrix product (fully fused attention) becomes tile ops.
    fn tile_ops(&self) -> bool {
        true
    }
    fn cache_key(&self) -> OptimizerKey {
        OptimizerKey::Flash(*self)
    }
}

/// The widest last axis [`FlashOpt`] upcasts whole for an online group: past it, the
/// accumulators of one row no longer fit the registers and one pass per column group is cheaper.
const ONLINE_MAX_UPCAST: usize = 128;

/// No opts and no layout pass: plain sequential loops, the reference lowering.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoOpt;

impl Optimizer for NoOpt {
    fn opts(&self, _body: &UOp) -> Opts {
        Opts::default()
    }
    fn layout(&self) -> Layout {
        Layout::None
    }
    fn cache_key(&self) -> OptimizerKey {
        OptimizerKey::NoOpt
    }
}

/// The same opts for every kernel (tests and experiments).
#[derive(Clone, Debug, Default)]
pub struct FixedOpts(pub Opts);

impl Optimizer for FixedOpts {
    fn opts(&self, _body: &UOp) -> Opts {
        self.0.clone()
    }
    fn cache_key(&self) -> OptimizerKey {
        OptimizerKey::Fixed(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threaded(upcast: Vec<(usize, usize)>) -> Opts {
        Opts { upcast, thread: Some(0), ..Opts::default() }
    }

    #[test]
    fn few_leading_items_share_the_thread_range_with_the_axes_after_them() {
        // 5 heads x 1021 rows x 1021 keys: heads and rows are one THREAD range of 5105.
        assert_eq!(thread_axes(&[5, 1021, 1021], &threaded(Vec::new()), false), 2);
        // Merging would make more iterations than the disjointness proof enumerates.
        assert_eq!(thread_axes(&[2, 600_000, 8], &threaded(Vec::new()), false), 1);
        // Enough items on axis 0: it alone.
        assert_eq!(thread_axes(&[100, 5, 16], &threaded(Vec::new()), false), 1);
        // Merging goes on while there are too few tasks, never over the last axis of an
        // elementwise kernel; a reduction's last output axis is not its innermost loop.
        assert_eq!(thread_axes(&[2, 3, 4, 16], &threaded(Vec::new()), false), 3);
        assert_eq!(thread_axes(&[2, 3], &threaded(Vec::new()), false), 1);
        assert_eq!(thread_axes(&[2, 3], &threaded(Vec::new()), true), 2);
        // An upcast axis is not merged, nor is anything when axis 0 is upcast.
        assert_eq!(thread_axes(&[2, 8, 16], &threaded(vec![(1, 4)]), false), 1);
        assert_eq!(thread_axes(&[4, 8, 16], &threaded(vec![(0, 4)]), true), 1);
        // A batch of one: the THREAD range merges past it.
        assert_eq!(thread_axes(&[1, 512, 3072], &threaded(Vec::new()), false), 2);
        assert_eq!(thread_axes(&[1, 12, 512], &threaded(Vec::new()), true), 3);
        // No THREAD range, nothing to merge.
        assert_eq!(thread_axes(&[2, 8, 16], &Opts::default(), false), 0);
    }

    /// The sum of a stored `(rows, cols)` matrix over its rows (`down`) or its columns.
    fn matrix_sum(rows: usize, cols: usize, down: bool) -> UOp {
        let stored = UOp::new(Op::Param { slot: 0, shape: vec![rows, cols] }, uopc_ir::DType::F32, vec![]);
        let x =
            if down { UOp::new(Op::Permute(vec![1, 0]), uopc_ir::DType::F32, vec![stored]) } else { stored };
        UOp::new(Op::Reduce { op: uopc_ir::ReduceOp::Add, axes: 1 }, uopc_ir::DType::F32, vec![x])
    }

    #[test]
    fn column_sums_take_runs_of_columns_as_wide_as_divide_them() {
        let upcast = |rows, cols, down| DefaultOpt::default().opts(&matrix_sum(rows, cols, down)).upcast;
        assert_eq!(upcast(2048, 3072, true), vec![(0, 32)]);
        assert_eq!(upcast(2048, 48, true), vec![(0, 16)]);
        assert_eq!(upcast(64, 40, true), vec![(0, 8)]);
        assert_eq!(upcast(64, 36, true), Vec::new());
        // Row sums read along the rows: no input is read down a column, nothing upcast.
        assert_eq!(upcast(2048, 3072, false), Vec::new());
    }

    #[test]
    fn one_axis_kernels_run_their_thread_range_over_runs_of_elements() {
        assert_eq!(thread_split(1_000_000), 1000);
        assert_eq!(thread_split(1 << 20), 1024);
        // A prime has no run; a short axis keeps enough iterations or none.
        assert_eq!(thread_split(1_000_003), 0);
        assert_eq!(thread_split(64 * 20), 20);
        assert_eq!(thread_split(100), 0);
    }
}
