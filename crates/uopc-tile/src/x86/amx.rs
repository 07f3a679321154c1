//! AMX tiles from stable Rust: detection, the Linux permission request, the tile configuration
//! and the bf16 micro-kernel, all written with `asm!` because the AMX intrinsics and target
//! features are not stable (the assembler accepts the mnemonics regardless).
//!
//! Every function here that executes a tile instruction requires [`usable`] to have returned
//! true in this process: without the permission the first tile instruction raises SIGILL.

use std::arch::asm;
use std::arch::x86_64::{__cpuid_count, _xgetbv};
use std::sync::OnceLock;

use super::bf16_tiles::{ATiles, BLoads};

/// CPUID.(EAX=7, ECX=0):EDX bit 22: `tdpbf16ps`.
const CPUID7_EDX_AMX_BF16: u32 = 1 << 22;
/// CPUID.(EAX=7, ECX=0):EDX bit 24: the tile registers and their loads and stores.
const CPUID7_EDX_AMX_TILE: u32 = 1 << 24;
/// CPUID.1:ECX bit 27: the OS enabled `xgetbv` (without it reading XCR0 faults).
const CPUID1_ECX_OSXSAVE: u32 = 1 << 27;
/// XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves tile state on context switches.
const XCR0_TILE_STATE: u64 = (1 << 17) | (1 << 18);

/// `arch_prctl` request asking the kernel to let this process use an extended state component.
#[cfg(target_os = "linux")]
const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
/// The extended state component of the tile data (XCR0 bit 18).
#[cfg(target_os = "linux")]
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// Whether the CPU has AMX-TILE and AMX-BF16 and the OS has enabled their state in XCR0.
fn cpu_and_os_support() -> bool {
    // Leaf 0 reports the highest leaf.
    let max_leaf = __cpuid_count(0, 0).eax;
    if max_leaf < 7 {
        return false;
    }
    let (leaf1, leaf7) = (__cpuid_count(1, 0), __cpuid_count(7, 0));
    let amx = CPUID7_EDX_AMX_TILE | CPUID7_EDX_AMX_BF16;
    if leaf7.edx & amx != amx || leaf1.ecx & CPUID1_ECX_OSXSAVE == 0 {
        return false;
    }
    // SAFETY: OSXSAVE is set, so `xgetbv` is enabled; register 0 is XCR0.
    let xcr0 = unsafe { xgetbv0() };
    xcr0 & XCR0_TILE_STATE == XCR0_TILE_STATE
}

/// Reads XCR0.
///
/// # Safety
///
/// CPUID reports OSXSAVE.
#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    // SAFETY: the caller guarantees `xgetbv` is enabled.
    unsafe { _xgetbv(0) }
}

/// Asks Linux for the tile data state; without this grant every tile instruction faults.
#[cfg(target_os = "linux")]
fn request_permission() -> bool {
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, n)` only changes this process's permitted
    // extended state; it reads and writes no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
    r == 0
}

/// Other systems have no known way to grant tile state, so AMX counts as unavailable there.
#[cfg(not(target_os = "linux"))]
fn request_permission() -> bool {
    false
}

/// Whether this process may execute AMX bf16 instructions: the CPU and OS support them and the
/// permission request succeeded. The request is made once per process (threads inherit the
/// grant); a refusal makes AMX unavailable rather than an error.
pub(crate) fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| cpu_and_os_support() && request_permission())
}

/// The 64-byte `ldtilecfg` operand: palette 1, every tile used as 16 rows of 64 bytes.
///
/// Tiles 0-3 hold the 32 x 32 f32 output block, 4-5 the two 16-row A tiles, 6-7 the two
/// 16-column B tiles in VNNI pair layout; all eight have the same shape.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    const fn all_16x64() -> TileConfig {
        let mut b = [0u8; 64];
        b[0] = 1; // palette 1
        let mut t = 0;
        while t < 8 {
            // colsb[t]: a little-endian u16 at 16 + 2t; rows[t] at 48 + t.
            b[16 + 2 * t] = 64;
            b[48 + t] = 16;
            t += 1;
        }
        TileConfig(b)
    }
}

static CONFIG: TileConfig = TileConfig::all_16x64();

/// Loads the tile configuration (eight tiles of 16 x 64 bytes) on this thread.
///
/// `ldtilecfg` costs as much as many tile multiplies, so a GEMM calls this once, not per block.
///
/// # Safety
///
/// [`usable`] returned true.
#[inline]
pub(crate) unsafe fn configure() {
    // SAFETY: `CONFIG` is a valid 64-byte aligned palette-1 configuration and the caller
    // guarantees tile state is permitted. The tile registers are zeroed, which no compiled
    // code observes (Rust never allocates them).
    unsafe {
        asm!(
            "ldtilecfg [{cfg}]",
            cfg = in(reg) &CONFIG as *const TileConfig,
            out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
            out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
            options(nostack, readonly, preserves_flags),
        )
    }
}

/// Returns the tile state to its initial (unconfigured) state, so context switches stop saving
/// 8 KiB of tile data for this thread.
///
/// # Safety
///
/// [`usable`] returned true.
#[inline]
pub(crate) unsafe fn release() {
    // SAFETY: `tilerelease` only resets tile state, which the caller may use.
    unsafe {
        asm!(
            "tilerelease",
            out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
            out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
            options(nostack, nomem, preserves_flags),
        )
    }
}

/// The `asm!` of [`block`] with B's tiles loaded by `$load_b`.
macro_rules! block_asm {
    ($load_b:literal, $load:expr, ($c:expr, $c_hi:expr, $cs:expr), ($a:expr, $a_hi:expr, $sa:expr, $astep:expr), $b:expr, $n:expr) => {
        asm!(
            "test {load:e}, {load:e}",
            "jz 2f",
            "tileloadd tmm0, [{c} + {cs}*1]",
            "tileloadd tmm1, [{c} + {cs}*1 + 64]",
            "tileloadd tmm2, [{c_hi} + {cs}*1]",
            "tileloadd tmm3, [{c_hi} + {cs}*1 + 64]",
            "jmp 3f",
            "2:",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "3:",
            "tileloadd tmm4, [{a} + {sa}*1]",
            concat!($load_b, " tmm6, [{b} + {bs}*1]"),
            concat!($load_b, " tmm7, [{b} + {bs}*1 + 1024]"),
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{a_hi} + {sa}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, {astep}",
            "add {a_hi}, {astep}",
            "add {b}, 2048",
            "dec {n}",
            "jnz 3b",
            "tilestored [{c} + {cs}*1], tmm0",
            "tilestored [{c} + {cs}*1 + 64], tmm1",
            "tilestored [{c_hi} + {cs}*1], tmm2",
            "tilestored [{c_hi} + {cs}*1 + 64], tmm3",
            load = in(reg) $load,
            c = in(reg) $c,
            c_hi = in(reg) $c_hi,
            cs = in(reg) $cs,
            a = inout(reg) $a => _,
            a_hi = inout(reg) $a_hi => _,
            sa = in(reg) $sa,
            astep = in(reg) $astep,
            b = inout(reg) $b => _,
            bs = in(reg) 64usize,
            n = inout(reg) $n => _,
            out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
            out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
            options(nostack),
        )
    };
}

/// `C[32 x 32] (+)= A[32 x 32 ksteps] · B` on tiles: two A tiles and two B tiles feed four
/// accumulator tiles per k step of 32.
///
/// Row `r < 16` of A's k step `s` is 64 bytes at byte `a.ptr + s * a.step + r * a.stride`, row
/// `16 + r` that plus `a.hi`.
///
/// `b` is one packed 32-column panel from the first k step: step `s` is 2048 bytes at
/// `b + 1024 s` (u16), columns 0-15 in its first 1024 bytes and 16-31 in the second, each 16
/// rows of 16 VNNI pairs, loaded as `b_loads` says. C is f32 with `ldc` elements between rows;
/// it is read first only when `load_c`.
///
/// # Safety
///
/// [`usable`] returned true and [`configure`] ran on this thread since the last [`release`];
/// `ksteps >= 1`; `a` and `b` are readable as described; C is readable (if `load_c`) and
/// writable as 32 rows of 32 f32 at stride `ldc`.
#[inline]
pub(crate) unsafe fn block(
    a: ATiles,
    (b, b_loads): (*const u16, BLoads),
    ksteps: usize,
    c: *mut f32,
    ldc: usize,
    load_c: bool,
) {
    let (c_stride, load) = (ldc * 4, u32::from(load_c));
    let (a_ptr, a_hi) = (a.ptr, a.ptr.wrapping_byte_add(a.hi));
    let c_hi = c.wrapping_add(16 * ldc);
    // SAFETY: the caller guarantees the memory and the tile configuration; the loop runs
    // `ksteps >= 1` times. Every tile load and store lies within the regions above.
    unsafe {
        match b_loads {
            BLoads::Cached => {
                block_asm!("tileloadd", load, (c, c_hi, c_stride), (a_ptr, a_hi, a.stride, a.step), b, ksteps)
            }
            BLoads::Streamed => block_asm!(
                "tileloaddt1",
                load,
                (c, c_hi, c_stride),
                (a_ptr, a_hi, a.stride, a.step),
                b,
                ksteps
            ),
        }
    }
}

/// `iters` rounds of four independent `tdpbf16ps` chains (tmm0-3 += tmm4/5 x tmm6/7), each
/// 16 x 16 x 32 multiply-adds; returns the flops done. Operands are small constants so the
/// accumulators stay finite.
///
/// # Safety
///
/// [`usable`] returned true.
pub(crate) unsafe fn peak_chains(iters: u64) -> f64 {
    #[repr(C, align(64))]
    struct Operand([u16; 512]);
    // bf16 1/64 in every element: 2^-6 squared, times 32 per step, stays far from overflow.
    let operand = Operand([0x3C80; 512]);
    let mut out = Operand([0; 512]);
    // SAFETY: the caller guarantees tile state is permitted; `configure` precedes the tile
    // instructions, the loads read 16 rows of 64 bytes from `operand` and the store writes as
    // much to `out` (1 KiB each).
    unsafe {
        configure();
        asm!(
            "tileloadd tmm4, [{p} + {s}*1]",
            "tileloadd tmm5, [{p} + {s}*1]",
            "tileloadd tmm6, [{p} + {s}*1]",
            "tileloadd tmm7, [{p} + {s}*1]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "test {n}, {n}",
            "jz 3f",
            "2:",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "dec {n}",
            "jnz 2b",
            "3:",
            "tilestored [{o} + {s}*1], tmm0",
            p = in(reg) operand.0.as_ptr(),
            o = in(reg) out.0.as_mut_ptr(),
            s = in(reg) 64usize,
            n = inout(reg) iters => _,
            out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
            out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
            options(nostack),
        );
        release();
    }
    std::hint::black_box(&out);
    iters as f64 * 4.0 * (16.0 * 16.0 * 32.0 * 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_config_is_palette_1_with_eight_16x64_tiles_and_zero_reserved_bytes() {
        let b = &CONFIG.0;
        assert_eq!(b[0], 1, "palette");
        assert_eq!(b[1], 0, "start_row");
        // Reserved bytes must be zero or `ldtilecfg` faults.
        assert!(b[2..16].iter().all(|&x| x == 0));
        for t in 0..8 {
            assert_eq!(u16::from_le_bytes([b[16 + 2 * t], b[17 + 2 * t]]), 64, "colsb[{t}]");
            assert_eq!(b[48 + t], 16, "rows[{t}]");
        }
        assert!(b[32..48].iter().all(|&x| x == 0), "colsb of tiles 8-15");
        assert!(b[56..64].iter().all(|&x| x == 0), "rows of tiles 8-15");
        assert_eq!(std::mem::align_of::<TileConfig>(), 64);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn cpuid_detection_agrees_with_the_kernels_cpu_flags() {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return };
        let Some(flags) = info.lines().find(|l| l.starts_with("flags")) else { return };
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        let kernel_says = has("amx_tile") && has("amx_bf16");
        let (leaf7, amx) = (__cpuid_count(7, 0), CPUID7_EDX_AMX_TILE | CPUID7_EDX_AMX_BF16);
        assert_eq!(leaf7.edx & amx == amx, kernel_says);
        println!("AMX-TILE and AMX-BF16 per CPUID: {kernel_says}; usable in this process: {}", usable());
    }
}
