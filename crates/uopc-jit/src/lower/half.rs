//! The 16-bit storage floats: BF16 and F16 values live in f32 registers (the exact f32 each
//! widens to), memory holds their 16-bit encodings, and the conversions are inline integer and
//! float ops with the `half` crate's results bit for bit (round to nearest even, NaNs quiet with
//! the sign and top payload bits kept, F16 subnormals and overflow to infinity included).
//!
//! The conversions work on f32 scalars and on F32X4 lanes alike, so the vector lowering uses
//! them too.

use super::*;
use cranelift_codegen::ir::Endianness;

/// Lane order of bit casts between f32 and i32 lanes (x64 is little-endian).
fn lane_order() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

/// Bits of a bf16 or f16 NaN's quiet bit (the top mantissa bit), per type.
const BF16_QUIET: u32 = 0x0040;
const F16_QUIET: u32 = 0x0200;

impl Lowerer<'_, '_> {
    /// An i32 constant shaped like `like` (an I32 or an I32X4).
    fn i32c(&mut self, like: Value, v: u32) -> Value {
        let c = self.b.ins().iconst(types::I32, v as i64);
        if self.b.func.dfg.value_type(like).is_vector() { self.b.ins().splat(types::I32X4, c) } else { c }
    }

    fn and32(&mut self, x: Value, mask: u32) -> Value {
        let m = self.i32c(x, mask);
        self.b.ins().band(x, m)
    }

    fn or32(&mut self, x: Value, bits: u32) -> Value {
        let m = self.i32c(x, bits);
        self.b.ins().bor(x, m)
    }

    fn add32(&mut self, x: Value, v: u32) -> Value {
        let c = self.i32c(x, v);
        self.b.ins().iadd(x, c)
    }

    fn shl32(&mut self, x: Value, by: i64) -> Value {
        let n = self.b.ins().iconst(types::I32, by);
        self.b.ins().ishl(x, n)
    }

    fn shr32(&mut self, x: Value, by: i64) -> Value {
        let n = self.b.ins().iconst(types::I32, by);
        self.b.ins().ushr(x, n)
    }

    /// `x > v` for `x` below 2^31 (every operand here has its sign bit cleared), so a signed
    /// compare, which x64 has for I32X4 lanes too.
    fn gt32(&mut self, x: Value, v: u32) -> Value {
        let c = self.i32c(x, v);
        self.b.ins().icmp(IntCC::SignedGreaterThan, x, c)
    }

    /// `c ? a : b`, lane-wise for vectors (where `c` is a lane mask).
    fn choose(&mut self, c: Value, a: Value, b: Value) -> Value {
        if self.b.func.dfg.value_type(a).is_vector() {
            self.b.ins().bitselect(c, a, b)
        } else {
            self.b.ins().select(c, a, b)
        }
    }

    fn f32_bits(&mut self, x: Value) -> Value {
        let ty = if self.b.func.dfg.value_type(x).is_vector() { types::I32X4 } else { types::I32 };
        self.b.ins().bitcast(ty, lane_order(), x)
    }

    fn bits_f32(&mut self, x: Value) -> Value {
        let ty = if self.b.func.dfg.value_type(x).is_vector() { types::F32X4 } else { types::F32 };
        self.b.ins().bitcast(ty, lane_order(), x)
    }

    /// The encoding (in the low 16 bits of each i32) of the 16-bit `d` nearest to the f32 `x`
    /// (an f32 or the lanes of an F32X4).
    pub(super) fn half_encode(&mut self, d: DType, x: Value) -> Value {
        let bits = self.f32_bits(x);
        if d == DType::BF16 {
            // The kept half plus 0x7FFF rounds up past the midpoint; plus its lowest bit also
            // at the midpoint when that bit is odd, so ties go to even. A NaN skips the carry
            // (which could turn it into an infinity) and gets the quiet bit instead.
            let abs = self.and32(bits, 0x7FFF_FFFF);
            let is_nan = self.gt32(abs, 0x7F80_0000);
            let high = self.shr32(bits, 16);
            let lsb = self.and32(high, 1);
            let up = self.add32(bits, 0x7FFF);
            let rounded = self.b.ins().iadd(up, lsb);
            let rounded = self.shr32(rounded, 16);
            let quiet = self.or32(high, BF16_QUIET);
            return self.choose(is_nan, quiet, rounded);
        }
        let sign = self.and32(bits, 0x8000_0000);
        let abs = self.b.ins().bxor(bits, sign);
        // NaN: quiet, top 10 payload bits kept.
        let is_nan = self.gt32(abs, 0x7F80_0000);
        let payload = self.and32(abs, 0x007F_FFFF);
        let payload = self.shr32(payload, 13);
        let nan = self.or32(payload, 0x7C00 | F16_QUIET);
        // |x| >= 2^16 (infinity included) is past every value that rounds to a finite f16.
        let inf = self.i32c(bits, 0x7C00);
        let too_big = self.gt32(abs, 0x477F_FFFF);
        // |x| < 2^-14, an f16 subnormal or zero: adding 0.5 puts the f16 subnormal step (2^-24)
        // at the f32 ulp of 0.5, so the f32 add itself rounds to nearest even; the low bits
        // left are the f16 encoding.
        let is_normal = self.gt32(abs, 0x387F_FFFF);
        let absf = self.bits_f32(abs);
        let half = self.fconst(self.b.func.dfg.value_type(x), 0.5);
        let shifted = self.b.ins().fadd(absf, half);
        let shifted = self.f32_bits(shifted);
        let sub = self.add32(shifted, 0x3F00_0000u32.wrapping_neg());
        // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest
        // even, the same carry trick as bf16; a carry out of the mantissa bumps the exponent,
        // up to infinity at the top.
        let odd = self.shr32(abs, 13);
        let odd = self.and32(odd, 1);
        let rebias = self.add32(abs, 0x0FFFu32.wrapping_sub(112 << 23));
        let normal = self.b.ins().iadd(rebias, odd);
        let normal = self.shr32(normal, 13);
        let finite = self.choose(is_normal, normal, sub);
        let finite = self.choose(too_big, inf, finite);
        let magnitude = self.choose(is_nan, nan, finite);
        let sign16 = self.shr32(sign, 16);
        self.b.ins().bor(magnitude, sign16)
    }

    /// The f32 a 16-bit `d` encoding (the low 16 bits of each i32 of `bits`, the rest zero)
    /// widens to, exactly; a signaling NaN comes back quiet.
    pub(super) fn half_decode(&mut self, d: DType, bits: Value) -> Value {
        if d == DType::BF16 {
            let abs = self.and32(bits, 0x7FFF);
            let is_nan = self.gt32(abs, 0x7F80);
            let quiet = self.or32(bits, BF16_QUIET);
            let bits = self.choose(is_nan, quiet, bits);
            let wide = self.shl32(bits, 16);
            return self.bits_f32(wide);
        }
        let sign = self.and32(bits, 0x8000);
        let sign = self.shl32(sign, 16);
        let abs = self.and32(bits, 0x7FFF);
        // Finite: the 15 bits moved to the top of an f32's exponent and mantissa read as an
        // f32 2^112 times too small (a subnormal f16 as a subnormal f32), so one exact
        // multiplication rescales normal and subnormal alike.
        let moved = self.shl32(abs, 13);
        let movedf = self.bits_f32(moved);
        let scale = self.fconst(self.b.func.dfg.value_type(movedf), f32::from_bits(0x7780_0000));
        let finite = self.b.ins().fmul(movedf, scale);
        let finite = self.f32_bits(finite);
        // Infinity and NaN: all-ones exponent, the mantissa kept, NaNs quieted.
        let mantissa = self.and32(moved, 0x007F_E000);
        let special = self.or32(mantissa, 0x7F80_0000);
        let is_nan = self.gt32(abs, 0x7C00);
        let quiet = self.or32(special, 0x0040_0000);
        let special = self.choose(is_nan, quiet, special);
        let is_special = self.gt32(abs, 0x7BFF);
        let magnitude = self.choose(is_special, special, finite);
        let out = self.b.ins().bor(magnitude, sign);
        self.bits_f32(out)
    }

    /// The f32 `x` (or F32X4 lanes) rounded to the 16-bit `d`, as the f32 that carries a `d`
    /// value.
    pub(super) fn half_round(&mut self, d: DType, x: Value) -> Value {
        let bits = self.half_encode(d, x);
        self.half_decode(d, bits)
    }

    /// Four consecutive 16-bit elements at `addr + offset`, widened to F32X4 lanes.
    pub(super) fn half_load_x4(&mut self, d: DType, flags: MemFlagsData, addr: Value, offset: i32) -> Value {
        let bits = self.b.ins().uload16x4(flags, addr, offset);
        self.decode_loaded(d, bits)
    }

    /// [`Self::half_decode`] of freshly loaded `bits`, remembered for [`Self::store_bits`].
    fn decode_loaded(&mut self, d: DType, bits: Value) -> Value {
        let x = self.half_decode(d, bits);
        self.half_loaded.insert(x, (d, bits));
        x
    }

    /// The encoding to store for the 16-bit `d` value `x`: when `x` was widened from a load of
    /// the same dtype, that load's bits with a NaN quieted, which is what rounding it would
    /// give (widening is exact, and a NaN comes back with the quiet bit set and the payload
    /// the encoding keeps), in 4 operations instead of rounding's 30.
    fn store_bits(&mut self, d: DType, x: Value) -> Value {
        let Some(&(from, bits)) = self.half_loaded.get(&x) else { return self.half_encode(d, x) };
        if from != d {
            return self.half_encode(d, x);
        }
        let (inf, quiet_bit) = if d == DType::BF16 { (0x7F80, BF16_QUIET) } else { (0x7C00, F16_QUIET) };
        let abs = self.and32(bits, 0x7FFF);
        let is_nan = self.gt32(abs, inf);
        let quiet = self.or32(bits, quiet_bit);
        self.choose(is_nan, quiet, bits)
    }

    /// The four lanes of `x` (16-bit values carried as F32X4) stored as consecutive 16-bit
    /// elements at `addr + offset`.
    pub(super) fn half_store_x4(
        &mut self,
        d: DType,
        flags: MemFlagsData,
        x: Value,
        addr: Value,
        offset: i32,
    ) {
        let bits = self.store_bits(d, x);
        for lane in 0..4u8 {
            let b = self.b.ins().extractlane(bits, lane);
            self.b.ins().istore16(flags, b, addr, offset + 2 * i32::from(lane));
        }
    }

    /// A LOAD of a 16-bit element at `addr + offset`, widened to its f32.
    pub(super) fn half_load(&mut self, d: DType, addr: Value, offset: i32) -> Value {
        let bits = self.b.ins().uload16(types::I32, mem(), addr, offset);
        self.decode_loaded(d, bits)
    }

    /// A STORE of the 16-bit value `x` (carried as f32) at `addr + offset`.
    pub(super) fn half_store(&mut self, d: DType, x: Value, addr: Value, offset: i32) {
        let bits = self.store_bits(d, x);
        self.b.ins().istore16(mem(), bits, addr, offset);
    }
}
