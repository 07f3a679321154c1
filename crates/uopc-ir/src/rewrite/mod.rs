//! The rewrite engine: named rules, grouped in tables, applied to a UOp graph bottom-up.
//!
//! A [`Rule`] has a name, the ops it can match ([`Pattern`]) and a function that returns the
//! replacement of a node or `None`. A [`RuleTable`] is a named list of rules, so tables are data:
//! they can be listed, counted and tested one rule at a time. A [`Pass`] runs an ordered list of
//! tables over a graph:
//!
//! - nodes are visited bottom-up with an explicit stack (graphs are deep; no recursion), every
//!   source before its users and sources first to last, so new nodes are created in source order
//!   (the linearizer breaks ties by creation order);
//! - a node's sources are replaced by their rewritten forms, then the first rule (in table
//!   order, then rule order) that returns a different node replaces it; rules are indexed by op,
//!   so a node only tries the rules whose pattern names its op;
//! - with [`Revisit::Fixpoint`] the replacement is rewritten again, up to a bound of rounds, and
//!   nodes a rule built that are not yet rewritten are walked first; with [`Revisit::Never`] the
//!   first replacement stands as it is;
//! - results are memoized per node, and under [`Revisit::Fixpoint`] each result is recorded
//!   as its own rewrite, so a memo shared across calls stops at nodes already done.
//!
//! Every run counts how often each rule fired ([`RewriteStats`]); the counts also accumulate per
//! thread ([`rewrite_counts`]), and [`set_rewrite_trace`] prints each run's counts to stderr.

#[cfg(test)]
mod tests;
mod trace;

pub use trace::{
    RewriteStats, RuleHits, rewrite_counts, rewrite_trace, set_rewrite_trace, take_rewrite_counts,
};

use crate::alu::{BINARY_OPS, UNARY_OPS};
use crate::uop::{BinaryOp, Op, UOp, UnaryOp};
use std::collections::HashMap;
use std::fmt;
use std::mem::Discriminant;

/// The key rules are indexed by: the op's variant, with the ALU op for UNARY and BINARY.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum OpKey {
    /// A UNARY node of this op.
    Unary(UnaryOp),
    /// A BINARY node of this op.
    Binary(BinaryOp),
    /// Any other node of this `Op` variant (its arguments ignored).
    Other(Discriminant<Op>),
}

impl OpKey {
    /// The key of `op`.
    pub fn of(op: &Op) -> OpKey {
        match op {
            Op::Unary(u) => OpKey::Unary(*u),
            Op::Binary(b) => OpKey::Binary(*b),
            other => OpKey::Other(std::mem::discriminant(other)),
        }
    }
}

/// The nodes a rule can match, by op.
#[derive(Clone, Debug)]
pub enum Pattern {
    /// Every node.
    Any,
    /// Every ALU node: UNARY, BINARY, WHERE, CAST.
    Alu,
    /// Nodes with one of these keys.
    Ops(Vec<OpKey>),
}

impl Pattern {
    /// Nodes of one of `ops` (arguments of the ops are ignored: `Op::Range { .. }` with any id).
    pub fn ops(ops: &[Op]) -> Pattern {
        Pattern::Ops(ops.iter().map(OpKey::of).collect())
    }

    /// The keys this pattern names, or `None` for [`Pattern::Any`].
    fn keys(&self) -> Option<Vec<OpKey>> {
        match self {
            Pattern::Any => None,
            Pattern::Alu => {
                let mut k: Vec<OpKey> = UNARY_OPS.iter().map(|&u| OpKey::Unary(u)).collect();
                k.extend(BINARY_OPS.iter().map(|&b| OpKey::Binary(b)));
                k.push(OpKey::of(&Op::Where));
                k.push(OpKey::of(&Op::Cast));
                Some(k)
            }
            Pattern::Ops(k) => Some(k.clone()),
        }
    }
}

/// What a rule function may see besides the node: the pass's state and the rewrite so far.
pub struct RuleCx<'a, C> {
    /// The state the pass was run with.
    pub state: &'a mut C,
    original: &'a UOp,
    memo: &'a HashMap<UOp, UOp>,
}

impl<C> RuleCx<'_, C> {
    /// The node as it was in the graph, before its sources were rewritten.
    pub fn original(&self) -> &UOp {
        self.original
    }

    /// The rewritten form of `u`, if the walk has reached it.
    pub fn rewritten(&self, u: &UOp) -> Option<&UOp> {
        self.memo.get(u)
    }
}

/// A rule function that looks at the node alone.
pub type NodeFn = fn(&UOp) -> Option<UOp>;
/// A rule function that also uses the pass's state ([`RuleCx`]).
pub type CxFn<C> = fn(&UOp, &mut RuleCx<'_, C>) -> Option<UOp>;

enum Apply<C> {
    Node(NodeFn),
    Cx(CxFn<C>),
}

/// A named rewrite: `apply(node)` is the node's replacement, or `None` when the rule does not
/// apply. The node given has its sources rewritten already.
pub struct Rule<C = ()> {
    name: &'static str,
    pattern: Pattern,
    apply: Apply<C>,
}

impl<C> Rule<C> {
    /// A rule that looks only at the node.
    pub fn new(name: &'static str, pattern: Pattern, apply: NodeFn) -> Self {
        Rule { name, pattern, apply: Apply::Node(apply) }
    }

    /// A rule that also uses the pass's state.
    pub fn with_cx(name: &'static str, pattern: Pattern, apply: CxFn<C>) -> Self {
        Rule { name, pattern, apply: Apply::Cx(apply) }
    }

    /// The rule's name, unique within its table.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The ops the rule can match.
    pub fn pattern(&self) -> &Pattern {
        &self.pattern
    }

    /// Whether the pattern names `u`'s op.
    pub fn matches_op(&self, u: &UOp) -> bool {
        match self.pattern.keys() {
            None => true,
            Some(k) => k.contains(&OpKey::of(u.op())),
        }
    }

    fn call(&self, u: &UOp, cx: &mut RuleCx<'_, C>) -> Option<UOp> {
        match self.apply {
            Apply::Node(f) => f(u),
            Apply::Cx(f) => f(u, cx),
        }
    }
}

impl<C> fmt::Debug for Rule<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rule({}, {:?})", self.name, self.pattern)
    }
}

/// A named, ordered list of rules; earlier rules win. An optional guard must hold for a node
/// before any rule of the table is tried on it.
pub struct RuleTable<C = ()> {
    name: &'static str,
    rules: Vec<Rule<C>>,
    guard: Option<NodeGuard>,
}

/// A precondition on a node shared by every rule of a table.
pub type NodeGuard = fn(&UOp) -> bool;

impl<C> RuleTable<C> {
    /// A table of `rules`, tried in order.
    pub fn new(name: &'static str, rules: Vec<Rule<C>>) -> Self {
        RuleTable { name, rules, guard: None }
    }

    /// This table, trying its rules only on nodes for which `guard` holds.
    pub fn with_guard(mut self, guard: NodeGuard) -> Self {
        self.guard = Some(guard);
        self
    }

    /// The table's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The rules, in the order they are tried.
    pub fn rules(&self) -> &[Rule<C>] {
        &self.rules
    }

    /// The number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether the table has no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rule called `name`.
    pub fn rule(&self, name: &str) -> Option<&Rule<C>> {
        self.rules.iter().find(|r| r.name == name)
    }

    fn admits(&self, u: &UOp) -> bool {
        self.guard.is_none_or(|g| g(u))
    }
}

impl RuleTable<()> {
    /// One step at `u` (its sources taken as already rewritten): the first rule of this table
    /// whose pattern and guard admit `u` and that returns a different node, with that node.
    /// For testing rules one at a time; stateless tables only.
    pub fn first_rewrite(&self, u: &UOp) -> Option<(&'static str, UOp)> {
        if !self.admits(u) {
            return None;
        }
        let memo = HashMap::new();
        let mut cx = RuleCx { state: &mut (), original: u, memo: &memo };
        for r in self.rules.iter().filter(|r| r.matches_op(u)) {
            if let Some(n) = r.call(u, &mut cx) {
                return (n != *u).then_some((r.name, n));
            }
        }
        None
    }

    /// Rule `name` alone applied at `u` (pattern and the table's guard checked).
    pub fn apply_rule(&self, name: &str, u: &UOp) -> Option<UOp> {
        let r = self.rule(name)?;
        if !self.admits(u) || !r.matches_op(u) {
            return None;
        }
        let memo = HashMap::new();
        r.call(u, &mut RuleCx { state: &mut (), original: u, memo: &memo })
    }
}

/// Whether a rule's replacement is rewritten again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revisit {
    /// Rewrite each replacement again until no rule fires, at most `max_rounds` replacements
    /// per node (the bound stops rule sets that cycle).
    Fixpoint {
        /// Replacements per node at most.
        max_rounds: usize,
    },
    /// The first replacement is final: neither it nor the nodes it contains are rewritten.
    Never,
}

/// An ordered list of rule tables run over a graph; see the module documentation.
pub struct Pass<'t, C = ()> {
    name: &'static str,
    tables: Vec<&'t RuleTable<C>>,
    revisit: Revisit,
    /// Per op key, the rules to try, in order.
    index: HashMap<OpKey, Vec<RulePos>>,
    /// The rules with [`Pattern::Any`]: what a node whose key is not indexed tries.
    any: Vec<RulePos>,
}

/// A rule's position in a pass: (table, rule within the table).
type RulePos = (usize, usize);

impl<'t, C> Pass<'t, C> {
    /// A pass named `name` trying `tables` in order.
    pub fn new(name: &'static str, tables: Vec<&'t RuleTable<C>>, revisit: Revisit) -> Self {
        let mut order: Vec<(RulePos, Option<Vec<OpKey>>)> = Vec::new();
        for (t, table) in tables.iter().enumerate() {
            for (r, rule) in table.rules.iter().enumerate() {
                order.push(((t, r), rule.pattern.keys()));
            }
        }
        let mut index: HashMap<OpKey, Vec<RulePos>> = HashMap::new();
        let keys: Vec<OpKey> = order.iter().filter_map(|(_, k)| k.clone()).flatten().collect();
        for key in keys {
            if index.contains_key(&key) {
                continue;
            }
            let list = order
                .iter()
                .filter(|(_, k)| k.as_ref().is_none_or(|k| k.contains(&key)))
                .map(|(at, _)| *at)
                .collect();
            index.insert(key, list);
        }
        let any = order.iter().filter(|(_, k)| k.is_none()).map(|(at, _)| *at).collect();
        Pass { name, tables, revisit, index, any }
    }

    /// The pass's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The tables, in the order they are tried.
    pub fn tables(&self) -> &[&'t RuleTable<C>] {
        &self.tables
    }

    /// Rewrites the graph under `root`, recording every node's result in `memo` (which may hold
    /// results of earlier runs of this pass). Returns the new root and how often each rule fired.
    pub fn run(&self, root: &UOp, state: &mut C, memo: &mut HashMap<UOp, UOp>) -> (UOp, RewriteStats) {
        let hits = self.tables.iter().map(|t| vec![0; t.rules.len()]).collect();
        let mut walk = Walk { memo, hits, stack: vec![Frame::Visit(root.clone())] };
        while let Some(frame) = walk.stack.pop() {
            let (node, cur, round) = match frame {
                Frame::Visit(x) => {
                    if !walk.memo.contains_key(&x) {
                        walk.stack.push(Frame::Build(x.clone()));
                        // Sources pushed last to first, so they are rebuilt first to last.
                        walk.push_unvisited(&x);
                    }
                    continue;
                }
                Frame::Build(x) => {
                    if walk.memo.contains_key(&x) {
                        continue;
                    }
                    let cur = walk.with_rewritten_src(&x);
                    (x, cur, 0)
                }
                Frame::Resume { node, built, round } => (node, walk.with_rewritten_src(&built), round),
            };
            if let Some(cur) = self.settle(&mut walk, state, &node, cur, round) {
                // A fixpoint's result is its own rewrite, so later walks stop at it. A result of
                // a single replacement is not: a renaming (slot 2 becomes 1 while slot 1 becomes
                // 0) may produce a node the graph also holds, which must still be rewritten.
                if matches!(self.revisit, Revisit::Fixpoint { .. }) {
                    walk.memo.entry(cur.clone()).or_insert_with(|| cur.clone());
                }
                walk.memo.insert(node, cur);
            }
        }
        let stats = self.stats(&walk.hits);
        trace::record(&stats);
        (walk.memo[root].clone(), stats)
    }

    /// Rewrites `cur` (`node` with rewritten sources) until no rule fires, and returns its final
    /// form; or returns `None` after pushing the walk of nodes a rule built, with a
    /// [`Frame::Resume`] that continues the work.
    fn settle(
        &self,
        walk: &mut Walk<'_>,
        state: &mut C,
        node: &UOp,
        mut cur: UOp,
        mut round: usize,
    ) -> Option<UOp> {
        let max_rounds = match self.revisit {
            Revisit::Fixpoint { max_rounds } => max_rounds,
            Revisit::Never => 1,
        };
        while round < max_rounds {
            let Some(next) = self.step(walk, state, node, &cur) else { break };
            round += 1;
            let memo = &walk.memo;
            let done = |s: &UOp| memo.get(s) == Some(s) || s.src().is_empty();
            if self.revisit == Revisit::Never || next.src().iter().all(done) {
                cur = next;
                continue;
            }
            // A rule built new nodes: rewrite them first (everything below them is in the memo
            // already, so this walk is shallow), then continue with `next`.
            walk.stack.push(Frame::Resume { node: node.clone(), built: next.clone(), round });
            walk.push_unvisited(&next);
            return None;
        }
        Some(cur)
    }

    /// The first rule that replaces `cur` by a different node, counted in `walk.hits`.
    fn step(&self, walk: &mut Walk<'_>, state: &mut C, original: &UOp, cur: &UOp) -> Option<UOp> {
        let rules = self.index.get(&OpKey::of(cur.op())).unwrap_or(&self.any);
        let mut cx = RuleCx { state, original, memo: walk.memo };
        for &(t, r) in rules {
            let table = self.tables[t];
            if !table.admits(cur) {
                continue;
            }
            if let Some(next) = table.rules[r].call(cur, &mut cx) {
                if next == *cur {
                    return None;
                }
                walk.hits[t][r] += 1;
                return Some(next);
            }
        }
        None
    }

    fn stats(&self, hits: &[Vec<u64>]) -> RewriteStats {
        let mut out = RewriteStats { pass: self.name, hits: Vec::new() };
        for (t, table) in self.tables.iter().enumerate() {
            for (r, rule) in table.rules.iter().enumerate() {
                if hits[t][r] > 0 {
                    out.hits.push(RuleHits { table: table.name, rule: rule.name, count: hits[t][r] });
                }
            }
        }
        out
    }
}

enum Frame {
    /// Rewrite this node's sources, then the node.
    Visit(UOp),
    /// The node's sources are rewritten: rewrite the node.
    Build(UOp),
    /// A rule replaced `node` by `built`, whose sources are now rewritten: continue at `round`.
    Resume { node: UOp, built: UOp, round: usize },
}

/// The state of one [`Pass::run`].
struct Walk<'m> {
    memo: &'m mut HashMap<UOp, UOp>,
    /// Per table, per rule, replacements made.
    hits: Vec<Vec<u64>>,
    stack: Vec<Frame>,
}

impl Walk<'_> {
    fn push_unvisited(&mut self, u: &UOp) {
        for s in u.src().iter().rev() {
            if !self.memo.contains_key(s) {
                self.stack.push(Frame::Visit(s.clone()));
            }
        }
    }

    fn with_rewritten_src(&self, u: &UOp) -> UOp {
        u.with_src(u.src().iter().map(|s| self.memo[s].clone()).collect())
    }
}
