//! What the attention test files share: a seeded generator, the 16-bit types under test and
//! the mods two flex test files both run (ALiBi, a relative-position table in documents).
#![allow(dead_code)] // each test crate uses its own part

use half::{bf16, f16};
use uopc_ir::DType;
use uopc_kernels::sdpa::{AttentionMods, SdpaElement, eq};

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

/// ALiBi, `s + slope[h] * (kv - q)` with the slopes captured (F32, `[heads]`), under a mask
/// function that is exactly the causal mask for `causal_offset` (`n_k - n_q`).
pub fn alibi_causal(heads: usize, causal_offset: i64) -> AttentionMods {
    let mut mods = AttentionMods::new();
    let slopes = mods.capture("slopes", &[heads], DType::F32);
    mods.score(move |x, s| s + x.load(slopes, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32))
        .mask(move |x| x.kv.lt(&x.q + (causal_offset + 1)))
}

/// A relative-position bias table `[heads, 2n - 1]` on the scores (captured first, F32) inside
/// documents of per-token ids `[batch, n]` (captured second, I32): the mods of the flex tests
/// whose mask has no exact key bounds.
pub fn relative_table_in_documents(heads: usize, batch: usize, n: usize) -> AttentionMods {
    let mut mods = AttentionMods::new();
    let table = mods.capture("rel_bias", &[heads, 2 * n - 1], DType::F32);
    let docs = mods.capture("doc_ids", &[batch, n], DType::I32);
    mods.score(move |x, s| s + x.load(table, &[x.h.clone(), &x.kv - &x.q + (n as i64 - 1)])).mask(move |x| {
        eq(&x.load(docs, &[x.b.clone(), x.q.clone()]), &x.load(docs, &[x.b.clone(), x.kv.clone()]))
    })
}

/// Per-token document ids of each item's documents, of the lengths given, numbered from 0
/// in each item.
pub fn document_ids(items: &[&[usize]]) -> Vec<i32> {
    items
        .iter()
        .flat_map(|docs| docs.iter().enumerate().flat_map(|(id, &len)| std::iter::repeat_n(id as i32, len)))
        .collect()
}
