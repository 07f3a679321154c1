//! Scalar (and lane-wise) arithmetic: unary and binary ops, casts, the inline `exp2`.

use super::*;

pub(crate) fn clif_type(d: DType) -> Type {
    match d {
        DType::Bool => types::I8,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::F32 => types::F32,
        DType::F64 => types::F64,
        // Carried as the f32 each widens to (see `half.rs`).
        DType::BF16 | DType::F16 => types::F32,
    }
}

impl Lowerer<'_, '_> {
    pub(super) fn unary(&mut self, op: UnaryOp, u: &UOp) -> Result<Value, JitError> {
        let (_, operand) = u.as_unary().ok_or_else(|| malformed(u))?;
        let x = self.val(operand)?;
        let d = u.dtype();
        Ok(match (op, d) {
            (UnaryOp::Neg, d) if d.is_float() => self.b.ins().fneg(x),
            (UnaryOp::Neg, _) => self.b.ins().ineg(x),
            (UnaryOp::Sqrt, _) => self.b.ins().sqrt(x),
            (UnaryOp::Recip, DType::F32) => {
                let one = self.b.ins().f32const(1.0);
                self.b.ins().fdiv(one, x)
            }
            (UnaryOp::Recip, _) => {
                let one = self.b.ins().f64const(1.0);
                self.b.ins().fdiv(one, x)
            }
            (UnaryOp::Exp2, DType::F32) => self.exp2_f32(x),
            (UnaryOp::Exp2, _) => self.call(self.externs.get(Extern::Exp2F64), x),
            (UnaryOp::Log2, DType::F32) => self.call(self.externs.get(Extern::Log2F32), x),
            (UnaryOp::Log2, _) => self.call(self.externs.get(Extern::Log2F64), x),
        })
    }

    pub(super) fn call(&mut self, f: FuncRef, x: Value) -> Value {
        let inst = self.b.ins().call(f, &[x]);
        self.b.inst_results(inst)[0]
    }

    pub(super) fn mul_add(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.use_fma {
            self.b.ins().fma(a, b, c)
        } else {
            let m = self.b.ins().fmul(a, b);
            self.b.ins().fadd(m, c)
        }
    }

    /// `2^x` inline: round-to-nearest split `x = n + f`, a degree-6 polynomial for `2^f` on
    /// [-0.5, 0.5], and `2^n` built in the exponent bits; below 2^-125 the last factor of the
    /// scale is a multiply, so results in the subnormal range round like any other product.
    /// `x < -151` (including -inf) gives 0.
    pub(super) fn exp2_f32(&mut self, x: Value) -> Value {
        // Works on f32 and on F32X4 lanes alike: 2^x = 2^n * 2^f with n = round(x) and
        // f in [-0.5, 0.5]; 2^f is a polynomial and 2^m, m = max(n, -125), is added straight
        // into its exponent bits, which keeps that sum a normal number: x = 128 gives inf
        // (2^128 overflows f32); 127.5 <= x < 128 has f < 0, so 2^f < 1 and the exponent field
        // ends at 254 (finite); at the bottom m stops at -125 (2^f >= 2^-0.5 keeps the field
        // at 1 or more). The rest of the scale, 2^(n - m) >= 2^-26, is one multiply that
        // rounds the result to the subnormal it is (1 for every normal result).
        let ty = self.b.func.dfg.value_type(x);
        let lo = self.fconst(ty, -151.0);
        let hi = self.fconst(ty, 128.0);
        // (x < lo) ? lo : x and (hi < x) ? hi : x keep NaN as NaN (the comparisons are false);
        // both spelled with LessThan, the form x64 lowers to one maxps / minps on vectors.
        let x = self.fselect(FloatCC::LessThan, x, lo, lo, x);
        let x = self.fselect(FloatCC::LessThan, hi, x, hi, x);
        let magic = self.fconst(ty, 12582912.0); // 1.5 * 2^23: adding it rounds to an integer
        let t = self.b.ins().fadd(x, magic);
        let n = self.b.ins().fsub(t, magic);
        let f = self.b.ins().fsub(x, n);
        // Cephes exp2f coefficients as published.
        #[allow(clippy::excessive_precision)]
        const P: [f32; 6] =
            [1.535_336_2e-4, 1.339_887_4e-3, 9.618_437_4e-3, 5.550_332_5e-2, 2.402_264_8e-1, 6.931_472e-1];
        let mut p = self.fconst(ty, P[0]);
        for c in &P[1..] {
            let cv = self.fconst(ty, *c);
            p = self.mul_add(p, f, cv);
        }
        let one = self.fconst(ty, 1.0);
        let poly = self.mul_add(p, f, one);
        let ity = if ty.is_vector() { types::I32X4 } else { types::I32 };
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        let iconst = |s: &mut Self, v: i64| {
            let c = s.b.ins().iconst(types::I32, v);
            if ty.is_vector() { s.b.ins().splat(ity, c) } else { c }
        };
        // The low mantissa bits of t hold n in two's complement; shifting them to the
        // exponent field drops the magic constant's bits off the top. For |n| <= 151 the
        // shifted value n * 2^23 fits an i32, so it orders as n does.
        let t_bits = self.b.ins().bitcast(ity, flags, t);
        let sh = self.b.ins().iconst(types::I32, 23);
        let n_exponent = self.b.ins().ishl(t_bits, sh);
        let floor = iconst(self, -125 << 23);
        let m_exponent = self.b.ins().smax(n_exponent, floor);
        let poly_bits = self.b.ins().bitcast(ity, flags, poly);
        let scaled = self.b.ins().iadd(poly_bits, m_exponent);
        let scaled = self.b.ins().bitcast(ty, flags, scaled);
        // 2^(n - m): the bits of 1.0 with n - m added to the exponent field.
        let rest = self.b.ins().isub(n_exponent, m_exponent);
        let one_bits = iconst(self, 0x3F80_0000);
        let rest = self.b.ins().iadd(rest, one_bits);
        let rest = self.b.ins().bitcast(ty, flags, rest);
        self.b.ins().fmul(scaled, rest)
    }

    /// The IR's NaN-propagating MAX (the interpreter's, signed zeros included) as two
    /// compare-and-selects: `(b < a) ? a : b`, the form x64 lowers to one maxss / maxps (which
    /// yields `b` when either is NaN, so a NaN `b` comes through), then `a` itself where `a`
    /// is NaN (an unordered self-compare and a blend), instead of the ten-instruction
    /// IEEE `fmax` sequence.
    pub(super) fn fmax(&mut self, a: Value, b: Value) -> Value {
        let greater = self.fselect(FloatCC::LessThan, b, a, a, b);
        self.fselect(FloatCC::Unordered, a, a, a, greater)
    }

    /// An f32 constant, splatted when `ty` is a vector type.
    pub(super) fn fconst(&mut self, ty: Type, v: f32) -> Value {
        let c = self.b.ins().f32const(v);
        if ty.is_vector() { self.b.ins().splat(ty, c) } else { c }
    }

    pub(super) fn binary(&mut self, op: BinaryOp, u: &UOp) -> Result<Value, JitError> {
        let (_, sa, sb) = u.as_binary().ok_or_else(|| malformed(u))?;
        let d = sa.dtype();
        let a = self.val(sa)?;
        if d.is_float() {
            let b = self.val(sb)?;
            return Ok(match op {
                BinaryOp::Add => self.b.ins().fadd(a, b),
                BinaryOp::Sub => self.b.ins().fsub(a, b),
                BinaryOp::Mul => self.b.ins().fmul(a, b),
                BinaryOp::Max => self.fmax(a, b),
                BinaryOp::CmpLt => self.b.ins().fcmp(FloatCC::LessThan, a, b),
                BinaryOp::CmpNe => self.b.ins().fcmp(FloatCC::NotEqual, a, b),
                BinaryOp::IDiv | BinaryOp::Mod => {
                    return Err(JitError::Internal(format!("{} on floats", u.short())));
                }
            });
        }
        // Integer division by a constant: shifts and masks for non-negative dividends and powers
        // of two, a plain sdiv otherwise; variable divisors are guarded so nothing can trap.
        // The divisor as the machine sees it (wrapped to the operand width).
        let divisor = sb.const_value().map(|c| c.cast(d).as_i64());
        if let (BinaryOp::IDiv | BinaryOp::Mod, Some(c)) = (op, divisor)
            && c != 0
            && c != -1
        {
            if c > 0 && (c as u64).is_power_of_two() && sa.vmin() >= 0 {
                let sh = c.trailing_zeros() as i64;
                return Ok(if op == BinaryOp::IDiv {
                    self.b.ins().ushr_imm_s(a, sh)
                } else {
                    self.b.ins().band_imm_s(a, c - 1)
                });
            }
            let b = self.val(sb)?;
            return Ok(if op == BinaryOp::IDiv { self.b.ins().sdiv(a, b) } else { self.b.ins().srem(a, b) });
        }
        let b = self.val(sb)?;
        Ok(match op {
            BinaryOp::Add => self.b.ins().iadd(a, b),
            BinaryOp::Sub => self.b.ins().isub(a, b),
            BinaryOp::Mul => self.b.ins().imul(a, b),
            BinaryOp::Max => self.b.ins().smax(a, b),
            BinaryOp::CmpLt => self.b.ins().icmp(IntCC::SignedLessThan, a, b),
            BinaryOp::CmpNe => self.b.ins().icmp(IntCC::NotEqual, a, b),
            BinaryOp::IDiv | BinaryOp::Mod => {
                let ty = clif_type(d);
                let zero = self.b.ins().iconst(ty, 0);
                let one = self.b.ins().iconst(ty, 1);
                let is_zero = self.b.ins().icmp_imm_s(IntCC::Equal, b, 0);
                let is_m1 = self.b.ins().icmp_imm_s(IntCC::Equal, b, -1);
                let special = self.b.ins().bor(is_zero, is_m1);
                let safe = self.b.ins().select(special, one, b);
                if op == BinaryOp::IDiv {
                    let q = self.b.ins().sdiv(a, safe);
                    let neg = self.b.ins().ineg(a);
                    let q = self.b.ins().select(is_m1, neg, q);
                    self.b.ins().select(is_zero, zero, q)
                } else {
                    let r = self.b.ins().srem(a, safe);
                    self.b.ins().select(special, zero, r)
                }
            }
        })
    }

    pub(super) fn cast(&mut self, u: &UOp) -> Result<Value, JitError> {
        let operand = u.as_cast().ok_or_else(|| malformed(u))?;
        let from = operand.dtype();
        let to = u.dtype();
        let x = self.val(operand)?;
        let (tf, tt) = (clif_type(from), clif_type(to));
        Ok(match (from, to) {
            _ if from == to => x,
            // Widening is free (the f32 is the value); a 16-bit source is exact in f32, so the
            // narrowing from it or from an f32 rounds once; from f64 through f32, as the IR
            // defines it.
            (f, DType::F32) if f.is_half() => x,
            (f, DType::F64) if f.is_half() => self.b.ins().fpromote(types::F64, x),
            (DType::F64, t) if t.is_half() => {
                let narrow = self.b.ins().fdemote(types::F32, x);
                self.half_round(t, narrow)
            }
            (_, t) if t.is_half() => self.half_round(t, x),
            (DType::F32, DType::F64) => self.b.ins().fpromote(types::F64, x),
            (DType::F64, DType::F32) => self.b.ins().fdemote(types::F32, x),
            (f, DType::Bool) if f.is_float() => {
                let z = if f == DType::F32 { self.b.ins().f32const(0.0) } else { self.b.ins().f64const(0.0) };
                self.b.ins().fcmp(FloatCC::NotEqual, x, z)
            }
            (_, DType::Bool) => self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0),
            (f, t) if f.is_float() => self.b.ins().fcvt_to_sint_sat(clif_type(t), x),
            (DType::Bool, t) if t.is_float() => {
                let w = self.b.ins().uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(tt, w)
            }
            (_, t) if t.is_float() => self.b.ins().fcvt_from_sint(tt, x),
            (DType::Bool, _) => self.b.ins().uextend(tt, x),
            _ if tf.bits() < tt.bits() => self.b.ins().sextend(tt, x),
            _ => self.b.ins().ireduce(tt, x),
        })
    }
}
