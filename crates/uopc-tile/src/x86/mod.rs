//! x86-64 kernels (AVX-512, AVX2+FMA, AMX and AVX512_BF16) and the f32 kernels' shared packing
//! routine.

use std::arch::x86_64::*;

pub(crate) mod activation;
pub(crate) mod amx;
pub(crate) mod avx2;
pub(crate) mod avx2_few_rows;
pub(crate) mod avx2_half_rows;
pub(crate) mod avx512;
pub(crate) mod avx512_few_rows;
pub(crate) mod bf16;
pub(crate) mod bf16_tiles;
pub(crate) mod convert_avx2;
mod exp2;
pub(crate) mod half_pack;
pub(crate) mod half_rows;
mod key_dots;
mod register_tile;
pub(crate) mod row_sweep;
pub(crate) mod score_ramp;
pub(crate) mod softcap;
mod value_strips;

/// Where a vector rounded softmax step (`avx512::softmax_update_rounded`,
/// `avx2::softmax_update_rounded`) writes its probabilities, each rounded to f16 or bf16.
#[derive(Clone, Copy)]
pub(crate) enum RoundedTile {
    /// A 16-bit tile of the rounded values' bit patterns.
    Bits(*mut u16),
    /// An f32 tile of the rounded values (exact in f32); it may be the score tile itself
    /// (same address, `ldp == lds`), since each score is read before its probability is
    /// written over it.
    Wide(*mut f32),
}

/// Rows of B that the few-rows GEMM kernels (dot products and streamed rows) request ahead of
/// the one they multiply, at most (see [`rows_ahead`]).
pub(crate) const STREAM_AHEAD: usize = 16;

/// Bytes of B a streaming kernel requests ahead of its loads: enough to cover the memory's
/// latency at a core's streaming rate (about 100 ns at 30 GB/s), a small part of L1. Requests
/// much further ahead evict from L1 the lines about to be read (16 rows of a weight matrix's
/// 2 KiB rows are 32 KiB, all of L1) and hold miss buffers the hardware prefetcher needs.
const PREFETCH_BYTES: usize = 4096;

/// How many rows of `row_bytes` each a streaming kernel requests ahead: [`PREFETCH_BYTES`]
/// worth, at least the next row, at most [`STREAM_AHEAD`].
#[inline]
pub(crate) fn rows_ahead(row_bytes: usize) -> usize {
    (PREFETCH_BYTES / row_bytes.max(1)).clamp(1, STREAM_AHEAD)
}

/// Rows of A a micro-kernel reaches from one [`opaque`] base pointer: row `k` of a group is
/// `k` row strides past its base, an addressing mode (`base + stride * 1, 2, 4`, with one
/// register holding `3 stride`).
pub(crate) const ROWS_PER_BASE: usize = 5;

/// Base pointers a micro-kernel keeps at most: 20 rows, past every register tile's (12 rows;
/// a bf16 group of 10 rows across row 16 needs 3).
pub(crate) const MAX_BASES: usize = 4;

/// An empty `asm!` that the compiler must assume reads and writes memory: no load moves across
/// it, and LLVM's instruction scheduler does not move instructions across it, so the code on
/// either side is scheduled (and its registers allocated) as separate regions.
#[inline(always)]
pub(crate) fn step_boundary() {
    // SAFETY: an empty instruction string: nothing is touched.
    unsafe { std::arch::asm!("", options(nostack, preserves_flags)) };
}

/// `p` unchanged, passed through a register by an empty `asm!` so the optimizer cannot see
/// how it was computed: the micro-kernels keep one base pointer per group of A's rows this
/// way, where LLVM would otherwise fold the bases into one pointer and recompute every row's
/// address in every k step.
#[inline(always)]
pub(crate) fn opaque<T>(p: *const T) -> *const T {
    let mut x = p;
    #[allow(
        clippy::pointers_in_nomem_asm_block,
        reason = "the empty instruction string reads and writes no memory; the pointer only passes through a register"
    )]
    // SAFETY: an empty instruction string: no memory is touched and the value is unchanged.
    unsafe {
        std::arch::asm!("/* {0} */", inout(reg) x, options(pure, nomem, nostack, preserves_flags));
    }
    x
}

/// Requests the cache lines of `len` floats from `row` into L1. A prefetch never faults, so
/// `row` may lie past the operand (it is only formed with `wrapping_add`).
#[inline]
pub(crate) fn prefetch_row(row: *const f32, len: usize) {
    prefetch_lines::<_MM_HINT_T0>(row, len);
}

/// Requests the cache lines of `len` floats from `row` into L2, for the few-rows kernels that
/// stream B from memory: a request into L1 holds one of its few fill buffers until the line
/// arrives, and a row's worth of them (32 lines for a 2 KiB row) leaves none to the loads of
/// the row being multiplied, which the hardware then brings from L2 in time. As
/// [`prefetch_row`], `row` may lie past the operand.
#[inline]
pub(crate) fn stream_row(row: *const f32, len: usize) {
    prefetch_lines::<_MM_HINT_T1>(row, len);
}

/// One prefetch with hint `HINT` per cache line of the `len` floats from `row`.
#[inline]
fn prefetch_lines<const HINT: i32>(row: *const f32, len: usize) {
    for off in (0..len).step_by(16) {
        // SAFETY: SSE is part of x86-64, and a prefetch reads nothing architecturally.
        unsafe { _mm_prefetch::<HINT>(row.wrapping_add(off).cast::<i8>()) };
    }
}

/// Packs `B^T` into a panel of width `NR`: `dst[p * NR + j] = src[j * ldb + p]` for `p < kc`,
/// `j < nr`, zero for `nr <= j < NR` (8 x 8 blocks through [`transpose8x8_f32`], a last group
/// of four rows in 4 x 4 blocks, ragged edges one float at a time).
///
/// # Safety
///
/// AVX is available, `nr <= NR`, `dst` is writable for `kc * NR` floats and `src` readable at
/// `j * ldb + p` for every `j < nr`, `p < kc`.
#[target_feature(enable = "avx")]
pub(crate) unsafe fn pack_bt<const NR: usize>(
    dst: *mut f32,
    src: *const f32,
    ldb: usize,
    kc: usize,
    nr: usize,
) {
    // SAFETY: forwarded, with AVX enabled for the f32 loads.
    unsafe { half_pack::pack_bt::<f32, NR>(dst, src, ldb, kc, nr) }
}

/// Copies a B panel stored `k x n` into width-`NR` rows: `dst[p * NR + j] = src[p * ldb + j]`
/// for `p < kc`, `j < nr`, zero for `nr <= j < NR`.
///
/// Packing even untransposed B pays off: the panel becomes contiguous, so it neither maps onto
/// a fraction of L1's sets (a power-of-two `ldb` does that) nor needs one prefetch stream per row.
///
/// # Safety
///
/// AVX is available, `nr <= NR`, `NR` is a multiple of 8, `dst` is writable for `kc * NR`
/// floats and `src` readable at `p * ldb + j` for every `p < kc`, `j < nr`.
#[target_feature(enable = "avx")]
pub(crate) unsafe fn pack_b<const NR: usize>(
    dst: *mut f32,
    src: *const f32,
    ldb: usize,
    kc: usize,
    nr: usize,
) {
    // SAFETY: forwarded, with AVX enabled for the f32 loads.
    unsafe { half_pack::pack_b::<f32, NR>(dst, src, ldb, kc, nr) }
}

/// Stores the 4 x 4 block whose rows are `r` transposed at `dst` (row stride `ldd`).
///
/// # Safety
///
/// AVX is available; `dst` writable as 4 rows of 4 floats.
#[target_feature(enable = "avx")]
#[inline]
pub(super) unsafe fn transpose4x4_rows(r: [__m128; 4], dst: *mut f32, ldd: usize) {
    // SAFETY: the stores write rows `0..4`, columns `0..4` of `dst`.
    unsafe {
        // (r0[0] r1[0] r0[1] r1[1]), (r0[2] r1[2] r0[3] r1[3]), and the same of rows 2 and 3.
        let (a, b) = (_mm_unpacklo_ps(r[0], r[1]), _mm_unpackhi_ps(r[0], r[1]));
        let (c, d) = (_mm_unpacklo_ps(r[2], r[3]), _mm_unpackhi_ps(r[2], r[3]));
        _mm_storeu_ps(dst, _mm_movelh_ps(a, c));
        _mm_storeu_ps(dst.add(ldd), _mm_movehl_ps(c, a));
        _mm_storeu_ps(dst.add(2 * ldd), _mm_movelh_ps(b, d));
        _mm_storeu_ps(dst.add(3 * ldd), _mm_movehl_ps(d, b));
    }
}

/// Transposes the 8 x 8 block at `src` (row stride `lds`) into `dst` (row stride `ldd`).
///
/// The 128-bit lane exchange is folded into the loads (`vinsertf128` from memory), leaving two
/// in-lane shuffle stages that can issue on more than one port, which is why this uses 256-bit
/// vectors even on AVX-512 machines.
///
/// # Safety
///
/// AVX is available; `src` readable and `dst` writable as 8 rows of 8 floats.
#[target_feature(enable = "avx")]
#[inline]
pub(super) unsafe fn transpose8x8_f32(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    // SAFETY: all loads read rows `0..8`, columns `0..8` of `src`; stores write the same of `dst`.
    unsafe {
        let row = |r: usize, half: usize| _mm_loadu_ps(src.add(r * lds + 4 * half));
        // t[r + 4 * h] holds row r (low lane) and row r + 4 (high lane), columns 4h .. 4h + 4.
        let mut t = [_mm256_setzero_ps(); 8];
        for h in 0..2 {
            for r in 0..4 {
                t[r + 4 * h] = _mm256_insertf128_ps::<1>(_mm256_castps128_ps256(row(r, h)), row(r + 4, h));
            }
        }
        for h in 0..2 {
            let (t0, t1, t2, t3) = (t[4 * h], t[4 * h + 1], t[4 * h + 2], t[4 * h + 3]);
            let u0 = _mm256_unpacklo_ps(t0, t1);
            let u1 = _mm256_unpackhi_ps(t0, t1);
            let u2 = _mm256_unpacklo_ps(t2, t3);
            let u3 = _mm256_unpackhi_ps(t2, t3);
            // Output row c holds column c of the source: rows 0..4 in the low lane, 4..8 high.
            let c0 = 4 * h;
            _mm256_storeu_ps(dst.add(c0 * ldd), _mm256_shuffle_ps::<0x44>(u0, u2));
            _mm256_storeu_ps(dst.add((c0 + 1) * ldd), _mm256_shuffle_ps::<0xEE>(u0, u2));
            _mm256_storeu_ps(dst.add((c0 + 2) * ldd), _mm256_shuffle_ps::<0x44>(u1, u3));
            _mm256_storeu_ps(dst.add((c0 + 3) * ldd), _mm256_shuffle_ps::<0xEE>(u1, u3));
        }
    }
}

/// 16 consecutive 16-bit values at `p` (bf16 bits, or f16 when `F16`) as f32; only the first
/// `n <= 16` are read, the other lanes are 0.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and `p` is valid for reads of `n` u16s.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
pub(crate) unsafe fn widen16<const F16: bool>(p: *const u16, n: usize) -> __m512 {
    let h = if n >= 16 {
        // SAFETY: 16 u16s (32 bytes) are readable at `p`.
        unsafe { _mm256_loadu_si256(p.cast()) }
    } else {
        // A masked 16-bit load needs AVX-512BW, which this ISA level does not require.
        let mut buf = [0u16; 16];
        // SAFETY: `n < 16` u16s are readable at `p`; `buf` holds 16.
        unsafe {
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            _mm256_loadu_si256(buf.as_ptr().cast())
        }
    };
    if F16 {
        _mm512_cvtph_ps(h)
    } else {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

/// 8 consecutive 16-bit values at `p` (bf16 bits, or f16 when `F16`) as f32; only the first
/// `n <= 8` are read, the other lanes are 0.
///
/// # Safety
///
/// AVX2 and FMA (and F16C when `F16`) are available and `p` is valid for reads of `n` u16s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn widen8<const F16: bool>(p: *const u16, n: usize) -> __m256 {
    let h = if n >= 8 {
        // SAFETY: 8 u16s (16 bytes) are readable at `p`.
        unsafe { _mm_loadu_si128(p.cast()) }
    } else {
        let mut buf = [0u16; 8];
        // SAFETY: `n < 8` u16s are readable at `p`; `buf` holds 8.
        unsafe {
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            _mm_loadu_si128(buf.as_ptr().cast())
        }
    };
    if F16 {
        _mm256_cvtph_ps(h)
    } else {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
}
