//! Random well-formed loop programs with matching input buffers.
//!
//! Two profiles:
//! - [`Profile::Exact`]: every op the IR has, on inputs that include NaN, infinities, -0 and
//!   integer extremes. Float compares, float-to-int casts and IDIV/MOD by zero make results
//!   discontinuous, so these programs are compared bit for bit against a JIT build without FMA
//!   contraction or reassociation. f32 EXP2 (a polynomial in the JIT) is written as an f64 EXP2
//!   between casts.
//! - [`Profile::Smooth`]: float values only flow through continuous ops (guarded SQRT, LOG2 and
//!   RECIP, f32 EXP2 included), so results under FMA contraction and reassociated sums differ by
//!   rounding only. Generating the same seed in [`Mode::Magnitude`] yields a twin program that
//!   stores, for each float result, a bound on the magnitudes its rounding errors scale with;
//!   tolerances come from it.
//!
//! Every program is built so that it passes `uopc_ir::verify`: indices are proven in bounds by
//! construction, every range is used by what its END closes, accumulators follow the canonical
//! ALLOC pattern, and with a THREAD range every store's index is `t * S + r` with `0 <= r < S`.
//!
//! With [`Options::variables`], range ends (THREAD ones included) and index terms may be
//! variables (`uopc_ir::var`): the bounds proofs then hold for their declared capacity, and a
//! case carries one value per variable, its lower bound, its upper bound or one in between.

use crate::rng::Rng;
use std::collections::HashMap;
use uopc_ir::{AxisType, ConstValue, DType, HostBuffer, Op, UOp, alloc, buffer, idx, range, sink, var};

mod exprs;

/// Which op mix and input values to generate (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// All ops and special values; compared bit-exactly against a strict JIT build.
    Exact,
    /// Continuous float paths; compared with a magnitude-derived tolerance.
    Smooth,
}

/// What the float expressions of a Smooth program compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The program under test.
    Value,
    /// Its twin: float stores hold error magnitudes. Run it with `Precision::F64`.
    Magnitude,
}

/// Knobs for patterns the generator can leave out.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Allow accumulator updates whose added term reads the accumulator (`acc + acc * c`).
    pub self_referencing_sums: bool,
    /// Allow loop and THREAD ranges whose every use may simplify away (one iteration, or
    /// modulo arithmetic that cancels them), leaving their END with nothing to close.
    pub foldable_ranges: bool,
    /// Allow input buffers whose every load may simplify away (`x - x`, `where(c, x, x)`).
    /// When false, each input is also copied to a witness output.
    pub vanishing_buffers: bool,
    /// Compare -0.0 and +0.0 as different (the harness's exact comparison; generation ignores it).
    pub signed_zeros: bool,
    /// Allow variables (scalar arguments with declared bounds) as range ends and in index and
    /// integer expressions.
    pub variables: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            self_referencing_sums: true,
            foldable_ranges: true,
            vanishing_buffers: true,
            signed_zeros: true,
            variables: true,
        }
    }
}

/// A generated program and the buffers to run it on.
#[derive(Clone, Debug)]
pub struct Case {
    /// The SINK of the program.
    pub program: UOp,
    /// One buffer per BUFFER slot `0..n`; written ones are zero-filled.
    pub inputs: Vec<HostBuffer>,
    /// One value per variable slot `0..n`, inside the variable's declared bounds.
    pub vars: Vec<i64>,
    /// Which slots the program stores to.
    pub written: Vec<bool>,
    /// The profile it was generated with.
    pub profile: Profile,
    /// The longest chain of nested reduction trips (for summation error bounds).
    pub sum_len: u64,
}

/// A generated expression. In Magnitude mode a float expression also carries its magnitude,
/// and `vague` marks values whose `v` is not meaningful there (they come from accumulators or
/// local arrays, which hold magnitudes in that mode).
#[derive(Clone)]
struct E {
    v: UOp,
    m: Option<UOp>,
    vague: bool,
}

impl E {
    fn plain(v: UOp) -> E {
        E { v, m: None, vague: false }
    }
    fn mag(&self) -> UOp {
        self.m.clone().unwrap_or_else(|| abs(&self.v))
    }
}

fn abs(x: &UOp) -> UOp {
    x.maximum(-x)
}

fn konst(v: ConstValue, d: DType) -> UOp {
    UOp::new(Op::Const(v.cast(d)), d, vec![])
}

fn fconst(v: f64, d: DType) -> UOp {
    konst(ConstValue::float(v), d)
}

const FLOATS: [DType; 2] = [DType::F32, DType::F64];
const INTS: [DType; 2] = [DType::I32, DType::I64];
const ALL: [DType; 5] = [DType::Bool, DType::I32, DType::I64, DType::F32, DType::F64];
/// Storage-only buffer dtypes: loaded and widened with a CAST, stored after a rounding CAST.
const HALVES: [DType; 2] = [DType::BF16, DType::F16];

/// Generates a case. `rng` is consumed; clone it first to generate the Magnitude twin.
pub fn generate(rng: &mut Rng, profile: Profile, mode: Mode, opts: Options) -> Case {
    let mut g = Gen {
        rng,
        profile,
        mode,
        opts,
        inputs: Vec::new(),
        next_range: 0,
        next_alloc: 0,
        vars: Vec::new(),
        var_values: Vec::new(),
        budget: 4,
        chain: 1,
        sum_len: 1,
    };
    g.program()
}

/// The Magnitude twin of the Smooth case generated from `rng_at_start`.
pub fn magnitude_twin(rng_at_start: &Rng, opts: Options) -> UOp {
    generate(&mut rng_at_start.clone(), Profile::Smooth, Mode::Magnitude, opts).program
}

struct Gen<'a> {
    rng: &'a mut Rng,
    profile: Profile,
    mode: Mode,
    opts: Options,
    inputs: Vec<UOp>,
    next_range: usize,
    next_alloc: usize,
    /// The variables made so far (slot `k` at position `k`), and the value each runs with.
    vars: Vec<UOp>,
    var_values: Vec<i64>,
    /// Reductions and local arrays still allowed.
    budget: usize,
    /// Product of the trip bounds of the reductions being generated.
    chain: u64,
    sum_len: u64,
}

/// Iterations of the innermost point of `scope`, bounded.
fn work(scope: &[UOp]) -> u64 {
    scope.iter().map(|r| (r.vmax().max(0) as u64).saturating_add(1)).fold(1u64, u64::saturating_mul)
}

impl Gen<'_> {
    fn smooth(&self) -> bool {
        self.profile == Profile::Smooth
    }
    fn magnitude(&self) -> bool {
        self.mode == Mode::Magnitude
    }

    fn program(&mut self) -> Case {
        let n_in = 1 + self.rng.below(4) as usize;
        let mut inputs = Vec::new();
        for slot in 0..n_in {
            let d = self.pick_dtype();
            let len =
                if self.rng.chance(20) { 1 + self.rng.below(200) } else { 1 + self.rng.below(24) } as usize;
            inputs.push(self.random_buffer(d, len));
            self.inputs.push(buffer(slot, d, len));
        }
        let thread = if self.rng.chance(40) {
            let lo = if self.opts.foldable_ranges { 1 } else { 2 };
            let t = if self.rng.chance(5) && self.opts.foldable_ranges { 0 } else { self.rng.between(lo, 6) };
            // A THREAD range ending at a variable: its trip count is known only at the call.
            let end = if self.opts.variables && t >= 1 && self.rng.chance(20) {
                let low = self.rng.between(0, t);
                self.new_var(low, t)
            } else {
                idx(t)
            };
            Some(self.new_range(end, AxisType::Thread))
        } else {
            None
        };
        let n_out = 1 + self.rng.below(3) as usize;
        let mut stores = Vec::new();
        let mut written = vec![false; n_in];
        for k in 0..n_out {
            let slot = n_in + k;
            let d = self.pick_dtype();
            let mut scope: Vec<UOp> = thread.iter().cloned().collect();
            let loops = self.rng.below(4);
            for _ in 0..loops {
                if work(&scope) > 256 {
                    break;
                }
                let end = self.range_end(&scope, false);
                let r = self.new_range(end, AxisType::Loop);
                scope.push(r);
            }
            let depth = 1 + self.rng.below(4) as usize;
            let stored = if d.is_half() {
                // Computed in f32 or f64, rounded by the CAST (the magnitude too, which only
                // needs to be the right size).
                let wide = self.rng.pick(&FLOATS);
                let value = self.expr(wide, &scope, depth);
                if self.magnitude() { value.mag().cast(d) } else { value.v.cast(d) }
            } else {
                let value = self.expr(d, &scope, depth);
                if self.magnitude() && d.is_float() { value.mag() } else { value.v.clone() }
            };
            let inner: Vec<UOp> = scope.iter().filter(|r| Some(*r) != thread.as_ref()).cloned().collect();
            // Row-major position over the inner loops, each with radix its bound.
            let mut rest = idx(0);
            for (n, r) in inner.iter().enumerate() {
                rest = if n == 0 { r.clone() } else { &rest * (r.vmax().max(0) + 1) + r };
            }
            let mut index = match &thread {
                Some(t) => t * (rest.vmax().max(0) + 1) + &rest,
                None => rest,
            };
            if self.rng.chance(20) && self.opts.foldable_ranges {
                // Not injective: several iterations store to one element, the last one wins.
                let l = 1 + self.rng.below(index.vmax().max(0) as u64 + 1) as i64;
                index = (&index * self.rng.between(1, 3) + self.rng.between(0, 2)) % l;
            }
            let len = index.vmax().max(0) as usize + 1;
            let out = buffer(slot, d, len);
            inputs.push(HostBuffer::zeros(d, len));
            written.push(true);
            let mut st = out.index(&index).store(stored);
            for r in inner.iter().rev() {
                st = st.end(std::slice::from_ref(r));
            }
            stores.push(st);
        }
        if !self.opts.vanishing_buffers {
            // witness[t * n + k] = in_k[0]: a use of every input that no rewrite can remove.
            let n = self.inputs.len() as i64;
            let slot = n_in + n_out;
            let base = thread.as_ref().map(|t| t * n);
            let len = thread.as_ref().map_or(1, |t| t.vmax().max(0) + 1) * n;
            let witness = buffer(slot, DType::F64, len as usize);
            inputs.push(HostBuffer::zeros(DType::F64, len as usize));
            written.push(true);
            for (k, b) in self.inputs.clone().iter().enumerate() {
                let at = match &base {
                    Some(b) => b + k as i64,
                    None => idx(k as i64),
                };
                stores.push(witness.index(at).store(b.index(0).load().cast(DType::F64)));
            }
        }
        let program = match &thread {
            Some(t) => sink(&[sink(&stores).end(std::slice::from_ref(t))]),
            None => sink(&stores),
        };
        let (program, inputs, written, vars) =
            compact_slots(&program, inputs, written, std::mem::take(&mut self.var_values));
        Case { program, inputs, vars, written, profile: self.profile, sum_len: self.sum_len }
    }

    /// A buffer's dtype: expressions are never of a 16-bit dtype, only buffers are.
    fn pick_dtype(&mut self) -> DType {
        if self.rng.chance(10) {
            return self.rng.pick(&HALVES);
        }
        if self.rng.chance(50) { self.rng.pick(&FLOATS) } else { self.rng.pick(&ALL) }
    }

    fn new_range(&mut self, end: UOp, axis: AxisType) -> UOp {
        let id = self.next_range;
        self.next_range += 1;
        range(end, id, axis)
    }

    /// A new variable declared in `lo..=hi` (`0 <= lo`), and the value this case runs it with:
    /// either bound or one in between, so both extremes of every proof are exercised.
    fn new_var(&mut self, lo: i64, hi: i64) -> UOp {
        let v = var(self.vars.len(), lo, hi);
        let value = match self.rng.below(3) {
            0 => lo,
            1 => hi,
            _ => self.rng.between(lo, hi),
        };
        self.vars.push(v.clone());
        self.var_values.push(value);
        v
    }

    fn new_alloc(&mut self, d: DType, len: usize) -> UOp {
        let slot = self.next_alloc;
        self.next_alloc += 1;
        alloc(slot, d, len)
    }

    /// A range end: a constant, a variable, or an expression of an enclosing range.
    fn range_end(&mut self, scope: &[UOp], reduce: bool) -> UOp {
        let room = 2048 / work(scope).max(1);
        if self.opts.variables && self.rng.chance(8) {
            // A variable's trips are bounded by its hi; it may run zero times unless that is
            // to be avoided (at least 2 trips possible, so its uses cannot fold away).
            let min_hi = if self.opts.foldable_ranges || reduce { 1 } else { 2 };
            let cap = (room.min(17) as i64).max(0);
            let reusable: Vec<UOp> =
                self.vars.iter().filter(|v| v.vmax() <= cap && v.vmax() >= min_hi).cloned().collect();
            if !reusable.is_empty() && self.rng.chance(40) {
                return self.rng.pick(&reusable);
            }
            if cap >= min_hi {
                let hi = self.rng.between(min_hi, cap);
                let lo = self.rng.between(0, hi.min(3));
                return self.new_var(lo, hi);
            }
        }
        if !scope.is_empty() && self.rng.chance(30) {
            let r = self.rng.pick(scope);
            let e = match self.rng.below(5) {
                0 => &r + self.rng.between(0, 2),
                1 => (&r % 3) + 1,
                2 => &r * 2 + 1,
                3 => r.idiv(2) + 1,
                _ => r.clone(),
            };
            let min_vmax = if self.opts.foldable_ranges || reduce { 0 } else { 2 };
            if (e.vmax().max(0) as u64) < room && e.vmax() >= min_vmax {
                return e;
            }
        }
        let choices: &[i64] = if reduce { &[0, 1, 2, 3, 5, 8, 9, 12, 16] } else { &[0, 1, 2, 3, 4, 5, 7] };
        let mut n = self.rng.pick(choices).min(room.max(1) as i64);
        if n < 2 && !reduce && !self.opts.foldable_ranges {
            n = 2;
        }
        idx(n)
    }

    fn int_value(&mut self, d: DType) -> i64 {
        let v = if self.smooth() {
            self.rng.between(-50, 50)
        } else {
            match self.rng.below(10) {
                0 => self.rng.pick(&[i64::MIN, i64::MAX, i32::MIN as i64, i32::MAX as i64, -1, 0]),
                1 => self.rng.next_u64() as i64,
                2 => self.rng.between(-70000, 70000),
                _ => self.rng.between(-20, 20),
            }
        };
        if d == DType::I32 { v as i32 as i64 } else { v }
    }

    fn float_value(&mut self) -> f64 {
        if self.smooth() {
            return (self.rng.unit() * 6.0 - 3.0) * if self.rng.chance(10) { 8.0 } else { 1.0 };
        }
        if self.rng.chance(10) {
            return self.rng.pick(&[
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -0.0,
                0.0,
                1e30,
                -1e30,
                1e-30,
                3e9,
                -2.5,
                0.5,
                1e-40,
            ]);
        }
        ((self.rng.unit() * 8.0 - 4.0) * 64.0).round() / 64.0
    }

    fn random_buffer(&mut self, d: DType, len: usize) -> HostBuffer {
        match d {
            DType::Bool => HostBuffer::Bool((0..len).map(|_| self.rng.chance(50)).collect()),
            DType::I32 => HostBuffer::I32((0..len).map(|_| self.int_value(d) as i32).collect()),
            DType::I64 => HostBuffer::I64((0..len).map(|_| self.int_value(d)).collect()),
            DType::F32 => HostBuffer::F32((0..len).map(|_| self.float_value() as f32).collect()),
            DType::F64 => HostBuffer::F64((0..len).map(|_| self.float_value()).collect()),
            DType::BF16 => {
                HostBuffer::BF16((0..len).map(|_| half::bf16::from_f64(self.float_value())).collect())
            }
            DType::F16 => {
                HostBuffer::F16((0..len).map(|_| half::f16::from_f64(self.float_value())).collect())
            }
        }
    }

    fn constant(&mut self, d: DType) -> E {
        let c = match d {
            DType::Bool => ConstValue::Bool(self.rng.chance(50)),
            DType::I32 | DType::I64 => ConstValue::Int(self.int_value(d)),
            _ => ConstValue::float(self.float_value()),
        };
        let v = konst(c, d);
        let m = (self.magnitude() && d.is_float()).then(|| fconst(c.as_f64().abs(), d));
        E { v, m, vague: false }
    }

    /// A non-negative index expression provably below `len`.
    fn index(&mut self, len: usize, scope: &[UOp], depth: usize) -> UOp {
        let len = len.max(1) as i64;
        let fit = |e: UOp| if e.vmin() >= 0 && e.vmax() < len { e } else { e % len };
        let affine = |g: &mut Self| {
            let mut e = idx(g.rng.between(0, 2));
            for r in scope {
                if g.rng.chance(60) {
                    e = e + r * g.rng.between(1, 3);
                }
            }
            for v in g.vars.clone() {
                if g.rng.chance(30) {
                    e = e + v * g.rng.between(1, 2);
                }
            }
            e
        };
        match self.rng.below(8) {
            0 => idx(self.rng.below(len as u64) as i64),
            1 | 2 => fit(affine(self)),
            3 => fit(affine(self).idiv(self.rng.between(1, 4))),
            4 if depth > 0 => {
                let c = self.expr(DType::Bool, scope, depth - 1).v;
                let a = self.index(len as usize, scope, depth - 1);
                let b = self.index(len as usize, scope, depth - 1);
                c.where_(a, b)
            }
            5 => {
                let fits: Vec<&UOp> = scope.iter().filter(|r| r.vmax() < len).collect();
                match fits.is_empty() {
                    true => fit(affine(self)),
                    false => {
                        let r = self.rng.pick(&fits);
                        idx(r.vmax().max(0)) - r
                    }
                }
            }
            6 if depth > 0 => {
                // A gather through integer memory: clamped at 0, so the bound holds.
                let ints: Vec<UOp> = self.inputs.iter().filter(|b| b.dtype().is_int()).cloned().collect();
                if ints.is_empty() {
                    return fit(affine(self));
                }
                let b = self.rng.pick(&ints);
                let i = self.index(buf_len(&b), scope, depth - 1);
                b.index(i).load().cast(DType::INDEX).maximum(idx(0)) % len
            }
            _ => {
                let a = fit(affine(self));
                let b = self.index(len as usize, scope, depth.saturating_sub(1));
                a.maximum(b)
            }
        }
    }
}

fn buf_len(b: &UOp) -> usize {
    match b.op() {
        Op::Buffer { len, .. } | Op::Alloc { len, .. } => *len,
        _ => 1,
    }
}

/// Renumbers BUFFER slots and variable slots to `0..n` over the buffers and variables the
/// program uses (arguments are matched to slots by position), dropping the inputs nothing
/// reads and the values of variables nothing uses.
fn compact_slots(
    program: &UOp,
    inputs: Vec<HostBuffer>,
    written: Vec<bool>,
    var_values: Vec<i64>,
) -> (UOp, Vec<HostBuffer>, Vec<bool>, Vec<i64>) {
    let topo = UOp::toposort(std::slice::from_ref(program));
    let mut used = vec![false; inputs.len()];
    let mut var_used = vec![false; var_values.len()];
    for u in &topo {
        match u.op() {
            Op::Buffer { slot, .. } => used[slot.index()] = true,
            Op::Var { slot, .. } => var_used[slot.index()] = true,
            _ => {}
        }
    }
    let mut new_var_slot = vec![0; var_values.len()];
    let mut next_var = 0;
    for (k, &u) in var_used.iter().enumerate() {
        new_var_slot[k] = next_var;
        next_var += u as usize;
    }
    let mut new_slot = vec![0; inputs.len()];
    let mut next = 0;
    for (k, &u) in used.iter().enumerate() {
        new_slot[k] = next;
        next += u as usize;
    }
    let mut map: HashMap<UOp, UOp> = HashMap::new();
    for u in &topo {
        let v = match u.op() {
            Op::Buffer { slot, len } => {
                UOp::new(Op::Buffer { slot: new_slot[slot.index()].into(), len: *len }, u.dtype(), vec![])
            }
            Op::Var { slot, lo, hi } => var(new_var_slot[slot.index()], *lo, *hi),
            _ => u.with_src(u.src().iter().map(|s| map[s].clone()).collect()),
        };
        map.insert(u.clone(), v);
    }
    let keep = |k: &usize| used[*k];
    let inputs = inputs.into_iter().enumerate().filter(|(k, _)| keep(k)).map(|(_, b)| b).collect();
    let written = written.into_iter().enumerate().filter(|(k, _)| keep(k)).map(|(_, w)| w).collect();
    let vars = var_values.into_iter().zip(var_used).filter(|(_, u)| *u).map(|(v, _)| v).collect();
    (map[program].clone(), inputs, written, vars)
}
