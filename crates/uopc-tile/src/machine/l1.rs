//! The L1 data cache's geometry, as the GEMM driver's in-place rules read it.

use std::sync::OnceLock;

use super::{CacheLevel, Machine, cpuid};

/// Sets an L1 data cache has at most: a virtually indexed, physically tagged L1 takes its set
/// index from the page offset, so 4 KiB pages of 64-byte lines allow 64.
pub(crate) const MAX_L1_SETS: usize = 64;

/// Lines, sets and ways of the L1 data cache, in floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct L1Geometry {
    /// Floats per line.
    pub line_floats: usize,
    /// Sets, at most [`MAX_L1_SETS`].
    pub sets: usize,
    /// Ways per set.
    pub ways: usize,
}

impl L1Geometry {
    /// The geometry of `l1`, or `None` when its fields do not describe a cache of whole
    /// lines in at most [`MAX_L1_SETS`] sets (then the caller takes the fallback's).
    pub(crate) fn of(l1: &CacheLevel) -> Option<L1Geometry> {
        let f = std::mem::size_of::<f32>();
        let line = l1.line_bytes;
        if !line.is_power_of_two() || line < f || l1.ways == 0 {
            return None;
        }
        let sets = l1.size_bytes / (line * l1.ways);
        let whole = sets * line * l1.ways == l1.size_bytes;
        (whole && (1..=MAX_L1_SETS).contains(&sets)).then_some(L1Geometry {
            line_floats: line / f,
            sets,
            ways: l1.ways,
        })
    }

    /// The L1 of [`Machine::get`], read once per process; the fallback caches' (32 KiB, 8
    /// ways of 64-byte lines) when the model has none or an odd one.
    pub(crate) fn of_this_machine() -> L1Geometry {
        static GEOMETRY: OnceLock<L1Geometry> = OnceLock::new();
        *GEOMETRY.get_or_init(|| {
            let fallback = cpuid::fallback_caches();
            Machine::get()
                .cache(1)
                .and_then(L1Geometry::of)
                .unwrap_or_else(|| L1Geometry::of(&fallback[0]).expect("the fallback L1 is a valid geometry"))
        })
    }

    /// Floats the cache holds.
    pub(crate) fn floats(&self) -> usize {
        self.line_floats * self.sets * self.ways
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(size_bytes: usize, line_bytes: usize, ways: usize) -> CacheLevel {
        CacheLevel { level: 1, size_bytes, line_bytes, ways, shared_by_threads: 1 }
    }

    #[test]
    fn geometries_of_the_cpus_met() {
        // Zen 3 and Zen 4: 32 KiB, 8 ways; Sapphire and Emerald Rapids, Zen 5: 48 KiB, 12 ways.
        assert_eq!(
            L1Geometry::of(&level(32 << 10, 64, 8)),
            Some(L1Geometry { line_floats: 16, sets: 64, ways: 8 })
        );
        let intel = L1Geometry::of(&level(48 << 10, 64, 12)).unwrap();
        assert_eq!((intel.sets, intel.ways, intel.floats()), (64, 12, 12 << 10));
        assert_eq!(L1Geometry::of(&cpuid::fallback_caches()[0]).unwrap().floats(), 8 << 10);
    }

    #[test]
    fn odd_reports_are_refused() {
        assert_eq!(L1Geometry::of(&level(32 << 10, 0, 8)), None);
        assert_eq!(L1Geometry::of(&level(32 << 10, 48, 8)), None);
        assert_eq!(L1Geometry::of(&level(32 << 10, 64, 0)), None);
        // More sets than a page's offset can index, or a size that is no whole number of sets.
        assert_eq!(L1Geometry::of(&level(64 << 10, 64, 8)), None);
        assert_eq!(L1Geometry::of(&level(33 << 10, 64, 8)), None);
    }
}
