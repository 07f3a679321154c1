//! f16 x f16 -> f32 GEMM: `C (+)= A · B` with f16 operands and an f32 result, on the f32
//! micro-kernels.
//!
//! The operands are widened to f32 one k slab at a time, B also one block of columns at a time
//! (`vcvtph2ps` on AVX-512, the `half` crate's conversion elsewhere), and each block runs
//! through [`crate::gemm_unchecked`], the first slab overwriting C (unless the shape
//! accumulates) and the rest adding to it. Widening is exact and every f16
//! product is exact in f32, so the result is the f32 GEMM of the exact inputs; the widening
//! touches each input once per call (`m k + k n` elements against the `2 m n k` flops of the
//! product), which is why this path runs at the speed of the f32 kernels.
//!
//! The alternative, narrowing f16 to bf16 for `vdpbf16ps`, would drop 3 of f16's 11
//! significant bits from every input (and overflow nothing, but round everything), so results
//! would no longer match an f32 computation on the same f16 data.

use std::cell::RefCell;

use half::f16;

use crate::error::check_len;
use crate::{GemmDesc, GemmShape, Isa, TileError};

/// k values widened per slab: the f32 driver's own k slab, so each slab is one pass of it.
const KC: usize = 256;
/// Columns of B widened per block: a `KC x NC` f32 block (512 KiB) stays in L2 while the f32
/// driver packs it, where widening all of a wide B first would write it out to memory and
/// read it back.
const NC: usize = 512;

thread_local! {
    /// The widened A and B slabs; separate from the f32 driver's packing buffer, which the
    /// slab GEMMs use while these are borrowed.
    static WIDE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `C (+)= A · B` with f16 A and B and f32 C, every operand checked against `s` first.
///
/// `s` means what it means for the f32 [`crate::gemm`] (element counts, either operand
/// transposed, `accumulate`). Inputs are widened to f32 exactly and multiplied with the f32
/// kernels of `isa`, so the result equals [`crate::gemm`] on the widened inputs up to the
/// order of the f32 sums (subnormal f16 inputs included).
///
/// # Errors
///
/// Nothing is read or written when one is returned: [`TileError::IsaUnavailable`] if `isa`
/// cannot run here; the errors of [`GemmShape::extents`];
/// [`TileError::BufferTooSmall`] if a slice is shorter than its extent.
///
/// # Examples
///
/// ```rust
/// use half::f16;
/// use uopc_tile::{GemmShape, Isa, TileError, gemm_f16};
///
/// let h = |x: f32| f16::from_f32(x);
/// let a = [h(1.0), h(2.0), h(3.0), h(4.0)]; // [[1, 2], [3, 4]]
/// let b = [h(1.0), h(0.5), h(0.0), h(1.0)]; // [[1, 0.5], [0, 1]]
/// let mut c = [f32::NAN; 4]; // not read: the shape overwrites C
/// gemm_f16(Isa::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// assert_eq!(c, [1.0, 2.5, 3.0, 5.5]);
///
/// let short = gemm_f16(Isa::Portable, &GemmShape::dense(2, 2, 2, false, false, false), &a, &b[..3], &mut c);
/// assert_eq!(short, Err(TileError::BufferTooSmall { operand: "b", needed: 4, len: 3 }));
/// # Ok::<(), TileError>(())
/// ```
pub fn gemm_f16(isa: Isa, s: &GemmShape, a: &[f16], b: &[f16], c: &mut [f32]) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    let [na, nb, nc] = s.extents()?;
    check_len("a", na, a.len())?;
    check_len("b", nb, b.len())?;
    check_len("c", nc, c.len())?;
    // SAFETY: the ISA is available, each slice covers its operand's extent, and `c` is a unique
    // borrow, so it cannot overlap `a` or `b`.
    unsafe { gemm_f16_unchecked(isa, s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
    Ok(())
}

/// `C (+)= A · B` on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * With `[na, nb, nc] = s.extents()` (which must be `Ok`): `a` is valid for reads of `na`
///   f16, `b` for reads of `nb`, and `c` for reads and writes of `nc` f32 (only writes when
///   `!s.accumulate`); all aligned for their types (null is fine for an extent of 0).
/// * The C region does not overlap A or B, and nothing else accesses it during the call.
pub unsafe fn gemm_f16_unchecked(isa: Isa, s: &GemmShape, a: *const f16, b: *const f16, c: *mut f32) {
    let GemmShape { m, n, k, a_trans, b_trans, lda, ldb, .. } = *s;
    if m == 0 || n == 0 || k == 0 {
        // No input is read; the f32 GEMM zeroes C (or leaves it) exactly as this would.
        // SAFETY: the extents of A and B are not touched for these shapes; C's is the caller's.
        unsafe { crate::gemm_unchecked(isa, s, std::ptr::null(), std::ptr::null(), c) };
        return;
    }
    // A few rows of A cannot amortize widening B into a buffer: stream it, widening in
    // registers (the same exact f32 products).
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && m <= crate::x86::half_rows::HALF_ROWS_MAX && !a_trans {
        // SAFETY: AVX-512F is available (the ISA); the shape is in the kernel's range and the
        // pointers are this function's contract (f16 is a transparent u16).
        unsafe { crate::x86::half_rows::gemm::<true>(s, a.cast(), b.cast(), c) };
        return;
    }
    let kc_max = KC.min(k);
    let (a_len, b_len) = (m * kc_max, kc_max * NC.min(n));
    let run = |wide: &mut [f32]| {
        let (wa, wb) = wide.split_at_mut(a_len);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            // The slab's A is `m x kc` (rows of A from column p0), or `kc x m` when transposed,
            // widened densely in its orientation, once for all column blocks.
            // SAFETY: every row read lies inside A's extent (rows `< m`, columns `p0 .. p0 +
            // kc <= k`, or the transposed rows `p0 .. p0 + kc`, columns `< m`).
            unsafe {
                if a_trans {
                    for p in 0..kc {
                        widen(a.add((p0 + p) * lda), &mut wa[p * m..(p + 1) * m]);
                    }
                } else {
                    for i in 0..m {
                        widen(a.add(i * lda + p0), &mut wa[i * kc..(i + 1) * kc]);
                    }
                }
            }
            for j0 in (0..n).step_by(NC) {
                let nc = NC.min(n - j0);
                // B's block is `kc x nc`, or `nc x kc` when transposed.
                // SAFETY: rows `p0 .. p0 + kc`, columns `j0 .. j0 + nc` of B (or the
                // transposed rows `j0 .. j0 + nc`, columns `p0 .. p0 + kc`) lie in its extent.
                unsafe {
                    if b_trans {
                        for j in 0..nc {
                            widen(b.add((j0 + j) * ldb + p0), &mut wb[j * kc..(j + 1) * kc]);
                        }
                    } else {
                        for p in 0..kc {
                            widen(b.add((p0 + p) * ldb + j0), &mut wb[p * nc..(p + 1) * nc]);
                        }
                    }
                }
                let block = GemmShape {
                    n: nc,
                    k: kc,
                    lda: if a_trans { m } else { kc },
                    ldb: if b_trans { kc } else { nc },
                    accumulate: s.accumulate || p0 > 0,
                    ..*s
                };
                // SAFETY: the widened slabs are dense `block` operands (extents `m kc` and
                // `kc nc`, inside `wa` and `wb`); C's columns `j0 .. j0 + nc` are the caller's,
                // disjoint from this thread's buffer.
                unsafe { crate::gemm_unchecked(isa, &block, wa.as_ptr(), wb.as_ptr(), c.add(j0)) };
            }
        }
    };
    let total = a_len + b_len;
    let borrowed = WIDE.try_with(|cell| {
        cell.try_borrow_mut().ok().map(|mut buf| {
            if buf.len() < total {
                buf.resize(total, 0.0);
            }
            run(&mut buf[..total]);
        })
    });
    if !matches!(borrowed, Ok(Some(()))) {
        // Thread teardown or a re-entrant call: a buffer of its own.
        run(&mut vec![0.0; total]);
    }
}

/// Widens `dst.len()` f16 values from `src` into `dst`.
///
/// # Safety
///
/// `src` is valid for reads of `dst.len()` f16.
unsafe fn widen(src: *const f16, dst: &mut [f32]) {
    // SAFETY: the caller's contract.
    let src = unsafe { std::slice::from_raw_parts(src, dst.len()) };
    crate::convert::f16_to_f32_slice(src, dst).expect("equal lengths");
}

/// Flat C-ABI f16 GEMM for JIT-compiled code: `C (+)= A · B` on the fastest ISA here.
///
/// Arguments, in order: `a`, `b` (pointers to f16 bit patterns), `c` (pointer to f32), then
/// the `i64`s `m`, `n`, `k`, `lda`, `ldb`, `ldc`, `flags`, as for [`crate::uopc_tile_gemm_f32`].
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, `flags` has
/// unknown bits, a leading dimension is too small, an extent overflows, or a pointer is null
/// while its operand is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_f16_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_f16(
    a: *const f16,
    b: *const f16,
    c: *mut f32,
    m: i64,
    n: i64,
    k: i64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    flags: i64,
) -> i32 {
    let desc = GemmDesc { m, n, k, lda, ldb, ldc, flags };
    // SAFETY: `desc` is a valid descriptor; the pointer contract is forwarded from our caller.
    unsafe { uopc_tile_gemm_f16_desc(&desc, a, b, c) }
}

/// Descriptor-based C-ABI f16 GEMM: `(desc, a, b, c) -> i32`, otherwise like
/// [`uopc_tile_gemm_f16`]. Returns -1 also when `desc` is null.
///
/// # Safety
///
/// `desc` is null or points to a readable [`GemmDesc`]; the pointers must satisfy the contract
/// of [`gemm_f16_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_gemm_f16_desc(
    desc: *const GemmDesc,
    a: *const f16,
    b: *const f16,
    c: *mut f32,
) -> i32 {
    // SAFETY: forwarded from our caller.
    let Some(s) = (unsafe { crate::gemm::decode_desc(desc, [a.is_null(), b.is_null(), c.is_null()]) }) else {
        return -1;
    };
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { gemm_f16_unchecked(Isa::detect(), &s, a, b, c) };
    0
}
