//! Lowering of online sums (see [`crate::online`]): a sum that reads a maximum over its own axis
//! is accumulated in the same loop as that maximum's running value and rescaled whenever the
//! running value grows.
//!
//! The members of one group (a REDUCE MAX and the online sums of it) whose outputs are read in
//! the same loops share one reduce loop, owned by the maximum: the maximum's accumulator is the
//! running value, each sum's summand is evaluated with the running value in place of the
//! maximum (its nodes are memoized under a [`Scope`]), and the finished maximum, if anything
//! reads it, is the running value after the loop. A sum whose summand reads another member of
//! its group (a softmax whose division was not hoisted) needs that member finished and gets a
//! loop of its own, with its own running value.

use super::{Ctx, Key, balanced, ranges_in};
use crate::error::Result;
use crate::online::OnlineSum;
use std::collections::{HashMap, HashSet};
use uopc_ir::{BinaryOp, ConstValue, Op, ReduceOp, UOp};

/// What a node is read under: the running value of `max` in the loop `owner` has inside the
/// loops of `ranges`, before this iteration's element (`old`) or after it, for the online sum
/// read at `at` (unrolled copies of one sum can read the maxima of different rows).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Scope {
    pub(super) max: UOp,
    owner: UOp,
    ranges: Vec<UOp>,
    at: Vec<UOp>,
    old: bool,
}

/// Which online sum a scope serves: its maximum, its loop and its output index.
pub(super) type Reader = (UOp, UOp, Vec<UOp>, Vec<UOp>);

impl Scope {
    fn reader(&self) -> Reader {
        (self.max.clone(), self.owner.clone(), self.ranges.clone(), self.at.clone())
    }
}

/// The shortest axis an online loop takes in blocks: below it the unrolled loop is as fast.
const BLOCKED_MIN: usize = 2048;
/// The widest block: a block of a row is read twice (for its maximum, then its sums), so it
/// should stay in L1.
const MAX_BLOCK: usize = 512;
/// The narrowest block worth its two plain loops.
const MIN_BLOCK: usize = 64;

/// `(blocks, width)` when the online loop of `u` (a grouped maximum or an online sum) runs
/// over a long single axis in blocks: per block, a plain reduce for the block's maximum, then
/// one for each sum's block sum read with the new running maximum, then one rescaling. The
/// plain reduces vectorize as any reduce does; the running state changes once per block. The
/// block's inputs are computed twice, so only a maximum of values that are read, not computed
/// by a reduce (logits, not attention scores), is taken in blocks.
fn block_of(u: &UOp) -> Option<(usize, usize)> {
    let reduce = u.as_reduce().filter(|r| r.axes == 1)?;
    let n = *reduce.input.shape().last()?;
    let max = if is_max(u) { u.clone() } else { OnlineSum::of(u)?.max };
    let input = max.as_reduce()?.input;
    let computed =
        UOp::toposort(std::slice::from_ref(input)).iter().any(|x| matches!(x.op(), Op::Reduce { .. }));
    if n < BLOCKED_MIN || computed {
        return None;
    }
    let width = crate::util::largest_divisor_at_most(n, MAX_BLOCK);
    (width >= MIN_BLOCK).then_some((n / width, width))
}

fn is_max(u: &UOp) -> bool {
    matches!(u.op(), Op::Reduce { op: ReduceOp::Max, .. })
}

/// Elements of the summed axis an online loop takes per iteration: the maximum and the
/// rescaling factor are computed once for all of them, their terms are independent.
const ONLINE_UNROLL: usize = 8;

/// The unroll of `u`'s online loop: the largest divisor of its last reduced axis up to
/// [`ONLINE_UNROLL`] (one for every member of a group, whose axes are alike).
fn online_unroll(u: &UOp) -> usize {
    let extent = u.as_reduce().and_then(|r| r.input.shape().last().copied()).unwrap_or(1);
    crate::util::largest_divisor_at_most(extent, ONLINE_UNROLL)
}

/// The running maximum as a summand reads it: `-inf` (only `-inf`s so far) read as 0. With
/// `-inf` itself the first terms would be `exp2(k * (-inf - -inf))`, NaN, where the written sum
/// has 0: the exponent subtracts the maximum of its own input (the rule checks that), so while
/// that maximum is `-inf` every term is `exp2(-inf) = 0` with the stand-in, and the rescaling
/// by `exp2(k * (g(-inf) - g(m1)))` (0 for the softmax family) when the first finite value
/// arrives keeps the sum exact. Only a row that stays at `-inf` differs from the written sum:
/// 0 instead of NaN.
fn stand_in(m: &UOp) -> UOp {
    let dtype = m.dtype();
    let c = |v: f64| UOp::new(Op::Const(ConstValue::float(v)), dtype, vec![]);
    m.ne(c(f64::NEG_INFINITY)).where_(m, c(0.0))
}

/// One running maximum: read at `index` (the maximum's own output index), its value before and
/// after each iteration's element, the END that closes its update and its finished value.
#[derive(Clone, Debug)]
pub(super) struct Running {
    index: Vec<UOp>,
    old: UOp,
    new: UOp,
    end: Option<UOp>,
    finished: UOp,
}

/// The online groups of one kernel body.
#[derive(Debug, Default)]
pub(super) struct Groups {
    /// Per maximum with online sums, every node that reads it without passing through another
    /// REDUCE (the maximum included).
    readers: HashMap<UOp, HashSet<UOp>>,
    /// Per online sum, the node whose loop it is accumulated in.
    owner: HashMap<UOp, UOp>,
    /// The block reduces of long groups (see [`block_of`]), each with the node owning its
    /// loop: all block sums of one group share one loop, after the block maximum's.
    block_owner: HashMap<UOp, UOp>,
}

impl Groups {
    /// The groups of `body`.
    pub(super) fn of(body: &UOp) -> Groups {
        let topo = UOp::toposort(std::slice::from_ref(body));
        let sums: Vec<(UOp, OnlineSum)> =
            topo.iter().filter_map(|u| OnlineSum::of(u).map(|o| (u.clone(), o))).collect();
        let mut readers: HashMap<UOp, HashSet<UOp>> = HashMap::new();
        for (_, o) in &sums {
            if readers.contains_key(&o.max) {
                continue;
            }
            let mut set = HashSet::from([o.max.clone()]);
            for u in &topo {
                if !matches!(u.op(), Op::Reduce { .. }) && u.src().iter().any(|s| set.contains(s)) {
                    set.insert(u.clone());
                }
            }
            readers.insert(o.max.clone(), set);
        }
        let mut owner = HashMap::new();
        for (s, o) in &sums {
            let cone = UOp::toposort(std::slice::from_ref(&o.summand));
            let waits_for_member =
                cone.iter().any(|c| c != s && OnlineSum::of(c).is_some_and(|other| other.max == o.max));
            owner.insert(s.clone(), if waits_for_member { s.clone() } else { o.max.clone() });
        }
        Groups { readers, owner, block_owner: HashMap::new() }
    }

    /// The node whose loop reduce `u` runs in: a block sum's group marker, else `u` itself.
    pub(super) fn loop_owner(&self, u: &UOp) -> UOp {
        self.block_owner.get(u).cloned().unwrap_or_else(|| u.clone())
    }

    /// Whether `u` reads `max` within its group (so it is evaluated under `max`'s scope).
    pub(super) fn reads(&self, u: &UOp, max: &UOp) -> bool {
        self.readers.get(max).is_some_and(|r| r.contains(u))
    }

    fn is_grouped_max(&self, u: &UOp) -> bool {
        self.readers.contains_key(u)
    }
}

impl Ctx {
    /// The reduce over blocks of `width` of `src`'s last axis: the block maximum of a
    /// maximum's input, or (with `sum_of`, the group's maximum) the block sum of a summand,
    /// registered so that it reads the running maximum and shares its group's block-sum loop.
    fn block_reduce(&mut self, src: &UOp, width: usize, sum_of: Option<&UOp>) -> UOp {
        let mut shape = src.shape().to_vec();
        let n = shape.pop().unwrap_or(1);
        shape.extend([n / width, width]);
        let d = src.dtype();
        let blocked = UOp::new(Op::Reshape(shape), d, vec![src.clone()]);
        let op = if sum_of.is_some() { ReduceOp::Add } else { ReduceOp::Max };
        let reduce = UOp::new(Op::Reduce { op, axes: 1 }, d, vec![blocked.clone()]);
        if let Some(max) = sum_of {
            if let Some(r) = self.groups.readers.get_mut(max) {
                r.insert(blocked);
            }
            // One marker per group owns the loop all its block sums share.
            let marker = UOp::new(
                Op::Reshape(vec![1]),
                max.dtype(),
                vec![UOp::new(Op::Reshape(vec![]), max.dtype(), vec![max.clone()])],
            );
            self.groups.block_owner.insert(reduce.clone(), marker);
        }
        reduce
    }

    /// The children of the nodes lowering treats specially, or `None` for the others: the
    /// maximum read under a scope (its input at the scope's loop index), an online sum (its
    /// summand under a fresh scope) and a grouped maximum read finished (its input in the
    /// group's loop).
    pub(super) fn online_children(
        &mut self,
        u: &UOp,
        index: &[UOp],
        scope: Option<&Scope>,
    ) -> Option<Vec<Key>> {
        // One key per unrolled copy of the loop index, each read under `scope`; for a long
        // axis, one key per block: the block's reduce of `src` (a max or a sum) at the block.
        let each =
            |ctx: &mut Ctx, owner: &UOp, ranges: Vec<UOp>, src: &UOp, scope: Option<Scope>| -> Vec<Key> {
                if let Some((blocks, width)) = block_of(u) {
                    let rb = ctx.loop_over(&[blocks], owner, ranges, 1).swap_remove(0);
                    // a maximum reads its block maxima; a sum, its block sums under its scope
                    let sum_of = if is_max(u) { None } else { scope.as_ref().map(|s| s.max.clone()) };
                    let inner = ctx.block_reduce(src, width, sum_of.as_ref());
                    return vec![(inner, index.iter().cloned().chain(rb).collect(), scope)];
                }
                ctx.reduce_loop(u, owner, ranges, online_unroll(u))
                    .into_iter()
                    .map(|r| (src.clone(), index.iter().cloned().chain(r).collect(), scope.clone()))
                    .collect()
            };
        if let Some(owner) = self.groups.block_owner.get(u).cloned() {
            // a block sum of a long group: its loop is shared by the group's block sums
            let unroll = self.opts.unroll.max(1);
            let input = u.as_reduce()?.input;
            return Some(
                self.reduce_loop(u, &owner, ranges_in(index), unroll)
                    .into_iter()
                    .map(|r| (input.clone(), index.iter().cloned().chain(r).collect(), scope.cloned()))
                    .collect(),
            );
        }
        if let Some(s) = scope.filter(|s| s.max == *u) {
            return Some(each(self, &s.owner, s.ranges.clone(), u.as_reduce()?.input, None));
        }
        if scope.is_some() {
            return None;
        }
        if let Some(o) = OnlineSum::of(u) {
            let owner = self.groups.owner[u].clone();
            let ranges = ranges_in(index);
            let s = Scope {
                max: o.max.clone(),
                owner: owner.clone(),
                ranges: ranges.clone(),
                at: index.to_vec(),
                old: false,
            };
            let summand_scope = self.groups.reads(&o.summand, &o.max).then_some(s);
            return Some(each(self, &owner, ranges, &o.summand, summand_scope));
        }
        if self.groups.is_grouped_max(u) {
            return Some(each(self, u, ranges_in(index), u.as_reduce()?.input, None));
        }
        None
    }

    /// The values of the nodes [`Ctx::online_children`] handles, from their children's values.
    pub(super) fn online_combine(
        &mut self,
        u: &UOp,
        index: &[UOp],
        scope: Option<&Scope>,
        vals: &[UOp],
    ) -> Result<Option<UOp>> {
        if let Some(s) = scope.filter(|s| s.max == *u) {
            let run = self.running_max(u, index, &s.owner, &s.ranges, &balanced(BinaryOp::Max, vals));
            self.read_at.insert(s.reader(), index.to_vec());
            return Ok(Some(if s.old { run.old } else { stand_in(&run.new) }));
        }
        if scope.is_some() {
            return Ok(None);
        }
        if let Some(o) = OnlineSum::of(u) {
            return self.online_sum(u, &o, index, &balanced(BinaryOp::Add, vals)).map(Some);
        }
        if self.groups.is_grouped_max(u) {
            let y = balanced(BinaryOp::Max, vals);
            return Ok(Some(self.running_max(u, index, u, &ranges_in(index), &y).finished));
        }
        Ok(None)
    }

    /// The running value of `max` at `index` in `owner`'s loop inside `ranges`, made on first
    /// use from `y`, the maximum's input at this iteration.
    fn running_max(&mut self, max: &UOp, index: &[UOp], owner: &UOp, ranges: &[UOp], y: &UOp) -> Running {
        let key = (max.clone(), owner.clone(), ranges.to_vec());
        if let Some(r) = self.running.get(&key).and_then(|rs| rs.iter().find(|r| r.index == index)) {
            return r.clone();
        }
        let dtype = max.dtype();
        let ident = ReduceOp::Max.identity(dtype);
        let real = self.loop_ranges(owner, ranges);
        let run = if real.is_empty() {
            let neg_inf = UOp::new(Op::Const(ident), dtype, vec![]);
            Running { index: index.to_vec(), old: neg_inf, new: y.clone(), end: None, finished: y.clone() }
        } else {
            let (acc0, accl) = self.accumulator(dtype, ident, ranges, &real);
            let old = accl.index(0).load();
            let new = UOp::new(Op::Binary(BinaryOp::Max), dtype, vec![old.clone(), y.clone()]);
            let inner_first: Vec<UOp> = real.iter().rev().cloned().collect();
            let end = accl.index(0).store(new.clone()).end(&inner_first);
            let finished = acc0.after(std::slice::from_ref(&end)).index(0).load();
            Running { index: index.to_vec(), old, new, end: Some(end), finished }
        };
        self.running.entry(key).or_default().push(run.clone());
        run
    }

    /// The accumulator of online sum `u` at `index`, whose summand at this iteration (computed
    /// with the running maximum) is `term`: `acc * exp2(k * (g(m0) - g(m1))) + term` each
    /// iteration, the factor exactly 1 when the shift did not move (so a row whose shift stays
    /// at `-inf` does not turn `0 * NaN` into its sum).
    fn online_sum(&mut self, u: &UOp, o: &OnlineSum, index: &[UOp], term: &UOp) -> Result<UOp> {
        let owner = self.groups.owner[u].clone();
        let ranges = ranges_in(index);
        let real = self.loop_ranges(&owner, &ranges);
        if real.is_empty() {
            return Ok(term.clone());
        }
        let scope = Scope {
            max: o.max.clone(),
            owner: owner.clone(),
            ranges: ranges.clone(),
            at: index.to_vec(),
            old: false,
        };
        let run = self.read_at.get(&scope.reader()).and_then(|at| {
            let key = (o.max.clone(), owner.clone(), ranges.clone());
            self.running.get(&key)?.iter().find(|r| r.index == *at).cloned()
        });
        let dtype = u.dtype();
        let (acc0, accl) = self.accumulator(dtype, ConstValue::float(0.0), &ranges, &real);
        let acc = accl.index(0).load();
        let inner_first: Vec<UOp> = real.iter().rev().cloned().collect();
        let (rescaled, run_end) = match run {
            // The summand's reads of the maximum simplified away: a plain sum.
            None => (acc, None),
            Some(run) => {
                let g_old =
                    self.rangeify(&o.shift, run.index.clone(), Some(Scope { old: true, ..scope.clone() }))?;
                let g_new = self.rangeify(&o.shift, run.index.clone(), Some(scope))?;
                let bin = |op: BinaryOp, a: &UOp, b: &UOp| {
                    UOp::new(Op::Binary(op), dtype, vec![a.clone(), b.clone()])
                };
                let factor = bin(BinaryOp::Mul, &o.scale, &bin(BinaryOp::Sub, &g_old, &g_new)).exp2();
                let one = UOp::new(Op::Const(ConstValue::float(1.0)), dtype, vec![]);
                (bin(BinaryOp::Mul, &acc, &g_old.ne(&g_new).where_(&factor, one)), run.end.clone())
            }
        };
        let upd =
            accl.index(0).store(UOp::new(Op::Binary(BinaryOp::Add), dtype, vec![rescaled, term.clone()]));
        let mut ends = vec![upd.end(&inner_first)];
        ends.extend(run_end);
        Ok(acc0.after(&ends).index(0).load())
    }
}
