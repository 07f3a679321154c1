//! The kernelizer: cuts a tensor graph into kernels at materialization points and builds a
//! cached [`Plan`] (kernels, temporaries, outputs) that realize runs.

use crate::error::{Result, TensorError};
use crate::exec::Exe;
use crate::opt::{Layout, has_reduce};
use crate::rangeify::{Ctx, lower};
use crate::realize::RealizeOptions;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;
use uopc_ir::{DType, HostBuffer, Op, UOp, buffer, sink};

/// Where a kernel argument lives at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufRef {
    /// The plan's input `k` (the k-th distinct data leaf of the graph, in first-use order).
    Input(usize),
    /// The plan's temporary `k`.
    Temp(usize),
    /// The plan's output buffer `k`.
    Output(usize),
}

/// Where one root's value comes from after a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutSpec {
    /// The root is input `k` itself: nothing is computed or copied.
    Input(usize),
    /// The root is the plan's output buffer `k` (see [`Plan::outputs`]).
    Output(usize),
}

/// One compiled kernel of a plan.
pub struct Kernel {
    /// `r_` (has a reduce) or `e_`, then the output shape joined by `_`.
    pub name: String,
    /// The output shape.
    pub shape: Vec<usize>,
    /// The loop program that was compiled.
    pub program: UOp,
    /// Buffer of each BUFFER slot; the last one is the output, the others are read.
    pub args: Vec<BufRef>,
    /// Static FLOPs of one run, from the backend's estimate.
    pub flops: u64,
    /// Static bytes of one run, from the backend's estimate.
    pub bytes: u64,
    pub(crate) exe: Exe,
}

impl Kernel {
    /// Whether the program calls tile ops (a GEMM mapped onto the micro-kernels).
    pub fn uses_tile_ops(&self) -> bool {
        UOp::toposort(std::slice::from_ref(&self.program)).iter().any(|u| matches!(u.op(), Op::Tile(_)))
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.name, self.args)
    }
}

/// A graph cut into kernels: what realize runs, and what tests and DEBUG output read.
pub struct Plan {
    /// Kernels in execution order.
    pub kernels: Vec<Kernel>,
    /// Temporaries as `(dtype, elements)`.
    pub temps: Vec<(DType, usize)>,
    /// Freshly allocated output buffers as `(dtype, elements)`.
    pub outputs: Vec<(DType, usize)>,
    /// For each root, where its value ends up.
    pub outs: Vec<OutSpec>,
    /// The inputs the plan expects, as `(dtype, shape)`, in slot order.
    pub inputs: Vec<(DType, Vec<usize>)>,
    /// Seconds spent cutting and lowering (excluding compilation).
    pub schedule_seconds: f64,
    /// Seconds spent compiling kernels.
    pub compile_seconds: f64,
    temp_pool: Mutex<Option<Vec<HostBuffer>>>,
    temp_allocations: AtomicUsize,
}

impl Plan {
    /// Kernel names in execution order.
    pub fn kernel_names(&self) -> Vec<&str> {
        self.kernels.iter().map(|k| k.name.as_str()).collect()
    }

    /// Element counts of the temporaries.
    pub fn temp_sizes(&self) -> Vec<usize> {
        self.temps.iter().map(|t| t.1).collect()
    }

    /// How many times a full set of temporaries has been allocated (1 after any number of
    /// sequential runs; more only when runs overlapped).
    pub fn temp_allocations(&self) -> usize {
        self.temp_allocations.load(Ordering::Relaxed)
    }

    /// The cached temporaries, or a fresh set when they are in use by another run (or on the
    /// first run).
    pub(crate) fn take_temps(&self) -> Vec<HostBuffer> {
        let cached = self.temp_pool.lock().unwrap_or_else(|e| e.into_inner()).take();
        cached.unwrap_or_else(|| {
            self.temp_allocations.fetch_add(1, Ordering::Relaxed);
            self.temps.iter().map(|&(d, n)| HostBuffer::zeros(d, n)).collect()
        })
    }

    /// Returns temporaries for the next run (kept only if the pool is empty).
    pub(crate) fn return_temps(&self, temps: Vec<HostBuffer>) {
        let mut pool = self.temp_pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.is_none() {
            *pool = Some(temps);
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plan: {} kernels", self.kernels.len())?;
        for k in &self.kernels {
            writeln!(f, "  {:<24} args {:?}", k.name, k.args)?;
        }
        writeln!(f, "  temps {:?}", self.temps)?;
        writeln!(f, "  outputs {:?}", self.outputs)?;
        write!(f, "  outs {:?}", self.outs)
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |a, &b| a.saturating_mul(b))
}

/// Physical memory, from /proc/meminfo (None where unknown).
fn physical_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Refuses plans whose buffers cannot fit in memory, before anything is allocated.
fn check_memory(temps: &[(DType, usize)], outputs: &[(DType, usize)]) -> Result<()> {
    let bytes: u128 = temps.iter().chain(outputs).map(|(d, n)| d.size() as u128 * *n as u128).sum();
    let limit = physical_memory_bytes().unwrap_or(u64::MAX) as u128;
    if bytes > limit {
        return Err(TensorError::Unsupported(format!(
            "the plan needs {:.1} GB of buffers, more than this machine's {:.1} GB of memory",
            bytes as f64 / 1e9,
            limit as f64 / 1e9
        )));
    }
    Ok(())
}

/// Rebuilds the graph under `roots` bottom-up: `f(old, rebuilt)` returns each node's
/// replacement, where `rebuilt` is `old` with already-replaced sources.
fn rewrite_graph(roots: &[UOp], mut f: impl FnMut(&UOp, UOp) -> UOp) -> Vec<UOp> {
    let mut map: HashMap<UOp, UOp> = HashMap::new();
    for u in UOp::toposort(roots) {
        let src: Vec<UOp> = u.src().iter().map(|s| map[s].clone()).collect();
        let rebuilt = u.with_src(src);
        let new = f(&u, rebuilt);
        map.insert(u, new);
    }
    roots.iter().map(|r| map[r].clone()).collect()
}

/// The canonical form of a graph, its plan-cache key: DETACH removed and each distinct DATA
/// leaf replaced by `Param { slot, shape }` in first-use order. Returns the canonical roots
/// and the DATA leaves in slot order.
pub fn canonicalize(roots: &[UOp]) -> (Vec<UOp>, Vec<UOp>) {
    let mut leaves: Vec<UOp> = Vec::new();
    let canon = rewrite_graph(roots, |old, rebuilt| match old.op() {
        Op::Data { shape, .. } => {
            let p = UOp::new(Op::Param { slot: leaves.len(), shape: shape.clone() }, old.dtype(), vec![]);
            leaves.push(old.clone());
            p
        }
        Op::Detach => rebuilt.src()[0].clone(),
        _ => rebuilt,
    });
    (canon, leaves)
}

/// ALU ops times elements that recomputing `u` would cost, stopping at materialized nodes.
fn fused_work(u: &UOp) -> usize {
    let mut n = 0;
    let mut seen = HashSet::new();
    let mut stack = vec![u.clone()];
    while let Some(x) = stack.pop() {
        if matches!(x.op(), Op::Param { .. } | Op::Data { .. } | Op::Reduce { .. } | Op::Stage)
            || !seen.insert(x.clone())
        {
            continue;
        }
        if x.op().is_alu() {
            n += 1;
        }
        stack.extend(x.src().iter().cloned());
    }
    n * numel(u.shape())
}

fn stage(u: UOp) -> UOp {
    let d = u.dtype();
    UOp::new(Op::Stage, d, vec![u])
}

fn wrap(roots: &[UOp], todo: &HashSet<UOp>) -> Vec<UOp> {
    if todo.is_empty() {
        return roots.to_vec();
    }
    rewrite_graph(roots, |old, rebuilt| if todo.contains(old) { stage(rebuilt) } else { rebuilt })
}

/// Fusing is only free if nothing is recomputed. A computed tensor EXPANDed by `factor` or more
/// (a LayerNorm output feeding a matmul) would be recomputed for every copy, so it is staged
/// when recomputing it costs at least 4096 ALU-op-elements.
pub fn stage_broadcast_compute(roots: &[UOp], factor: usize) -> Vec<UOp> {
    let mut todo = HashSet::new();
    for u in UOp::toposort(roots) {
        if !matches!(u.op(), Op::Expand(_)) || numel(u.shape()) < factor * numel(u.src()[0].shape()) {
            continue;
        }
        let mut base = u.src()[0].clone();
        while base.op().is_movement() {
            base = base.src()[0].clone();
        }
        if base.op().is_alu()
            && !matches!(base.op(), Op::Cast)
            && !base.shape().is_empty()
            && fused_work(&base) >= 4096
        {
            todo.insert(base);
        }
    }
    wrap(roots, &todo)
}

/// Flat offset in the base `Param` that movement view `v` reads at a concrete index.
pub(crate) fn view_offset(v: &UOp, index: Vec<usize>) -> Option<usize> {
    let (mut v, mut index) = (v.clone(), index);
    loop {
        let src = v.src().first().cloned();
        match v.op() {
            Op::Param { shape, .. } => {
                return Some(index.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i));
            }
            Op::Reshape(shape) => {
                let flat = index.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i);
                let src_shape = src.as_ref()?.shape();
                let mut rest = flat;
                let mut new = vec![0; src_shape.len()];
                for k in (0..src_shape.len()).rev() {
                    new[k] = rest % src_shape[k];
                    rest /= src_shape[k];
                }
                index = new;
            }
            Op::Expand(_) => {
                let ss = src.as_ref()?.shape();
                index = index.iter().zip(ss).map(|(&i, &s)| if s == 1 { 0 } else { i }).collect();
            }
            Op::Permute(perm) => {
                let mut inv = vec![0; index.len()];
                for (k, &p) in perm.iter().enumerate() {
                    inv[p] = index[k];
                }
                index = inv;
            }
            Op::Shrink(b) => index = index.iter().zip(b).map(|(&i, &(lo, _))| i + lo).collect(),
            _ => return None,
        }
        v = src?;
    }
}

/// The views a reduce input `x` reads whose stride along `axis` is neither 0 (broadcast) nor
/// 1 (contiguous), each as the un-broadcast view below its outermost EXPAND: without a
/// broadcast every element is read once, and a copy would only add a pass.
fn strided_broadcast_views(x: &UOp, axis: usize) -> Vec<UOp> {
    let xs = x.shape().to_vec();
    let mut found = Vec::new();
    let mut stack = vec![x.clone()];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v.clone()) {
            continue;
        }
        if v.op().is_alu() {
            stack.extend(v.src().iter().cloned());
            continue;
        }
        if !v.op().is_movement() || v.shape() != xs.as_slice() {
            continue;
        }
        let mut p0 = vec![0; xs.len()];
        let a = view_offset(&v, p0.clone());
        p0[axis] = 1;
        let (Some(a), Some(b)) = (a, view_offset(&v, p0)) else { continue };
        if b == a || b == a + 1 {
            continue;
        }
        let mut w = v.clone();
        while w.op().is_movement() {
            if matches!(w.op(), Op::Expand(_)) {
                let cand = w.src()[0].clone();
                if cand.op().is_movement() && cand.shape().len() == xs.len() {
                    found.push(cand);
                }
                break;
            }
            w = w.src()[0].clone();
        }
    }
    found
}

/// The layout pass: a reduce whose input reads a broadcast buffer with a non-unit stride along
/// the (innermost) reduce axis gets a contiguous copy of that view, taken before the broadcast
/// so the copy is small and every re-read is contiguous (P V reads V transposed: the copy is `e_1_64_1024` in attention).
pub fn layout_pass(roots: &[UOp]) -> Vec<UOp> {
    let mut todo = HashSet::new();
    for r in UOp::toposort(roots) {
        if !matches!(r.op(), Op::Reduce { .. }) {
            continue;
        }
        let x = &r.src()[0];
        let n = x.shape().len();
        if n == 0 || x.shape()[n - 1] <= 1 {
            continue;
        }
        todo.extend(strided_broadcast_views(x, n - 1));
    }
    wrap(roots, &todo)
}

/// The layout pass for packed register tiles: a reduce over the last axis whose input reads a
/// broadcast buffer with a non-unit stride along the last output axis (the tile's columns)
/// gets a copy in which that axis is contiguous, taken before the broadcast (Q K^T reads K
/// transposed: the copy is `e_1_64_1024` in attention). Inputs already contiguous along it,
/// like V in P V, are read in place.
pub fn layout_pass_output(roots: &[UOp]) -> Vec<UOp> {
    let mut todo: HashSet<UOp> = HashSet::new();
    for r in UOp::toposort(roots) {
        let Op::Reduce { axes, .. } = r.op() else { continue };
        let x = &r.src()[0];
        let n = x.shape().len();
        if n < 2 || *axes != 1 || x.shape()[n - 2] <= 1 {
            continue;
        }
        todo.extend(strided_broadcast_views(x, n - 2));
    }
    if todo.is_empty() {
        return roots.to_vec();
    }
    rewrite_graph(roots, |old, rebuilt| {
        if !todo.contains(old) {
            return rebuilt;
        }
        // Stage the view with the column axis last, then permute back: same values, and the
        // column axis of the staged buffer has stride 1.
        let n = rebuilt.shape().len();
        let mut perm: Vec<usize> = (0..n).filter(|&a| a != n - 2).collect();
        perm.push(n - 2);
        let mut inverse = vec![0; n];
        for (k, &p) in perm.iter().enumerate() {
            inverse[p] = k;
        }
        let d = rebuilt.dtype();
        let moved = UOp::new(Op::Permute(perm), d, vec![rebuilt]);
        UOp::new(Op::Permute(inverse), d, vec![stage(moved)])
    })
}

/// The nodes that get their own buffer: STAGEs, REDUCEs (unless `fuse_reduce`), and roots that
/// are not already an input buffer. In execution (topological) order.
pub fn materialize_points(roots: &[UOp], fuse_reduce: bool) -> Vec<UOp> {
    let root_set: HashSet<&UOp> = roots.iter().collect();
    UOp::toposort(roots)
        .into_iter()
        .filter(|u| {
            matches!(u.op(), Op::Stage)
                || (matches!(u.op(), Op::Reduce { .. }) && !fuse_reduce)
                || (root_set.contains(u) && !matches!(u.op(), Op::Param { .. }))
        })
        .collect()
}

/// The kernel body of point `p`: its computation with other points and inputs replaced by
/// `Param`s numbered in first-use order; also returns the buffer behind each local slot.
fn kernel_body(p: &UOp, buf_of: &HashMap<UOp, BufRef>) -> (UOp, Vec<BufRef>) {
    let start = if matches!(p.op(), Op::Stage) { p.src()[0].clone() } else { p.clone() };
    let mut locals: Vec<BufRef> = Vec::new();
    let mut map: HashMap<UOp, UOp> = HashMap::new();
    let mut stack = vec![(start.clone(), false)];
    while let Some((u, ready)) = stack.pop() {
        if map.contains_key(&u) {
            continue;
        }
        let leaf = if u != *p && buf_of.contains_key(&u) {
            Some(buf_of[&u])
        } else if let Op::Param { slot, .. } = u.op() {
            Some(BufRef::Input(*slot))
        } else {
            None
        };
        if let Some(b) = leaf {
            let slot = locals.iter().position(|x| *x == b).unwrap_or_else(|| {
                locals.push(b);
                locals.len() - 1
            });
            let param = UOp::new(Op::Param { slot, shape: u.shape().to_vec() }, u.dtype(), vec![]);
            map.insert(u, param);
            continue;
        }
        if ready {
            let src = u.src().iter().map(|s| map[s].clone()).collect();
            map.insert(u.clone(), u.with_src(src));
        } else {
            stack.push((u.clone(), true));
            for s in u.src().iter().rev() {
                stack.push((s.clone(), false));
            }
        }
    }
    (map[&start].clone(), locals)
}

/// `r_` when the kernel has a reduce, `e_` otherwise, then the output shape.
fn kernel_name(body: &UOp) -> String {
    let shape = body.shape();
    let dims = if shape.is_empty() {
        "1".to_string()
    } else {
        shape.iter().map(usize::to_string).collect::<Vec<_>>().join("_")
    };
    format!("{}_{dims}", if has_reduce(body) { "r" } else { "e" })
}

/// Renumbers BUFFER slots so the program's slots are `0..n` (an input rangeify never reached,
/// e.g. an unselected STACK source, would otherwise leave a hole in the argument list).
fn compact_slots(program: UOp, args: Vec<BufRef>) -> (UOp, Vec<BufRef>) {
    let mut used: Vec<usize> = UOp::toposort(std::slice::from_ref(&program))
        .iter()
        .filter_map(|u| match u.op() {
            Op::Buffer { slot, .. } => Some(*slot),
            _ => None,
        })
        .collect();
    used.sort_unstable();
    if used.len() == args.len() {
        return (program, args);
    }
    let new_args = used.iter().map(|&s| args[s]).collect();
    let prog = rewrite_graph(&[program], |_, rebuilt| match rebuilt.op() {
        Op::Buffer { slot, len } => {
            let k = used.iter().position(|s| s == slot).expect("slot is used");
            buffer(k, rebuilt.dtype(), *len)
        }
        _ => rebuilt,
    });
    (prog.into_iter().next().expect("one root"), new_args)
}

fn build_plan(roots: &[UOp], inputs: Vec<(DType, Vec<usize>)>, opts: &RealizeOptions) -> Result<Plan> {
    let t0 = Instant::now();
    let mut graph = roots.to_vec();
    // fuse_reduce asks for "never write the big intermediate", so don't stage broadcasts either
    if !opts.fuse_reduce || opts.stage_broadcasts_when_fused {
        graph = stage_broadcast_compute(&graph, 4);
    }
    match opts.opt.layout() {
        Layout::None => {}
        Layout::ReduceContiguous => graph = layout_pass(&graph),
        Layout::OutputContiguous => graph = layout_pass_output(&graph),
    }
    let points = materialize_points(&graph, opts.fuse_reduce);
    let mut buf_of: HashMap<UOp, BufRef> = HashMap::new();
    let mut outputs = Vec::new();
    let mut outs = Vec::new();
    for root in &graph {
        if let Op::Param { slot, .. } = root.op() {
            outs.push(OutSpec::Input(*slot));
        } else if let Some(BufRef::Output(k)) = buf_of.get(root) {
            outs.push(OutSpec::Output(*k));
        } else {
            buf_of.insert(root.clone(), BufRef::Output(outputs.len()));
            outs.push(OutSpec::Output(outputs.len()));
            outputs.push((root.dtype(), numel(root.shape())));
        }
    }
    let mut temps = Vec::new();
    for p in &points {
        buf_of.entry(p.clone()).or_insert_with(|| {
            temps.push((p.dtype(), numel(p.shape())));
            BufRef::Temp(temps.len() - 1)
        });
    }
    check_memory(&temps, &outputs)?;
    let mut lowered = Vec::with_capacity(points.len());
    for p in &points {
        let (body, mut args) = kernel_body(p, &buf_of);
        let name = kernel_name(&body);
        let mut ctx = Ctx::new(opts.opt.opts(&body));
        ctx.simplify_reshape = opts.simplify_reshape;
        let out = buffer(args.len(), p.dtype(), numel(p.shape()));
        let tiled = if opts.opt.tile_ops() { crate::tilemap::lower_gemm(&body, &out) } else { None };
        let program = match tiled {
            Some(program) => program,
            None => lower(&body, &out, &mut ctx)?,
        };
        args.push(buf_of[p]);
        let (program, args) = compact_slots(program, args);
        lowered.push((name, body.shape().to_vec(), program, args));
    }
    let schedule_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut kernels = Vec::with_capacity(lowered.len());
    for (name, shape, program, args) in lowered {
        let exe = Exe::compile(&program, &name, opts.scalar_codegen)?;
        let (flops, bytes) = exe.estimates();
        kernels.push(Kernel { name, shape, program, args, flops, bytes, exe });
    }
    Ok(Plan {
        kernels,
        temps,
        outputs,
        outs,
        inputs,
        schedule_seconds,
        compile_seconds: t1.elapsed().as_secs_f64(),
        temp_pool: Mutex::new(None),
        temp_allocations: AtomicUsize::new(0),
    })
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    graph: UOp,
    fuse_reduce: bool,
    stage_broadcasts_when_fused: bool,
    simplify_reshape: bool,
    scalar_codegen: bool,
    opt: String,
}

/// Plan-cache counters (process wide).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanCacheStats {
    /// Lookups answered from the cache (no scheduling, no compilation).
    pub hits: u64,
    /// Lookups that built a new plan.
    pub misses: u64,
    /// Kernels compiled in total.
    pub kernels_compiled: u64,
    /// Plans currently cached.
    pub entries: usize,
}

/// Plans kept at most; the least recently used one is dropped beyond this.
const CACHE_CAPACITY: usize = 128;

#[derive(Default)]
struct PlanCache {
    map: HashMap<CacheKey, (Arc<Plan>, u64)>,
    tick: u64,
    stats: PlanCacheStats,
}

static CACHE: LazyLock<Mutex<PlanCache>> = LazyLock::new(|| Mutex::new(PlanCache::default()));

fn cache() -> std::sync::MutexGuard<'static, PlanCache> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The plan cache's counters.
pub fn plan_cache_stats() -> PlanCacheStats {
    let c = cache();
    PlanCacheStats { entries: c.map.len(), ..c.stats }
}

/// The plan for already canonical roots, from the cache when possible; `true` on a hit.
pub(crate) fn plan_for(canon: &[UOp], leaves: &[UOp], opts: &RealizeOptions) -> Result<(Arc<Plan>, bool)> {
    let key = CacheKey {
        graph: sink(canon),
        fuse_reduce: opts.fuse_reduce,
        stage_broadcasts_when_fused: opts.stage_broadcasts_when_fused,
        simplify_reshape: opts.simplify_reshape,
        scalar_codegen: opts.scalar_codegen,
        opt: opts.opt.cache_key(),
    };
    {
        let mut c = cache();
        c.tick += 1;
        let tick = c.tick;
        if let Some(entry) = c.map.get_mut(&key) {
            entry.1 = tick;
            let plan = entry.0.clone();
            c.stats.hits += 1;
            return Ok((plan, true));
        }
    }
    let inputs = leaves.iter().map(|l| (l.dtype(), l.shape().to_vec())).collect();
    let plan = Arc::new(build_plan(canon, inputs, opts)?);
    let mut c = cache();
    c.stats.misses += 1;
    c.stats.kernels_compiled += plan.kernels.len() as u64;
    let tick = c.tick;
    c.map.insert(key, (plan.clone(), tick));
    if c.map.len() > CACHE_CAPACITY
        && let Some(old) = c.map.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone())
    {
        c.map.remove(&old);
    }
    Ok((plan, false))
}

/// The plan for `roots` (tensor-level UOps, e.g. [`Tensor::uop`](crate::Tensor::uop)):
/// canonicalized, then taken from the plan cache or built (cut, lowered, compiled) and cached.
pub fn make_plan(roots: &[UOp], opts: &RealizeOptions) -> Result<Arc<Plan>> {
    let (canon, leaves) = canonicalize(roots);
    for r in &canon {
        if r.shape().contains(&0) {
            return Err(TensorError::Unsupported("tensors with a zero-sized axis".into()));
        }
    }
    Ok(plan_for(&canon, &leaves, opts)?.0)
}
