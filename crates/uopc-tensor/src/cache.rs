//! The plan cache: plans keyed by the canonical graph and the realize options, so a graph of
//! the same shapes with new data is neither scheduled nor compiled again.

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

fn cache() -> MutexGuard<'static, PlanCache> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The plan cache's counters.
pub fn plan_cache_stats() -> PlanCacheStats {
    let c = cache();
    PlanCacheStats { entries: c.map.len(), ..c.stats }
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

/// Refuses canonical roots with a zero-sized axis (no kernel is built for them).
pub(crate) fn check_nonempty(canon: &[UOp]) -> Result<()> {
    if canon.iter().any(|r| r.shape().contains(&0)) {
        return Err(TensorError::Unsupported("tensors with a zero-sized axis".into()));
    }
    Ok(())
}

/// The plan for `roots` (tensor-level UOps, e.g. [`Tensor::uop`](crate::Tensor::uop)):
/// canonicalized, then taken from the plan cache or built (cut, lowered, compiled) and cached.
pub fn make_plan(roots: &[UOp], opts: &RealizeOptions) -> Result<Arc<Plan>> {
    let (canon, leaves) = canonicalize(roots);
    check_nonempty(&canon)?;
    Ok(plan_for(&canon, &leaves, opts)?.0)
}
