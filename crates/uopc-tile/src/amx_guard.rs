//! The guard in front of the AMX bf16 path: before a process first runs it, a small GEMM on
//! AMX must equal the same GEMM on the path the model would otherwise take.
//!
//! The inputs are small integers, exact in bf16, and every sum of products is an integer below
//! 2^24, so every correct path gives the same f32 result bit for bit, whatever its order of
//! summation. The shapes cover a ragged row block and k block, A read in place and transposed,
//! and accumulation into C.

use std::sync::OnceLock;

use half::bf16;

use crate::{Bf16Path, GemmShape, gemm_bf16};

/// The known-answer GEMM's result on `path`: `C = A · B`, then `C += A^T-stored · B`, for a
/// 37 x 45 C and k = 70. `None` when `path` is not available or a call fails.
fn known_answer(path: Bf16Path) -> Option<Vec<f32>> {
    let (m, n, k) = (37usize, 45usize, 70usize);
    let value = |i: usize, j: usize, salt: usize| bf16::from_f32(((i * 7 + j * 3 + salt) % 9) as f32 - 4.0);
    let a: Vec<bf16> = (0..m * k).map(|x| value(x / k, x % k, 1)).collect();
    let at: Vec<bf16> = (0..k * m).map(|x| value(x / m, x % m, 2)).collect();
    let b: Vec<bf16> = (0..k * n).map(|x| value(x / n, x % n, 5)).collect();
    let mut c = vec![0f32; m * n];
    gemm_bf16(path, &GemmShape::dense(m, n, k, false, false, false), &a, &b, &mut c).ok()?;
    gemm_bf16(path, &GemmShape::dense(m, n, k, true, false, true), &at, &b, &mut c).ok()?;
    Some(c)
}

/// Compares AMX with `reference` on the known-answer GEMM: `Ok` when they agree bit for bit,
/// else a description of the first difference (or of why AMX could not run).
pub fn amx_known_answer_check(reference: Bf16Path) -> Result<(), String> {
    if !Bf16Path::Amx.available() {
        return Err(String::from("AMX is not usable in this process"));
    }
    let want =
        known_answer(reference).ok_or_else(|| format!("the reference path {reference} could not run"))?;
    let got = known_answer(Bf16Path::Amx).ok_or_else(|| String::from("the AMX GEMM returned an error"))?;
    match want.iter().zip(&got).position(|(w, g)| w.to_bits() != g.to_bits()) {
        None => Ok(()),
        Some(i) => Err(format!(
            "element {i} (row {}, column {}) is {} on AMX and {} on {reference}",
            i / 45,
            i % 45,
            got[i],
            want[i]
        )),
    }
}

/// AMX if it passes [`amx_known_answer_check`] against the path the model would take without
/// it, else that path, said once on stderr. Run once per process.
pub(crate) fn checked_amx_or_fallback() -> Bf16Path {
    static CHECKED: OnceLock<Bf16Path> = OnceLock::new();
    *CHECKED.get_or_init(|| {
        let fallback = Bf16Path::without_amx();
        match amx_known_answer_check(fallback) {
            Ok(()) => Bf16Path::Amx,
            Err(why) => {
                eprintln!(
                    "uopc: the AMX bf16 path failed its known-answer check ({why}); using {fallback} instead"
                );
                fallback
            }
        }
    })
}
