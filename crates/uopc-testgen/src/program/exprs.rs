//! Expression generators: values of each dtype built from constants, loads, ALU ops,
//! reductions and local arrays, each provably in bounds and well formed.

use super::*;

impl Gen<'_> {
    pub(super) fn expr(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        if depth == 0 || self.rng.chance(25) {
            return self.leaf(d, scope, depth);
        }
        let sub = depth - 1;
        match d {
            DType::Bool => self.bool_expr(scope, sub),
            DType::I32 | DType::I64 => self.int_expr(d, scope, sub),
            _ => self.float_expr(d, scope, sub),
        }
    }

    pub(super) fn leaf(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        match self.rng.below(10) {
            0 | 1 => self.constant(d),
            2 if !scope.is_empty() || !self.vars.is_empty() => {
                // A loop variable or a variable (both non-negative, so each is its own magnitude).
                let r = if self.vars.is_empty() {
                    self.rng.pick(scope)
                } else {
                    self.rng.pick(&[scope, &self.vars].concat())
                };
                let v = r.cast(d);
                let m = (self.magnitude() && d.is_float()).then(|| v.clone());
                E { v, m, vague: false }
            }
            3 if self.budget > 0 && depth > 0 && d != DType::Bool => self.reduction(d, scope, depth),
            4 if self.budget > 0 && depth > 0 => self.local_array(d, scope, depth),
            5 if self.budget > 0 && d != DType::Bool => self.registers(d, scope, depth),
            _ => self.load(d, scope, depth),
        }
    }

    /// A load from an input buffer, cast to `d` when no input has that dtype.
    pub(super) fn load(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        let same: Vec<UOp> = self.inputs.iter().filter(|b| b.dtype() == d).cloned().collect();
        let usable: Vec<UOp> = if !same.is_empty() {
            same
        } else if self.smooth() && !d.is_float() {
            // Smooth programs never turn floats into integers or bools.
            self.inputs.iter().filter(|b| !b.dtype().is_float() && !b.dtype().is_half()).cloned().collect()
        } else {
            self.inputs.clone()
        };
        if usable.is_empty() {
            return self.constant(d);
        }
        let b = self.rng.pick(&usable);
        let i = self.index(buf_len(&b), scope, depth.min(2));
        let x = b.index(i).load();
        // A 16-bit load is widened first: the only ops on 16-bit values are casts to floats.
        let x = if x.dtype().is_half() { x.cast(if d == DType::F64 { d } else { DType::F32 }) } else { x };
        let e = E { m: (self.magnitude() && x.dtype().is_float()).then(|| abs(&x)), v: x, vague: false };
        self.cast(e, d)
    }

    pub(super) fn cast(&mut self, e: E, d: DType) -> E {
        let from = e.v.dtype();
        if from == d {
            return e;
        }
        let v = e.v.cast(d);
        let m = match (self.magnitude(), from.is_float(), d.is_float()) {
            (true, true, true) => Some(e.mag().cast(d)),
            (true, false, true) => Some(abs(&v)),
            _ => None,
        };
        E { v, m, vague: e.vague }
    }

    pub(super) fn bool_expr(&mut self, scope: &[UOp], depth: usize) -> E {
        match self.rng.below(4) {
            0 | 1 => {
                let od = if self.smooth() {
                    self.rng.pick(&[DType::Bool, DType::I32, DType::I64])
                } else {
                    self.rng.pick(&ALL)
                };
                let a = self.expr(od, scope, depth).v;
                let b = self.expr(od, scope, depth).v;
                // CMPLT is not defined for bools.
                E::plain(if self.rng.chance(50) && od != DType::Bool { a.lt(b) } else { a.ne(b) })
            }
            2 => {
                let c = self.expr(DType::Bool, scope, depth).v;
                let a = self.expr(DType::Bool, scope, depth).v;
                let b = self.expr(DType::Bool, scope, depth).v;
                E::plain(c.where_(a, b))
            }
            _ => {
                let od = if self.smooth() { self.rng.pick(&INTS) } else { self.rng.pick(&ALL) };
                let e = self.expr(od, scope, depth);
                self.cast(e, DType::Bool)
            }
        }
    }

    pub(super) fn int_expr(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        let v = match self.rng.below(9) {
            0 => self.expr(d, scope, depth).v + self.expr(d, scope, depth).v,
            1 => self.expr(d, scope, depth).v - self.expr(d, scope, depth).v,
            2 => self.expr(d, scope, depth).v * self.expr(d, scope, depth).v,
            3 => self.expr(d, scope, depth).v.maximum(self.expr(d, scope, depth).v),
            4 => -self.expr(d, scope, depth).v,
            5 | 6 => {
                let a = self.expr(d, scope, depth).v;
                let b = if self.rng.chance(50) {
                    let c =
                        self.rng.pick(&[2, 3, 4, 7, 16, -1, -2, -3, 0, 1, 1 << 20, 46341, i32::MAX as i64]);
                    konst(ConstValue::Int(c), d)
                } else {
                    self.expr(d, scope, depth).v
                };
                if self.rng.chance(50) { a.idiv(b) } else { a.modulo(b) }
            }
            7 => {
                let c = self.expr(DType::Bool, scope, depth).v;
                let a = self.expr(d, scope, depth).v;
                let b = self.expr(d, scope, depth).v;
                c.where_(a, b)
            }
            _ => {
                let od = if self.smooth() {
                    self.rng.pick(&[DType::Bool, DType::I32, DType::I64])
                } else {
                    self.rng.pick(&ALL)
                };
                let e = self.expr(od, scope, depth);
                return self.cast(e, d);
            }
        };
        E::plain(v)
    }

    pub(super) fn float_expr(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        let mg = self.magnitude();
        match self.rng.below(10) {
            0..=3 => {
                let a = self.expr(d, scope, depth);
                let b = self.expr(d, scope, depth);
                let k = self.rng.below(4);
                let v = match k {
                    0 => &a.v + &b.v,
                    1 => &a.v - &b.v,
                    2 => &a.v * &b.v,
                    _ => a.v.maximum(&b.v),
                };
                let m = mg.then(|| match k {
                    0 | 1 => a.mag() + b.mag(),
                    2 => a.mag() * b.mag(),
                    _ => a.mag().maximum(b.mag()),
                });
                E { v, m, vague: a.vague || b.vague }
            }
            4 => {
                let a = self.expr(d, scope, depth);
                E { v: -&a.v, m: a.m.clone(), vague: a.vague }
            }
            5 | 6 => self.transcendental(d, scope, depth),
            7 => {
                let c = self.expr(DType::Bool, scope, depth).v;
                let a = self.expr(d, scope, depth);
                let b = self.expr(d, scope, depth);
                let m = mg.then(|| c.where_(a.mag(), b.mag()));
                E { v: c.where_(&a.v, &b.v), m, vague: a.vague || b.vague }
            }
            _ => {
                let od = if self.smooth() {
                    self.rng.pick(&ALL)
                } else {
                    self.rng.pick(&[DType::Bool, DType::I32, DType::I64, DType::F32, DType::F64])
                };
                let e = self.expr(od, scope, depth);
                self.cast(e, d)
            }
        }
    }

    pub(super) fn transcendental(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        let a = self.expr(d, scope, depth);
        let which = self.rng.below(4);
        if !self.smooth() {
            let v = match which {
                0 if d == DType::F32 => a.v.cast(DType::F64).exp2().cast(DType::F32),
                0 => a.v.exp2(),
                1 => a.v.log2(),
                2 => a.v.sqrt(),
                _ => a.v.recip(),
            };
            return E::plain(v);
        }
        if which == 0 && !a.vague {
            let v = a.v.exp2();
            // d exp2(x) = exp2(x) ln2 dx, plus the JIT's flush of results below 2^-126 to zero.
            let m = self
                .magnitude()
                .then(|| &v * (a.mag() * std::f64::consts::LN_2 + 1.0) + fconst(2f64.powi(-100), d));
            return E { v, m, vague: a.vague };
        }
        // g = a*a + 1 >= 1, where SQRT, LOG2 and RECIP have derivatives of at most 1.44.
        let g = &a.v * &a.v + 1.0;
        let mg = self.magnitude().then(|| a.mag() * a.mag() + 1.0);
        let v = match which {
            1 => g.log2(),
            2 => g.sqrt(),
            _ => g.recip(),
        };
        let m = mg.map(|mg| match which {
            1 => &mg + mg.log2(),
            2 => &mg + mg.sqrt(),
            _ => mg + 1.0,
        });
        E { v, m, vague: a.vague }
    }

    /// A reduction over a new REDUCE range, written the canonical way.
    pub(super) fn reduction(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        self.budget -= 1;
        let end = self.range_end(scope, true);
        let r = self.new_range(end, AxisType::Reduce);
        let trips = r.vmax().max(0) as u64 + 1;
        self.chain = self.chain.saturating_mul(trips);
        self.sum_len = self.sum_len.max(self.chain);
        let acc = self.new_alloc(d, 1);
        let acc_s = if scope.is_empty() { acc.clone() } else { acc.after(scope) };
        let kind = self.rng.below(if self.opts.self_referencing_sums { 5 } else { 4 });
        let mg = self.magnitude() && d.is_float();
        // 0: sum, 1: max, 2: acc * c + x, 3: sum from a random start, 4: acc + (acc * c + x).
        let init = match kind {
            1 => konst(uopc_ir::ReduceOp::Max.identity(d), d),
            3 => self.constant(d).v,
            _ => konst(uopc_ir::ReduceOp::Add.identity(d), d),
        };
        let init_stored = if mg { if kind == 1 { fconst(0.0, d) } else { abs(&init) } } else { init };
        let init_st = acc_s.index(0).store(init_stored);
        let acc_r = acc_s.after(&[init_st, r.clone()]);
        let cur = acc_r.index(0).load();
        let mut inner = scope.to_vec();
        inner.push(r.clone());
        let x = self.expr(d, &inner, depth - 1);
        let c = if d.is_float() {
            fconst(self.rng.pick(&[0.5, -0.75, 1.5]), d)
        } else {
            konst(ConstValue::Int(self.rng.pick(&[2, -3, 5])), d)
        };
        let xv = if mg { x.mag() } else { x.v.clone() };
        let cc = if mg { abs(&c) } else { c };
        let upd = match kind {
            1 => cur.maximum(&xv),
            2 => &cur * &cc + &xv,
            4 => &cur + (&cur * &cc + &xv),
            _ => &cur + &xv,
        };
        let upd_st = acc_r.index(0).store(upd).end(std::slice::from_ref(&r));
        self.chain /= trips;
        let v = acc_s.after(&[upd_st]).index(0).load();
        E { m: mg.then(|| v.clone()), v, vague: true }
    }

    /// A local array filled by its own loop, then read at a computed index.
    pub(super) fn local_array(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        self.budget -= 1;
        let len = 1 + self.rng.below(8) as usize;
        let tmp = self.new_alloc(d, len);
        let tmp_s = if scope.is_empty() { tmp.clone() } else { tmp.after(scope) };
        let k = self.new_range(idx(len as i64), AxisType::Loop);
        let mut inner = scope.to_vec();
        inner.push(k.clone());
        let x = self.expr(d, &inner, depth - 1);
        let xv = if self.magnitude() && d.is_float() { x.mag() } else { x.v };
        let fill = tmp_s.index(&k).store(xv).end(std::slice::from_ref(&k));
        let i = self.index(len, scope, depth - 1);
        let v = tmp_s.after(&[fill]).index(i).load();
        E { m: (self.magnitude() && d.is_float()).then(|| v.clone()), v, vague: true }
    }

    /// A tiny local array written and read at constant indices (kept in registers).
    pub(super) fn registers(&mut self, d: DType, scope: &[UOp], depth: usize) -> E {
        self.budget -= 1;
        let len = 1 + self.rng.below(3) as usize;
        let tmp = self.new_alloc(d, len);
        let tmp_s = if scope.is_empty() { tmp.clone() } else { tmp.after(scope) };
        let mut stores = Vec::new();
        for k in 0..len {
            let x = self.expr(d, scope, depth.saturating_sub(1));
            let xv = if self.magnitude() && d.is_float() { x.mag() } else { x.v };
            stores.push(tmp_s.index(k).store(xv));
        }
        let k = self.rng.below(len as u64) as usize;
        let v = tmp_s.after(&stores).index(k).load();
        E { m: (self.magnitude() && d.is_float()).then(|| v.clone()), v, vague: true }
    }
}
