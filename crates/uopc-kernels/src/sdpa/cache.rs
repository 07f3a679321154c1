//! The process-wide caches of compiled programs, one entry per configuration.

use super::{Extras, Sdpa, SdpaConfig, SdpaElement, SdpaError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Configurations each process-wide cache keeps by default ([`set_cache_capacity`]).
pub const DEFAULT_CACHE_CAPACITY: usize = 64;

static CAPACITY: AtomicUsize = AtomicUsize::new(DEFAULT_CACHE_CAPACITY);

/// Every cache's clear generation: a cache whose generation is older empties itself on its next
/// use ([`clear_caches`]).
static GENERATION: AtomicUsize = AtomicUsize::new(0);

/// Sets how many compiled configurations each attention cache (forward, backward) keeps; the
/// least recently used beyond that are dropped on the next insertion. At least 1.
pub fn set_cache_capacity(configurations: usize) {
    CAPACITY.store(configurations.max(1), Ordering::Relaxed);
}

/// How many compiled configurations each attention cache keeps.
pub fn cache_capacity() -> usize {
    CAPACITY.load(Ordering::Relaxed)
}

/// Empties the attention caches: the next call of each configuration compiles again. Programs
/// still held by a caller (an `Arc` from [`compiled`]) stay valid.
pub fn clear_caches() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The entries of one cache, with a use counter for least-recently-used eviction.
pub(super) struct Entries<T> {
    map: HashMap<Key, (Arc<T>, u64)>,
    clock: u64,
    generation: usize,
    /// The counter [`clear_caches`] bumps ([`GENERATION`]; a test's own one in unit tests,
    /// which other tests of the process clearing the caches must not disturb).
    generations: &'static AtomicUsize,
}

impl<T> Entries<T> {
    fn new() -> Entries<T> {
        Self::with_generations(&GENERATION)
    }

    fn with_generations(generations: &'static AtomicUsize) -> Entries<T> {
        Entries {
            map: HashMap::new(),
            clock: 0,
            generation: generations.load(Ordering::Relaxed),
            generations,
        }
    }

    /// Drops everything if [`clear_caches`] ran since the last use.
    fn sync_generation(&mut self) {
        let now = self.generations.load(Ordering::Relaxed);
        if self.generation != now {
            self.map.clear();
            self.generation = now;
        }
    }

    fn get(&mut self, key: &Key) -> Option<Arc<T>> {
        self.sync_generation();
        self.clock += 1;
        let clock = self.clock;
        self.map.get_mut(key).map(|(v, used)| {
            *used = clock;
            Arc::clone(v)
        })
    }

    /// Stores `fresh` under `key` (or returns what a racing compile stored first), dropping the
    /// least recently used entries so at most `capacity` remain.
    fn insert(&mut self, key: Key, fresh: Arc<T>, capacity: usize) -> Arc<T> {
        let hit = self.get(&key);
        if let Some(hit) = hit {
            return hit; // a racing compile of the same configuration stored first
        }
        while self.map.len() >= capacity {
            let Some(oldest) = self.map.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k) else {
                break;
            };
            self.map.remove(&oldest);
        }
        self.map.insert(key, (Arc::clone(&fresh), self.clock));
        fresh
    }

    /// Configurations held.
    pub(super) fn len(&mut self) -> usize {
        self.sync_generation();
        self.map.len()
    }
}

/// A process-wide cache of compiled programs, one per configuration, keeping at most
/// [`cache_capacity`] of them (least recently used dropped first).
pub(super) type ConfigCache<T> = OnceLock<Mutex<Entries<T>>>;

/// The entry of `config` in `cache`, compiled by `compile` on first use; `true` with a
/// program this call compiled.
pub(super) fn cached<T>(
    cache: &ConfigCache<T>,
    config: &SdpaConfig,
    compile: impl FnOnce(&SdpaConfig) -> Result<T, SdpaError>,
) -> Result<(Arc<T>, bool), SdpaError> {
    let cache = cache.get_or_init(|| Mutex::new(Entries::new()));
    let key = Key(*config);
    if let Some(hit) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok((hit, false));
    }
    // Compile outside the lock, so other configurations are not held up; a racing compile of
    // the same configuration is harmless, the first one stored wins.
    let fresh = Arc::new(compile(config)?);
    let mut entries = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok((entries.insert(key, fresh, cache_capacity()), true))
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

/// How many forward configurations the cache of [`compiled`] holds now.
pub fn cached_count() -> usize {
    CACHE.get().map_or(0, |c| c.lock().unwrap_or_else(|e| e.into_inner()).len())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n_k: usize) -> Key {
        Key(SdpaConfig::new(1, 1, 1, n_k, 8))
    }

    #[test]
    fn the_least_recently_used_configuration_goes_first() {
        static NEVER_CLEARED: AtomicUsize = AtomicUsize::new(0);
        let mut e: Entries<usize> = Entries::with_generations(&NEVER_CLEARED);
        for n in 1..=3 {
            e.insert(key(n), Arc::new(n), 3);
        }
        assert_eq!(e.get(&key(1)).as_deref(), Some(&1)); // 1 is now the most recent
        e.insert(key(4), Arc::new(4), 3);
        assert_eq!(e.len(), 3);
        assert!(e.get(&key(2)).is_none(), "2 was the least recently used");
        assert!(e.get(&key(1)).is_some() && e.get(&key(3)).is_some() && e.get(&key(4)).is_some());
        // A decode loop of growing lengths stays within the bound.
        for n in 5..400 {
            e.insert(key(n), Arc::new(n), 3);
        }
        assert_eq!(e.len(), 3);
        // A racing second compile of a held configuration returns the stored program.
        assert_eq!(*e.insert(key(399), Arc::new(0), 3), 399);
    }

    #[test]
    fn clearing_empties_every_cache_on_its_next_use() {
        let mut e: Entries<usize> = Entries::new();
        e.insert(key(7), Arc::new(7), 8);
        clear_caches();
        assert_eq!(e.len(), 0);
        assert!(e.get(&key(7)).is_none());
    }
}
