//! Rangeify: lowers one kernel's tensor-level body to an explicit loop program.
//!
//! The value of a node at an index (one index expression per axis) is computed by rules per
//! op: movement ops rewrite the index, ALU ops apply to their sources' values, a `Param` loads
//! from its buffer, and a REDUCE opens loops with an accumulator. Results are memoized on
//! `(node, index)`, so index expressions are simplified before they become keys.

use crate::error::{Result, TensorError};
use crate::opt::{Opts, single_long_axis};
use crate::util::numel;
use std::collections::HashMap;
use uopc_ir::{
    AxisType, BinaryOp, ConstValue, DType, IntoIndex, Op, ReduceOp, SimplifyOptions, UOp, alloc, buffer, idx,
    range, simplify_memo, sink,
};

mod online;
use crate::view::{movement_source_index, ravel};
use online::{Groups, Reader, Running, Scope};

/// Where a node's values already are: at `index`, element `sum_a (index[a] - origin[a]) *
/// strides[a]` of `buffer` (axes of stride 0 are not read).
#[derive(Clone, Debug)]
pub(crate) struct Known {
    /// The buffer (or local tile) holding the values, as the program sees it at the read.
    pub buffer: UOp,
    /// The index of its first element.
    pub origin: Vec<UOp>,
    /// Its stride along each axis of the node.
    pub strides: Vec<usize>,
}

/// A memo key: a node, the index it is read at, and the running maximum it is read under.
type Key = (UOp, Vec<UOp>, Option<Scope>);

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
    memo: HashMap<Key, UOp>,
    reduce_parts: HashMap<(UOp, Vec<UOp>), Vec<Part>>,
    groups: Groups,
    running: HashMap<(UOp, UOp, Vec<UOp>), Vec<Running>>,
    /// Per online sum's scope, the index at which its summand read the maximum.
    read_at: HashMap<Reader, Vec<UOp>>,
    /// Nodes whose values a caller computed elsewhere (see [`Ctx::assume`]).
    known: HashMap<UOp, Known>,
    enclosing: HashMap<UOp, Vec<UOp>>,
    /// Loops of the caller that every accumulator lives inside (see [`Ctx::value_within`]).
    within: Vec<UOp>,
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
            groups: Groups::default(),
            running: HashMap::new(),
            read_at: HashMap::new(),
            known: HashMap::new(),
            enclosing: HashMap::new(),
            within: Vec::new(),
            simp: HashMap::new(),
            simp_raw: HashMap::new(),
            next_range: 0,
            next_alloc: 0,
        }
    }

    /// Reads of `u` are loads from where `known` says its values are, instead of computing it
    /// (a lowering that computes part of a body with tile ops lets rangeify do the rest).
    pub(crate) fn assume(&mut self, u: &UOp, known: Known) {
        self.known.insert(u.clone(), known);
    }

    /// A fresh RANGE of `end` iterations (a count, or an index expression of the enclosing
    /// loops) inside the loops `enclosing`, for a program built around this context (its ids
    /// never collide with the ones rangeify makes).
    pub(crate) fn fresh_range(&mut self, end: impl IntoIndex, axis: AxisType, enclosing: &[UOp]) -> UOp {
        self.new_range(end, axis, enclosing.to_vec())
    }

    /// A fresh local ALLOC of `len` elements, as [`Ctx::fresh_range`] for ranges.
    pub(crate) fn fresh_alloc(&mut self, dtype: DType, len: usize) -> UOp {
        self.next_alloc += 1;
        alloc(self.next_alloc - 1, dtype, len)
    }

    fn simplify(&mut self, u: &UOp) -> UOp {
        simplify_memo(u, SimplifyOptions::default(), &mut self.simp)
    }

    fn new_range(&mut self, end: impl IntoIndex, axis: AxisType, enclosing: Vec<UOp>) -> UOp {
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

/// The parts of the leading axes of `shape` that the THREAD range covers when the opts merge
/// or split it ([`Opts::thread_axes`], [`Opts::thread_split`]), the loops made for them, and
/// how many axes they cover (0: none, `lower` makes every part itself).
fn thread_parts(shape: &[usize], ctx: &mut Ctx) -> (Vec<Part>, Vec<UOp>, usize) {
    let threaded = ctx.opts.thread == Some(0);
    let merged = if threaded { ctx.opts.thread_axes.min(shape.len()) } else { 0 };
    let split = ctx.opts.thread_split;
    // Merged axes of size 1 alone (a (1, 1, n) kernel) make no range at all.
    if threaded && merged > 1 && shape[..merged].iter().product::<usize>() > 1 {
        // One THREAD range over the leading axes; each axis's index is its digit of it.
        let t = ctx.new_range(shape[..merged].iter().product::<usize>(), AxisType::Thread, Vec::new());
        let parts = (0..merged)
            .map(|k| {
                let inner: usize = shape[k + 1..merged].iter().product();
                let digit = if inner == 1 { t.clone() } else { t.idiv(inner as i64) };
                let base = if k == 0 { digit } else { digit.modulo(shape[k] as i64) };
                Part { base, amount: 1 }
            })
            .collect();
        return (parts, vec![t], merged);
    }
    if threaded
        && split > 1
        && let Some(j) = single_long_axis(shape)
        && shape[j] > split
        && shape[j].is_multiple_of(split)
    {
        // A THREAD range over runs of `split` elements of the one long axis, each run an inner
        // loop; the axes of size 1 are index 0.
        let t = ctx.new_range(shape[j] / split, AxisType::Thread, Vec::new());
        let i = ctx.new_range(split, AxisType::Loop, vec![t.clone()]);
        let run = &t * split as i64 + &i;
        let parts = (0..shape.len())
            .map(|k| Part { base: if k == j { run.clone() } else { idx(0) }, amount: 1 })
            .collect();
        return (parts, vec![t, i], shape.len());
    }
    (Vec::with_capacity(shape.len()), Vec::new(), 0)
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

enum Frame {
    Visit(Key),
    Combine(Key, Vec<Key>),
}

impl Ctx {
    /// The scalar value of tensor node `u` at `index` (explicit stack: kernel bodies can be deep).
    fn rangeify(&mut self, u: &UOp, index: Vec<UOp>, scope: Option<Scope>) -> Result<UOp> {
        let root_key = (u.clone(), index, scope);
        let mut stack = vec![Frame::Visit(root_key.clone())];
        while let Some(f) = stack.pop() {
            match f {
                Frame::Visit(key) => {
                    if self.memo.contains_key(&key) {
                        continue;
                    }
                    let kids = self.children(&key.0, &key.1, key.2.as_ref())?;
                    let visits: Vec<Frame> = kids.iter().rev().map(|k| Frame::Visit(k.clone())).collect();
                    stack.push(Frame::Combine(key, kids));
                    stack.extend(visits);
                }
                Frame::Combine(key, kids) => {
                    if self.memo.contains_key(&key) {
                        continue;
                    }
                    let vals: Vec<UOp> = kids.iter().map(|k| self.memo[k].clone()).collect();
                    let r = self.combine(&key.0, &key.1, key.2.as_ref(), vals)?;
                    self.memo.insert(key, r);
                }
            }
        }
        Ok(self.memo[&root_key].clone())
    }

    /// The values needed to compute `u` at `index` under `scope`, each with the scope it is
    /// read under: a source inherits the running maximum when it reads that maximum, and a
    /// REDUCE other than the maximum itself is always its own, finished value.
    fn children(&mut self, u: &UOp, index: &[UOp], scope: Option<&Scope>) -> Result<Vec<Key>> {
        if self.known.contains_key(u) {
            return Ok(Vec::new());
        }
        if let Some(kids) = self.online_children(u, index, scope) {
            return Ok(kids);
        }
        let kids = self.plain_children(u, index)?;
        Ok(kids
            .into_iter()
            .map(|(n, i)| {
                let s = scope.filter(|s| self.groups.reads(&n, &s.max)).cloned();
                (n, i, s)
            })
            .collect())
    }

    /// The `(node, index)` values needed to compute `u` at `index`.
    fn plain_children(&mut self, u: &UOp, index: &[UOp]) -> Result<Vec<(UOp, Vec<UOp>)>> {
        let src = u.src();
        let one = |i: Vec<UOp>| vec![(src[0].clone(), i)];
        Ok(match u.op() {
            Op::Const(_) | Op::Param { .. } | Op::Arange(_) => vec![],
            Op::Stage | Op::Detach => one(index.to_vec()),
            op if op.is_alu() => src
                .iter()
                .map(|s| (s.clone(), if s.shape().is_empty() { vec![] } else { index.to_vec() }))
                .collect(),
            Op::Reshape(_) => {
                // Simplify now: ((i*N + j)//N) % N mentions j but *is* i. Which loops a reduce
                // sits in, and the memo keys, must both see the truth.
                let raw = movement_source_index(u, index);
                let new: Vec<UOp> = if self.fold_reshape_divmod {
                    raw.iter().map(|i| self.simplify(i)).collect()
                } else {
                    let opts = SimplifyOptions { fold_divmod: false };
                    raw.iter().map(|i| simplify_memo(i, opts, &mut self.simp_raw)).collect()
                };
                one(new)
            }
            Op::Expand(_) | Op::Permute(_) | Op::Shrink(_) => one(movement_source_index(u, index)),
            Op::Stack => {
                let rest = index[1..].to_vec();
                match index[0].const_int() {
                    Some(c) => vec![(src[c as usize].clone(), rest)],
                    None => src.iter().map(|s| (s.clone(), rest.clone())).collect(),
                }
            }
            Op::Reduce { .. } => {
                let unroll = self.opts.unroll.max(1);
                self.reduce_loop(u, u, ranges_in(index), unroll)
                    .into_iter()
                    .map(|c| {
                        let mut i = index.to_vec();
                        i.extend(c);
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
    fn combine(&mut self, u: &UOp, index: &[UOp], scope: Option<&Scope>, vals: Vec<UOp>) -> Result<UOp> {
        if let Some(k) = self.known.get(u).cloned() {
            let mut offset = idx(0);
            for ((i, o), &s) in index.iter().zip(&k.origin).zip(&k.strides) {
                if s != 0 {
                    offset = offset + (i - o) * s as i64;
                }
            }
            let offset = self.simplify(&offset);
            return Ok(k.buffer.index(offset).load());
        }
        if let Some(v) = self.online_combine(u, index, scope, &vals)? {
            return Ok(v);
        }
        Ok(match u.op() {
            Op::Const(_) => u.clone(),
            // a position is its index; an index is an I64 expression
            Op::Arange(_) if u.dtype() == DType::I64 => index[0].clone(),
            Op::Arange(_) => index[0].cast(u.dtype()),
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

    /// The loop over reduce `u`'s axes inside the loops of `ranges`, owned by `owner` (reduces
    /// with one owner and the same ranges share it: the unrolled copies of one reduce, or the
    /// members of an online group), as the reduce index of each unrolled copy. The last axis is
    /// unrolled by `unroll` when that divides it.
    fn reduce_loop(&mut self, u: &UOp, owner: &UOp, ranges: Vec<UOp>, unroll: usize) -> Vec<Vec<UOp>> {
        let Some(reduce) = u.as_reduce() else { return vec![Vec::new()] };
        let (xs, axes) = (reduce.input.shape(), reduce.axes);
        let rshape = xs[xs.len() - axes..].to_vec();
        self.loop_over(&rshape, owner, ranges, unroll)
    }

    /// The loop over `rshape` owned by `owner` inside the loops of `ranges` (see
    /// [`Ctx::reduce_loop`]).
    fn loop_over(&mut self, rshape: &[usize], owner: &UOp, ranges: Vec<UOp>, unroll: usize) -> Vec<Vec<UOp>> {
        let rkey = (owner.clone(), ranges);
        let parts = match self.reduce_parts.get(&rkey) {
            Some(p) => p.clone(),
            None => {
                let mut enclosing = self.closure(&rkey.1);
                let mut parts = Vec::new();
                for (k, &s) in rshape.iter().enumerate() {
                    let amount = if k + 1 == rshape.len() { unroll } else { 1 };
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
        combos(&parts).into_iter().map(|c| c.iter().map(|x| self.simplify(x)).collect()).collect()
    }

    /// The accumulator of one copy of a reduce: an ALLOC initialised inside the loops of the
    /// output index, updated in the reduce loops and read after them.
    fn reduce_acc(&mut self, u: &UOp, rop: ReduceOp, index: &[UOp], vals: Vec<UOp>) -> UOp {
        let dtype = u.dtype();
        // unrolled reduce axis: its copies combined in a balanced tree
        let value = balanced(rop.binary(), &vals);
        let ranges = ranges_in(index);
        let owner = self.groups.loop_owner(u);
        let real = self.loop_ranges(&owner, &ranges);
        if real.is_empty() {
            return value;
        }
        let (acc0, accl) = self.accumulator(dtype, rop.identity(dtype), &ranges, &real);
        let update = UOp::new(Op::Binary(rop.binary()), dtype, vec![accl.index(0).load(), value]);
        let upd = accl.index(0).store(update);
        let inner_first: Vec<UOp> = real.iter().rev().cloned().collect();
        // ...and is read once more after the loops end.
        acc0.after(&[upd.end(&inner_first)]).index(0).load()
    }

    /// The RANGEs of the loop [`Ctx::reduce_loop`] made for `owner` inside `ranges`, outermost
    /// first (none when every reduced axis has size 1).
    fn loop_ranges(&self, owner: &UOp, ranges: &[UOp]) -> Vec<UOp> {
        let key = (owner.clone(), ranges.to_vec());
        self.reduce_parts[&key].iter().map(|p| p.base.clone()).filter(is_range).collect()
    }

    /// A one-element accumulator for a loop over `real` inside the loops of `ranges`, set to
    /// `ident` before the loop: the ALLOC as seen after the loop's parents (`acc0`) and as seen
    /// in each iteration (`accl`).
    fn accumulator(&mut self, dtype: DType, ident: ConstValue, ranges: &[UOp], real: &[UOp]) -> (UOp, UOp) {
        let acc = alloc(self.next_alloc, dtype, 1);
        self.next_alloc += 1;
        // The accumulator lives inside exactly the loops the output index uses (plus the loops
        // around those, so the loop nest stays a chain, and the caller's loops the value is
        // computed in)...
        let scope = self.closure(&[ranges, &self.within[..]].concat());
        let acc0 = if scope.is_empty() { acc } else { acc.after(&scope) };
        let init = acc0.index(0).store(UOp::new(Op::Const(ident), dtype, vec![]));
        // ...and is re-read every iteration of the reduce loops.
        let mut deps = vec![init];
        deps.extend(real.iter().cloned());
        let accl = acc0.after(&deps);
        (acc0, accl)
    }
}

impl Ctx {
    /// The scalar value of `body` at `index` (one expression per axis of `body`'s shape, each
    /// simplified here): the expression `lower` stores for that element, for a kernel that
    /// builds its own loops and stores around it (a GEMM epilogue, an online group on tile
    /// ops), with the reads [`Ctx::assume`] set up.
    pub(crate) fn value_at(&mut self, body: &UOp, index: &[UOp]) -> Result<UOp> {
        self.value_within(body, index, &[])
    }

    /// [`Ctx::value_at`] for a value computed inside the caller's `loops` (RANGEs from
    /// [`Ctx::fresh_range`]): the accumulators of its reduces are declared inside them too.
    /// The index alone does not always say so: a loop of one iteration is simplified out of
    /// it, and an accumulator declared outside a THREAD range would be shared by its tasks.
    pub(crate) fn value_within(&mut self, body: &UOp, index: &[UOp], loops: &[UOp]) -> Result<UOp> {
        let index: Vec<UOp> = index.iter().map(|i| self.simplify(i)).collect();
        let outer = std::mem::replace(&mut self.within, loops.to_vec());
        let value = self.rangeify(body, index, None);
        self.within = outer;
        value
    }
}

/// `vals` combined by `op` in a balanced tree, pairs left to right (`vals` is not empty).
fn balanced(op: BinaryOp, vals: &[UOp]) -> UOp {
    let mut vals = vals.to_vec();
    while vals.len() > 1 {
        vals = vals
            .chunks(2)
            .map(|c| match c {
                [a, b] => UOp::new(Op::Binary(op), a.dtype(), vec![a.clone(), b.clone()]),
                [a] => a.clone(),
                _ => unreachable!("chunks of at most two"),
            })
            .collect();
    }
    vals.swap_remove(0)
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
    ctx.groups = Groups::of(body);
    let (mut parts, mut outer, handled) = thread_parts(&shape, ctx);
    for (k, &s) in shape.iter().enumerate().skip(handled) {
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
        let v = ctx.rangeify(body, index.clone(), None)?;
        let v = if v.dtype() == out.dtype() { v } else { v.cast(out.dtype()) };
        let flat = ravel(&index, &shape);
        let flat = ctx.simplify(&flat);
        stores.push(out.index(flat).store(v));
    }
    let inner_first: Vec<UOp> = outer.iter().rev().cloned().collect();
    let body = if stores.len() == 1 { stores.pop().expect("one store") } else { sink(&stores) };
    Ok(sink(&[body.end(&inner_first)]))
}
