//! The plan cache: plans keyed by the canonical graph and the realize options, so a graph of
//! the same shapes with new data is neither scheduled nor compiled again.
//!
//! The cache is process wide and bounded twice: it keeps at most 128 plans, and the
//! temporaries its plans keep between runs take at most [`plan_cache_limit`] bytes (1 GiB
//! unless [`set_plan_cache_limit`] says otherwise). Beyond that bound the pooled temporaries of
//! the least recently used plans are dropped; their compiled kernels stay, and their next run
//! allocates temporaries again. [`clear_plan_cache`] empties it.

use crate::error::{Result, TensorError};
use crate::kernelize::build_plan;
use crate::options::RealizeOptions;
use crate::passes::canonicalize;
use crate::plan::Plan;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use uopc_ir::{UOp, sink};

/// The canonical graph (one SINK over the roots) and the options it was planned with.
type CacheKey = (UOp, RealizeOptions);

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
    /// Bytes of temporaries the cached plans keep for their next run.
    pub pooled_temp_bytes: usize,
    /// Sets of pooled temporaries dropped to stay within [`plan_cache_limit`].
    pub temp_evictions: u64,
}

/// The default bound on the cached plans' pooled temporaries: 1 GiB.
pub const DEFAULT_PLAN_CACHE_LIMIT: usize = 1 << 30;

/// Plans kept at most; the least recently used one is dropped beyond this.
const CACHE_CAPACITY: usize = 128;

struct PlanCache {
    map: HashMap<CacheKey, (Arc<Plan>, u64)>,
    tick: u64,
    stats: PlanCacheStats,
    temp_limit: usize,
}

impl PlanCache {
    /// Drops the pooled temporaries of the least recently used plans until the pooled total
    /// is at most the limit (a plan whose temporaries alone exceed it keeps none).
    fn trim_pooled_temps(&mut self) {
        let mut pooled: Vec<(u64, Arc<Plan>, usize)> = self
            .map
            .values()
            .filter_map(|(plan, tick)| {
                let bytes = plan.pooled_temp_bytes();
                (bytes > 0).then(|| (*tick, plan.clone(), bytes))
            })
            .collect();
        let mut total: usize = pooled.iter().map(|p| p.2).sum();
        if total <= self.temp_limit {
            return;
        }
        pooled.sort_by_key(|p| p.0);
        for (_, plan, _) in pooled {
            if total <= self.temp_limit {
                break;
            }
            let freed = plan.drop_pooled_temps();
            if freed > 0 {
                total -= freed.min(total);
                self.stats.temp_evictions += 1;
            }
        }
    }
}

static CACHE: LazyLock<Mutex<PlanCache>> = LazyLock::new(|| {
    Mutex::new(PlanCache {
        map: HashMap::new(),
        tick: 0,
        stats: PlanCacheStats::default(),
        temp_limit: DEFAULT_PLAN_CACHE_LIMIT,
    })
});

fn cache() -> MutexGuard<'static, PlanCache> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The plan cache's counters.
pub fn plan_cache_stats() -> PlanCacheStats {
    let c = cache();
    let pooled_temp_bytes = c.map.values().map(|(plan, _)| plan.pooled_temp_bytes()).sum();
    PlanCacheStats { entries: c.map.len(), pooled_temp_bytes, ..c.stats }
}

/// Empties the plan cache: the next realize of any graph schedules and compiles again. Plans
/// the caller still holds (from [`make_plan`]) stay valid; the counters keep counting.
pub fn clear_plan_cache() {
    let mut c = cache();
    c.map.clear();
}

/// Bounds the bytes of temporaries that cached plans keep between runs, dropping the least
/// recently used plans' temporaries at once if they are over the new bound. 0 keeps none
/// (every run allocates its temporaries); the default is [`DEFAULT_PLAN_CACHE_LIMIT`].
///
/// ```rust
/// use uopc_tensor::{DEFAULT_PLAN_CACHE_LIMIT, plan_cache_limit, set_plan_cache_limit};
/// set_plan_cache_limit(64 << 20); // keep at most 64 MiB of temporaries between runs
/// assert_eq!(plan_cache_limit(), 64 << 20);
/// set_plan_cache_limit(DEFAULT_PLAN_CACHE_LIMIT);
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
pub fn set_plan_cache_limit(bytes: usize) {
    let mut c = cache();
    c.temp_limit = bytes;
    c.trim_pooled_temps();
}

/// The current bound on the cached plans' pooled temporaries, in bytes.
pub fn plan_cache_limit() -> usize {
    cache().temp_limit
}

/// Keeps the pooled temporaries within the bound; realize calls it after returning a plan's
/// temporaries to its pool.
pub(crate) fn trim_pooled_temps() {
    cache().trim_pooled_temps();
}

/// The plan for already canonical roots, from the cache when possible; `true` on a hit.
pub(crate) fn plan_for(canon: &[UOp], leaves: &[UOp], opts: &RealizeOptions) -> Result<(Arc<Plan>, bool)> {
    let key: CacheKey = (sink(canon), opts.clone());
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

/// Refuses graphs with a zero-sized axis anywhere: no kernel is built for one. The Tensor
/// ops never put an empty node under a non-empty one (an empty result is an empty leaf, a
/// sum over an empty axis a constant) and [`realize`](crate::realize) returns empty roots
/// without planning, so this only meets an op that cannot take empty inputs (a custom
/// kernel such as attention) and names it.
pub(crate) fn check_nonempty(canon: &[UOp]) -> Result<()> {
    if canon.iter().any(|r| r.shape().contains(&0)) {
        return Err(TensorError::Unsupported("tensors with a zero-sized axis".into()));
    }
    let topo = UOp::toposort(canon);
    if let Some(u) = topo.iter().find(|u| u.src().iter().any(|s| s.shape().contains(&0))) {
        let shapes: Vec<&[usize]> = u.src().iter().map(|s| s.shape()).collect();
        return Err(TensorError::Unsupported(format!(
            "{} of inputs shaped {shapes:?}: it cannot take a zero-sized axis",
            u.op().name()
        )));
    }
    Ok(())
}

/// The plan for `roots` (tensor-level UOps, e.g. [`Tensor::uop`](crate::Tensor::uop)):
/// canonicalized, then taken from the plan cache or built (cut, lowered, compiled) and cached.
///
/// ```rust
/// use uopc_tensor::{RealizeOptions, Tensor, make_plan};
/// let a = Tensor::from_vec(vec![1.0f32; 64 * 32], &[64, 32]);
/// let b = Tensor::from_vec(vec![0.5f32; 32 * 48], &[32, 48]);
/// let plan = make_plan(&[a.matmul(&b).uop().clone()], &RealizeOptions::default())?;
/// assert_eq!(plan.kernel_names(), ["r_64_48"]); // one GEMM kernel, on the micro-kernels
/// assert!(plan.kernels[0].uses_tile_ops());
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// [`TensorError::Unsupported`] when a root has a zero-sized axis or the plan's buffers cannot fit in memory;
/// [`TensorError::Ir`] or [`TensorError::Backend`] when a kernel fails to verify or compile (a compiler bug,
/// reported rather than hidden).
pub fn make_plan(roots: &[UOp], opts: &RealizeOptions) -> Result<Arc<Plan>> {
    let (canon, leaves) = canonicalize(roots);
    check_nonempty(&canon)?;
    Ok(plan_for(&canon, &leaves, opts)?.0)
}
