//! A small deterministic random source: SplitMix64 from a seed, or fuzzer bytes.

/// Random decisions for the generators. Seeded runs are reproducible from the seed alone;
/// byte-driven runs take one input byte per decision, so a fuzzer's mutation of one byte changes
/// one decision, and continue with SplitMix64 once the bytes run out.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    data: Vec<u8>,
    pos: usize,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A SplitMix64 stream.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed, data: Vec::new(), pos: 0 }
    }

    /// Decisions read from `data`, then a stream seeded by a hash of it.
    pub fn from_bytes(data: &[u8]) -> Rng {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for &b in data {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        Rng { state: h, data: data.to_vec(), pos: 0 }
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        if let Some(&b) = self.data.get(self.pos) {
            self.pos += 1;
            return mix(b as u64 ^ ((self.pos as u64) << 8));
        }
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// Uniform in `0..n` (0 when `n <= 1`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n <= 1 { 0 } else { self.next_u64() % n }
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    /// True with probability `percent / 100`.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One element of a non-empty slice.
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize].clone()
    }
}

/// `len` deterministic test values uniform in [-1, 1), the same for the same seed.
pub fn uniform_values(len: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| (r.unit() * 2.0 - 1.0) as f32).collect()
}
