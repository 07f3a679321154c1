//! The process-wide caches of compiled programs, one entry per configuration.

use super::{Extras, Sdpa, SdpaConfig, SdpaElement, SdpaError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The process-wide caches' key: a configuration compared by value, the scale by its bits.
#[derive(Clone, Copy)]
pub(super) struct Key(SdpaConfig);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl Eq for Key {}
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.key().hash(state);
    }
}

/// A process-wide cache of compiled programs, one per configuration (configurations are
/// few, so it is not bounded).
pub(super) type ConfigCache<T> = OnceLock<Mutex<HashMap<Key, Arc<T>>>>;

/// The entry of `config` in `cache`, compiled by `compile` on first use; `true` with a
/// program this call compiled.
pub(super) fn cached<T>(
    cache: &ConfigCache<T>,
    config: &SdpaConfig,
    compile: impl FnOnce(&SdpaConfig) -> Result<T, SdpaError>,
) -> Result<(Arc<T>, bool), SdpaError> {
    let cache = cache.get_or_init(Default::default);
    let key = Key(*config);
    if let Some(hit) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok((Arc::clone(hit), false));
    }
    // Compile outside the lock, so other configurations are not held up; a racing compile of
    // the same configuration is harmless, the first one stored wins.
    let fresh = Arc::new(compile(config)?);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok((Arc::clone(map.entry(key).or_insert(fresh)), true))
}

static CACHE: ConfigCache<Sdpa> = OnceLock::new();

static COMPILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The compiled attention for `config`, compiled on first use and shared by every later call
/// in the process.
pub fn compiled(config: &SdpaConfig) -> Result<Arc<Sdpa>, SdpaError> {
    let (sdpa, fresh) = cached(&CACHE, config, Sdpa::compile)?;
    if fresh {
        COMPILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(sdpa)
}

/// How many programs [`compiled`] (and so [`attention`]) has compiled in this process.
pub fn compile_count() -> usize {
    COMPILES.load(std::sync::atomic::Ordering::Relaxed)
}

/// [`Sdpa::run`] of the cached compile of `config` (see [`compiled`]).
pub fn attention<T: SdpaElement>(
    config: &SdpaConfig,
    q: &[T],
    k: &[T],
    v: &[T],
    extras: Extras<'_>,
    out: &mut [T],
) -> Result<(), SdpaError> {
    compiled(config)?.run(q, k, v, extras, out)
}
