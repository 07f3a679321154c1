//! Rangeify: lowers one kernel's tensor-level body to an explicit loop program.
//!
//! The value of a node at an index (one index expression per axis) is computed by rules per
//! op: movement ops rewrite the index, ALU ops apply to their sources' values, a `Param` loads
//! from its buffer, and a REDUCE opens loops with an accumulator. Results are memoized on
//! `(node, index)`, so index expressions are simplified before they become keys.

use crate::error::{Result, TensorError};
use crate::opt::Opts;
use crate::util::numel;
use std::collections::HashMap;
use uopc_ir::{AxisType, Op, ReduceOp, SimplifyOptions, UOp, alloc, buffer, idx, range, simplify_memo, sink};

/// One axis of a loop nest: its value is `base * amount + c` for each `c < amount`, where
/// `base` is a RANGE or the constant 0.
#[derive(Clone, Debug)]
struct Part {
    base: UOp,
    amount: usize,
}

/// Lowering state for one kernel: its opts, the memo, and the loops and accumulators made so far.
#[derive(Debug)]
pub struct Ctx {
    /// The kernel's opts.
    pub opts: Opts,
    /// Fold IDIV and MOD when simplifying the indices made by the RESHAPE rule.
    fold_reshape_divmod: bool,
    memo: HashMap<(UOp, Vec<UOp>), UOp>,
    reduce_parts: HashMap<(UOp, Vec<UOp>), Vec<Part>>,
    enclosing: HashMap<UOp, Vec<UOp>>,
    simp: HashMap<UOp, UOp>,
    simp_raw: HashMap<UOp, UOp>,
    next_range: usize,
    next_alloc: usize,
}

impl Ctx {
    /// A fresh context with these opts. `fold_reshape_divmod` is true in real use; false is
    /// the experiment [`Experiments::reshape_without_divmod_folding`](crate::Experiments),
    /// which shows the O(N^3) accumulator placement that unsimplified indices cause.
    pub fn new(opts: Opts, fold_reshape_divmod: bool) -> Self {
        Ctx {
            opts,
            fold_reshape_divmod,
            memo: HashMap::new(),
            reduce_parts: HashMap::new(),
            enclosing: HashMap::new(),
            simp: HashMap::new(),
            simp_raw: HashMap::new(),
            next_range: 0,
            next_alloc: 0,
        }
    }

    fn simplify(&mut self, u: &UOp) -> UOp {
        simplify_memo(u, SimplifyOptions::default(), &mut self.simp)
    }

    fn new_range(&mut self, end: usize, axis: AxisType, enclosing: Vec<UOp>) -> UOp {
        let r = range(end, self.next_range, axis);
        self.next_range += 1;
        self.enclosing.insert(r.clone(), enclosing);
        r
    }

    fn axis_part(&mut self, size: usize, amount: usize, axis: AxisType, enclosing: &[UOp]) -> Part {
        let (outer, amount) =
            if amount > 1 && size.is_multiple_of(amount) { (size / amount, amount) } else { (size, 1) };
        let base = if outer == 1 { idx(0) } else { self.new_range(outer, axis, enclosing.to_vec()) };
        Part { base, amount }
    }

    /// `ranges` plus every loop that encloses one of them, in creation order.
    fn closure(&self, ranges: &[UOp]) -> Vec<UOp> {
        let mut out: Vec<UOp> = ranges.to_vec();
        for r in ranges {
            if let Some(e) = self.enclosing.get(r) {
                out.extend(e.iter().cloned());
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

fn is_range(u: &UOp) -> bool {
    matches!(u.op(), Op::Range { .. })
}

/// The ranges an index mentions, sorted and deduplicated.
fn ranges_in(index: &[UOp]) -> Vec<UOp> {
    let mut r: Vec<UOp> = index.iter().flat_map(|i| i.ranges_mentioned()).collect();
    r.sort();
    r.dedup();
    r
}

/// Every combination of the parts' constant offsets, last axis fastest.
fn combos(parts: &[Part]) -> Vec<Vec<UOp>> {
    let mut out: Vec<Vec<UOp>> = vec![Vec::new()];
    for p in parts {
        let mut next = Vec::with_capacity(out.len() * p.amount);
        for prefix in &out {
            for c in 0..p.amount {
                let v = if p.amount == 1 { p.base.clone() } else { &p.base * p.amount + c };
                let mut x = prefix.clone();
                x.push(v);
                next.push(x);
            }
        }
        out = next;
    }
    out
}

/// Row-major flat offset of `index` in `shape` (size-1 axes contribute nothing).
fn ravel(index: &[UOp], shape: &[usize]) -> UOp {
    let mut flat: Option<UOp> = None;
    let mut stride = 1usize;
    for (i, &s) in index.iter().zip(shape).rev() {
        if s != 1 {
            let term = if stride == 1 { i.clone() } else { i * stride };
            flat = Some(match flat {
                None => term,
                Some(f) => term + f,
            });
        }
        stride *= s;
    }
    flat.unwrap_or_else(|| idx(0))
}

/// The per-axis index in `shape` of a flat offset: `(flat // stride) % size`.
fn unravel(flat: &UOp, shape: &[usize]) -> Vec<UOp> {
    let mut out = vec![idx(0); shape.len()];
    let mut stride = 1usize;
    for k in (0..shape.len()).rev() {
        if shape[k] != 1 {
            out[k] = flat.idiv(stride as i64).modulo(shape[k] as i64);
        }
        stride *= shape[k];
    }
    out
}

enum Frame {
    Visit(UOp, Vec<UOp>),
    Combine(UOp, Vec<UOp>, Vec<(UOp, Vec<UOp>)>),
}

impl Ctx {
    /// The scalar value of tensor node `u` at `index` (explicit stack: kernel bodies can be deep).
    fn rangeify(&mut self, u: &UOp, index: Vec<UOp>) -> Result<UOp> {
        let root_key = (u.clone(), index.clone());
        let mut stack = vec![Frame::Visit(u.clone(), index)];
        while let Some(f) = stack.pop() {
            match f {
                Frame::Visit(u, index) => {
                    let key = (u, index);
                    if self.memo.contains_key(&key) {
                        continue;
                    }
                    let kids = self.children(&key.0, &key.1)?;
                    let visits: Vec<Frame> =
                        kids.iter().rev().map(|(n, i)| Frame::Visit(n.clone(), i.clone())).collect();
                    stack.push(Frame::Combine(key.0, key.1, kids));
                    stack.extend(visits);
                }
                Frame::Combine(u, index, kids) => {
                    let key = (u, index);
                    if self.memo.contains_key(&key) {
                        continue;
                    }
                    let vals: Vec<UOp> = kids.iter().map(|k| self.memo[k].clone()).collect();
                    let r = self.combine(&key.0, &key.1, vals)?;
                    self.memo.insert(key, r);
                }
            }
        }
        Ok(self.memo[&root_key].clone())
    }

    /// The `(node, index)` values needed to compute `u` at `index`.
    fn children(&mut self, u: &UOp, index: &[UOp]) -> Result<Vec<(UOp, Vec<UOp>)>> {
        let src = u.src();
        let one = |i: Vec<UOp>| vec![(src[0].clone(), i)];
        Ok(match u.op() {
            Op::Const(_) | Op::Param { .. } => vec![],
            Op::Stage | Op::Detach => one(index.to_vec()),
            op if op.is_alu() => src
                .iter()
                .map(|s| (s.clone(), if s.shape().is_empty() { vec![] } else { index.to_vec() }))
                .collect(),
            Op::Reshape(shape) => {
                // Simplify now: ((i*N + j)//N) % N mentions j but *is* i. Which loops a reduce
                // sits in, and the memo keys, must both see the truth.
                let raw = unravel(&ravel(index, shape), src[0].shape());
                let new: Vec<UOp> = if self.fold_reshape_divmod {
                    raw.iter().map(|i| self.simplify(i)).collect()
                } else {
                    let opts = SimplifyOptions { fold_divmod: false };
                    raw.iter().map(|i| simplify_memo(i, opts, &mut self.simp_raw)).collect()
                };
                one(new)
            }
            Op::Expand(shape) => one(index
                .iter()
                .zip(src[0].shape().iter().zip(shape))
                .map(|(i, (&s, &n))| if s == 1 && n != 1 { idx(0) } else { i.clone() })
                .collect()),
            Op::Permute(perm) => {
                let mut inv = vec![idx(0); index.len()];
                for (k, &p) in perm.iter().enumerate() {
                    inv[p] = index[k].clone();
                }
                one(inv)
            }
            Op::Shrink(bounds) => one(index
                .iter()
                .zip(bounds)
                .map(|(i, &(b, _))| if b == 0 { i.clone() } else { i + b })
                .collect()),
            Op::Stack => {
                let rest = index[1..].to_vec();
                match index[0].const_int() {
                    Some(c) => vec![(src[c as usize].clone(), rest)],
                    None => src.iter().map(|s| (s.clone(), rest.clone())).collect(),
                }
            }
            Op::Reduce { axes, .. } => {
                let xs = src[0].shape();
                let rshape = xs[xs.len() - axes..].to_vec();
                let rkey = (u.clone(), ranges_in(index));
                let parts = match self.reduce_parts.get(&rkey) {
                    Some(p) => p.clone(),
                    None => {
                        // Unrolled copies of one reduce (same ranges, other constants) share one loop.
                        let mut enclosing = self.closure(&rkey.1);
                        let mut parts = Vec::new();
                        for (k, &s) in rshape.iter().enumerate() {
                            let amount = if k + 1 == rshape.len() { self.opts.unroll.max(1) } else { 1 };
                            let p = self.axis_part(s, amount, AxisType::Reduce, &enclosing);
                            if is_range(&p.base) {
                                enclosing.push(p.base.clone());
                            }
                            parts.push(p);
                        }
                        self.reduce_parts.insert(rkey, parts.clone());
                        parts
                    }
                };
                combos(&parts)
                    .into_iter()
                    .map(|c| {
                        let mut i = index.to_vec();
                        i.extend(c.iter().map(|x| self.simplify(x)));
                        (src[0].clone(), i)
                    })
                    .collect()
            }
            other => {
                return Err(TensorError::Unsupported(format!("rangeify: {} in a kernel body", other.name())));
            }
        })
    }

    /// Builds the value of `u` at `index` from its children's values.
    fn combine(&mut self, u: &UOp, index: &[UOp], vals: Vec<UOp>) -> Result<UOp> {
        Ok(match u.op() {
            Op::Const(_) => u.clone(),
            Op::Param { slot, shape } => {
                let flat = ravel(index, shape);
                let flat = self.simplify(&flat);
                buffer(*slot, u.dtype(), numel(shape).max(1)).index(flat).load()
            }
            op if op.is_alu() => u.with_src(vals),
            Op::Stack => {
                if vals.len() == 1 {
                    return Ok(vals[0].clone());
                }
                let i = &index[0];
                let mut r = vals[vals.len() - 1].clone();
                for k in (0..vals.len() - 1).rev() {
                    r = i.lt(idx(k as i64 + 1)).where_(&vals[k], r);
                }
                r
            }
            Op::Reduce { op, .. } => self.reduce_acc(u, *op, index, vals),
            _ => vals[0].clone(),
        })
    }

    /// The accumulator of one copy of a reduce: an ALLOC initialised inside the loops of the
    /// output index, updated in the reduce loops and read after them.
    fn reduce_acc(&mut self, u: &UOp, rop: ReduceOp, index: &[UOp], mut vals: Vec<UOp>) -> UOp {
        let dtype = u.dtype();
        let combine =
            |a: &UOp, b: &UOp| UOp::new(Op::Binary(rop.binary()), dtype, vec![a.clone(), b.clone()]);
        while vals.len() > 1 {
            // unrolled reduce axis: a balanced tree
            vals = vals
                .chunks(2)
                .map(|c| if c.len() == 2 { combine(&c[0], &c[1]) } else { c[0].clone() })
                .collect();
        }
        let rkey = (u.clone(), ranges_in(index));
        let real: Vec<UOp> =
            self.reduce_parts[&rkey].iter().map(|p| p.base.clone()).filter(is_range).collect();
        if real.is_empty() {
            return vals.swap_remove(0);
        }
        let acc = alloc(self.next_alloc, dtype, 1);
        self.next_alloc += 1;
        // The accumulator lives inside exactly the loops the output index uses (plus the loops
        // around those, so the loop nest stays a chain)...
        let scope = self.closure(&rkey.1);
        let acc0 = if scope.is_empty() { acc } else { acc.after(&scope) };
        let ident = UOp::new(Op::Const(rop.identity(dtype)), dtype, vec![]);
        let init = acc0.index(0).store(ident);
        // ...is re-read every iteration of the reduce loops...
        let mut deps = vec![init];
        deps.extend(real.iter().cloned());
        let accl = acc0.after(&deps);
        let upd = accl.index(0).store(combine(&accl.index(0).load(), &vals[0]));
        let inner_first: Vec<UOp> = real.iter().rev().cloned().collect();
        // ...and is read once more after the loops end.
        acc0.after(&[upd.end(&inner_first)]).index(0).load()
    }
}

impl Ctx {
    /// The scalar value of `body` at `index` (one expression per axis of `body`'s shape, each
    /// simplified here): the expression `lower` stores for that element, for a kernel that
    /// builds its own loops and stores around it (a GEMM epilogue).
    pub(crate) fn value_at(&mut self, body: &UOp, index: &[UOp]) -> Result<UOp> {
        let index: Vec<UOp> = index.iter().map(|i| self.simplify(i)).collect();
        self.rangeify(body, index)
    }
}

/// Lowers a kernel body (tensor level, inputs as `Param`s with kernel-local slots) to a loop
/// program that stores every element of `body` into `out`, a BUFFER of `body`'s element count.
///
/// # Errors
///
/// [`TensorError::Unsupported`] when the body holds an op that has no loop form (data leaves must have been
/// replaced by `Param`s).
pub fn lower(body: &UOp, out: &UOp, ctx: &mut Ctx) -> Result<UOp> {
    let shape = body.shape().to_vec();
    let mut parts = Vec::with_capacity(shape.len());
    let mut outer: Vec<UOp> = Vec::new();
    for (k, &s) in shape.iter().enumerate() {
        let axis = if ctx.opts.thread == Some(k) && k == 0 { AxisType::Thread } else { AxisType::Loop };
        let p = ctx.axis_part(s, ctx.opts.upcast_of(k), axis, &outer);
        if is_range(&p.base) {
            outer.push(p.base.clone());
        }
        parts.push(p);
    }
    let mut stores = Vec::new();
    for c in combos(&parts) {
        let index: Vec<UOp> = c.iter().map(|x| ctx.simplify(x)).collect();
        let v = ctx.rangeify(body, index.clone())?;
        let v = if v.dtype() == out.dtype() { v } else { v.cast(out.dtype()) };
        let flat = ravel(&index, &shape);
        let flat = ctx.simplify(&flat);
        stores.push(out.index(flat).store(v));
    }
    let inner_first: Vec<UOp> = outer.iter().rev().cloned().collect();
    let body = if stores.len() == 1 { stores.pop().expect("one store") } else { sink(&stores) };
    Ok(sink(&[body.end(&inner_first)]))
}
