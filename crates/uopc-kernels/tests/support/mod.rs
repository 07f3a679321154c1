//! What the attention test files share: a seeded generator and the 16-bit types under test.
#![allow(dead_code)] // each test crate uses its own part

use half::{bf16, f16};
use uopc_kernels::sdpa::SdpaElement;

/// A small seeded generator (xorshift), so the cases are reproducible without dependencies.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// `len` values in [-1, 1].
    pub fn values(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| (self.next() % 20001) as f32 / 10000.0 - 1.0).collect()
    }
}

/// The 16-bit types under test, with what the tests need of each.
pub trait Half: SdpaElement + std::fmt::Debug + PartialEq {
    /// Unit roundoff of rounding to nearest: 2^-8 for bf16, 2^-11 for f16.
    const UNIT_ROUNDOFF: f64;
    const NAN: Self;
    fn from(x: f32) -> Self;
    fn to(self) -> f32;
}

impl Half for bf16 {
    const UNIT_ROUNDOFF: f64 = 1.0 / 256.0;
    const NAN: Self = bf16::NAN;
    fn from(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to(self) -> f32 {
        self.to_f32()
    }
}

impl Half for f16 {
    const UNIT_ROUNDOFF: f64 = 1.0 / 2048.0;
    const NAN: Self = f16::NAN;
    fn from(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to(self) -> f32 {
        self.to_f32()
    }
}
