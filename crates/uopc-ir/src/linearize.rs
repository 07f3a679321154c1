//! The linearizer: turns a loop program (a SINK of effects) into a tree of ordered statements.
//!
//! Every node is placed in the innermost loop among the ranges it depends on, so loop-invariant
//! work stays outside. A range's enclosing loops are read from its END: `END(x, r)` depends on
//! exactly the ranges around `r`. Within one loop body, statements are ordered by data
//! dependencies, AFTER edges, and "loads through a view come before stores through it" (an AFTER
//! whose dependencies are all RANGEs counts as the view it wraps); among
//! statements free to go next, a store goes first (its value dies there), then the oldest.

use crate::error::{IrError, IrErrorKind};
use crate::uop::{AxisType, Op, UOp};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

/// One statement of a linearized program.
#[derive(Clone, Debug)]
pub enum Stmt {
    /// Evaluate this node (structural nodes like INDEX, AFTER and END evaluate to nothing).
    Op(UOp),
    /// A loop over `range` running `body` once per value.
    Loop {
        /// The RANGE node.
        range: UOp,
        /// Statements inside the loop, in order.
        body: Vec<Stmt>,
    },
}

/// A linearized program.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Top-level statements (run once per call).
    pub root: Vec<Stmt>,
    /// BUFFER nodes, sorted by slot.
    pub buffers: Vec<UOp>,
    /// ALLOC nodes, sorted by slot.
    pub allocs: Vec<UOp>,
    /// VAR nodes (scalar arguments), sorted by slot. Like BUFFERs they are not statements:
    /// a backend reads each once, before the first statement.
    pub vars: Vec<UOp>,
    /// CONST nodes used by the program.
    pub consts: Vec<UOp>,
    /// The THREAD range, if any (always a top-level loop).
    pub thread: Option<UOp>,
    /// For every RANGE, the ranges of its enclosing loops, outermost first.
    pub loop_paths: HashMap<UOp, Vec<UOp>>,
}

impl Linear {
    /// Every statement, depth first, with its loop depth.
    pub fn walk(&self) -> Vec<(usize, &Stmt)> {
        fn go<'a>(body: &'a [Stmt], depth: usize, out: &mut Vec<(usize, &'a Stmt)>) {
            for s in body {
                out.push((depth, s));
                if let Stmt::Loop { body, .. } = s {
                    go(body, depth + 1, out);
                }
            }
        }
        let mut out = Vec::new();
        go(&self.root, 0, &mut out);
        out
    }
}

fn is_hoisted(u: &UOp) -> bool {
    matches!(u.op(), Op::Buffer { .. } | Op::Alloc { .. } | Op::Var { .. } | Op::Const(_))
}

fn union(a: &[UOp], b: &[UOp]) -> Vec<UOp> {
    let mut v: Vec<UOp> = a.iter().chain(b.iter()).cloned().collect();
    v.sort();
    v.dedup();
    v
}

/// The ranges each node of `topo` lives inside (END removes the range it closes).
///
/// Strict: an END of a range its body does not use is an error (the user's mistake).
///
/// # Errors
///
/// [`crate::IrErrorKind::RangeNotOpen`] for such an END, and the structural errors of
/// [`open_ranges_with`].
///
/// # Panics
///
/// If `topo` is not closed and sources-first (a node before one of its sources, or a source
/// missing), as [`UOp::toposort`] returns it, or holds an END with fewer than two sources.
pub fn open_ranges(topo: &[UOp]) -> Result<HashMap<UOp, Vec<UOp>>, IrError> {
    open_ranges_with(topo, false)
}

/// For every STORE, the ranges of the ENDs around it (through SINKs and nested ENDs).
fn ranges_of_enclosing_ends(topo: &[UOp]) -> HashMap<UOp, Vec<UOp>> {
    let mut around: HashMap<UOp, Vec<UOp>> = HashMap::new();
    for u in topo.iter().rev() {
        let outer = around.get(u).cloned().unwrap_or_default();
        if let Some(end) = u.as_end() {
            let inner = union(&outer, std::slice::from_ref(end.range));
            let e = around.entry(end.body.clone()).or_default();
            *e = union(e, &inner);
        } else if matches!(u.op(), Op::Sink) {
            // A SINK groups effects: each runs inside whatever encloses the group.
            for s in u.src() {
                let e = around.entry(s.clone()).or_default();
                *e = union(e, &outer);
            }
        }
    }
    around.retain(|u, _| matches!(u.op(), Op::Store | Op::Tile(_)));
    around
}

/// [`open_ranges`]; `lenient` is for simplified programs, where rewriting may have removed a
/// range from the expressions of a body that still runs once per iteration (`r*0`, or a loop
/// of zero or one trips): every STORE then also lives inside the ranges of the ENDs around it,
/// so it stays in its loop.
///
/// # Errors
///
/// An [`IrError`] for an END that closes a range not open in its body (strict mode) or an END
/// whose second source is not a RANGE.
///
/// # Panics
///
/// If `topo` is not closed and sources-first, as [`UOp::toposort`] returns it, or holds an END
/// with fewer than two sources ([`UOp::end`] always gives it two).
pub fn open_ranges_with(topo: &[UOp], lenient: bool) -> Result<HashMap<UOp, Vec<UOp>>, IrError> {
    let forced = if lenient { ranges_of_enclosing_ends(topo) } else { HashMap::new() };
    let mut rng: HashMap<UOp, Vec<UOp>> = HashMap::with_capacity(topo.len());
    for u in topo {
        let mut r: Vec<UOp> = Vec::new();
        for s in u.src() {
            r = union(&r, &rng[s]);
        }
        if let Some(f) = forced.get(u) {
            r = union(&r, f);
        }
        match u.op() {
            Op::Range { .. } => r = union(&r, std::slice::from_ref(u)),
            Op::End => {
                let Some(end) = u.as_end() else {
                    return Err(IrError::new(IrErrorKind::Structure, u, "END needs a body and a RANGE"));
                };
                let closed = end.range;
                if !matches!(closed.op(), Op::Range { .. }) {
                    return Err(IrError::new(
                        IrErrorKind::Structure,
                        u,
                        "END's second source is not a RANGE",
                    ));
                }
                if !rng[end.body].contains(closed) && !lenient {
                    return Err(IrError::new(
                        IrErrorKind::RangeNotOpen,
                        u,
                        format!("ends {} which is not open in its body", closed.short()),
                    ));
                }
                r.retain(|x| x != closed);
            }
            _ => {}
        }
        rng.insert(u.clone(), r);
    }
    Ok(rng)
}

type BlockId = Option<UOp>;

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Key {
    Node(UOp),
    Loop(UOp),
}

impl Key {
    /// Among statements ready at once, stores go first (a store ends its value's life, so
    /// emitting it early keeps fewer values in registers), with the structural nodes that
    /// emit no code and may be all a store waits for; then creation order.
    fn priority(&self) -> (bool, u64) {
        match self {
            Key::Node(u) => {
                let early = matches!(u.op(), Op::Store | Op::Index | Op::After | Op::End | Op::Sink);
                (!early, u.id())
            }
            Key::Loop(u) => (true, u.id()),
        }
    }
}

struct Placement {
    path: HashMap<UOp, Vec<UOp>>, // range -> enclosing ranges, outermost first
    block: HashMap<UOp, BlockId>,
}

impl Placement {
    fn parent(&self, r: &UOp) -> BlockId {
        self.path[r].last().cloned()
    }
    fn depth(&self, b: &BlockId) -> usize {
        b.as_ref().map_or(0, |r| self.path[r].len() + 1)
    }
    /// The statement standing for `n` in ancestor block `anc`.
    fn rep(&self, n: &UOp, anc: &BlockId) -> Key {
        self.rep_from(self.block[n].clone(), Key::Node(n.clone()), anc)
    }
    /// The statement standing in `anc` for statement `k` of block `b`.
    fn rep_from(&self, mut b: BlockId, k: Key, anc: &BlockId) -> Key {
        if &b == anc {
            return k;
        }
        loop {
            let r = b.clone().expect("anc is an ancestor");
            let p = self.parent(&r);
            if &p == anc {
                return Key::Loop(r);
            }
            b = p;
        }
    }
    fn lca(&self, a: &BlockId, b: &BlockId) -> BlockId {
        let (mut a, mut b) = (a.clone(), b.clone());
        while self.depth(&a) > self.depth(&b) {
            a = self.parent(a.as_ref().unwrap());
        }
        while self.depth(&b) > self.depth(&a) {
            b = self.parent(b.as_ref().unwrap());
        }
        while a != b {
            a = self.parent(a.as_ref().unwrap());
            b = self.parent(b.as_ref().unwrap());
        }
        a
    }
}

/// The buffer view a LOAD or STORE goes through (the INDEX's first source), as
/// [`ordering_view`] sees it.
fn view_of(mem: &UOp) -> Option<&UOp> {
    mem.src().first().and_then(index_view)
}

/// The view an INDEX addresses, as [`ordering_view`] sees it.
fn index_view(index: &UOp) -> Option<&UOp> {
    index.as_index().map(|i| ordering_view(i.base))
}

/// `view` seen through the AFTERs whose dependencies are all RANGEs: such an AFTER only keeps
/// its users inside those loops and orders them after no store, so a load through it comes
/// before the stores through the view it wraps, as a load through that view would.
fn ordering_view(mut view: &UOp) -> &UOp {
    while let Some(after) = view.as_after()
        && !after.deps.is_empty()
        && after.deps.iter().all(|d| matches!(d.op(), Op::Range { .. }))
    {
        view = after.base;
    }
    view
}

/// Each loop's enclosing loops, outermost first.
type LoopPaths = HashMap<UOp, Vec<UOp>>;

/// The statements that store through each view.
type StoresByView = HashMap<UOp, Vec<UOp>>;

/// The loops of `topo` (its RANGEs, in topological order) and, for each, the loops around it,
/// outermost first, read from its END(s) (`rng`: the ranges open at each node).
///
/// # Errors
///
/// A RANGE never ended, closed in two loop nests, inside loops that do not nest, or whose end
/// uses a range that does not enclose it.
fn loop_nests(topo: &[UOp], rng: &HashMap<UOp, Vec<UOp>>) -> Result<(Vec<UOp>, LoopPaths), IrError> {
    // Enclosing ranges of each loop, from its END(s).
    let mut path: HashMap<UOp, Vec<UOp>> = HashMap::new();
    for u in topo {
        // Every END was checked above to close a RANGE.
        if let Some(end) = u.as_end() {
            let r = end.range;
            let p = rng[u].clone();
            match path.get(r) {
                Some(q) if *q != p => {
                    return Err(IrError::new(
                        IrErrorKind::Structure,
                        u,
                        format!("{} is closed in two different loop nests", r.short()),
                    ));
                }
                _ => {
                    path.insert(r.clone(), p);
                }
            }
        }
    }
    let ranges: Vec<UOp> = topo.iter().filter(|u| matches!(u.op(), Op::Range { .. })).cloned().collect();
    for r in &ranges {
        if !path.contains_key(r) {
            return Err(IrError::new(IrErrorKind::RangeNotEnded, r, "this RANGE is never closed by an END"));
        }
    }
    // Order each path outermost first and check it is a chain.
    let mut by_depth: Vec<UOp> = ranges.clone();
    by_depth.sort_by_key(|r| path[r].len());
    let mut ordered: HashMap<UOp, Vec<UOp>> = HashMap::new();
    for r in &by_depth {
        let p = &path[r];
        let mut chain: Vec<UOp> = Vec::new();
        if let Some(deep) = p.iter().max_by_key(|x| path[*x].len()) {
            // Properly nested, `deep` encloses fewer loops than `r` and was ordered before it.
            let Some(outer) = ordered.get(deep) else {
                return Err(IrError::new(
                    IrErrorKind::Structure,
                    r,
                    format!(
                        "the loops around this RANGE do not nest ({} is both inside and around it)",
                        deep.short()
                    ),
                ));
            };
            chain = outer.clone();
            chain.push(deep.clone());
            if union(&chain, &[]) != *p {
                return Err(IrError::new(
                    IrErrorKind::Structure,
                    r,
                    "the loops around this RANGE do not nest (its END depends on ranges that are siblings)",
                ));
            }
        }
        let Some(range) = r.as_range() else {
            return Err(IrError::new(IrErrorKind::Structure, r, "RANGE needs exactly one source, its end"));
        };
        if !rng[range.end].iter().all(|x| chain.contains(x)) {
            return Err(IrError::new(
                IrErrorKind::Structure,
                r,
                "the end of this RANGE uses a range that does not enclose it",
            ));
        }
        ordered.insert(r.clone(), chain);
    }
    Ok((ranges, ordered))
}

/// The loads through a view (with their view) and the stores through each view, counting a
/// tile op as a load of each operand it reads and a store of each it writes: within a block,
/// loads through a view come before stores through the same view.
fn view_accesses(topo: &[UOp]) -> (Vec<(UOp, UOp)>, StoresByView) {
    let mut stores_by_view: HashMap<UOp, Vec<UOp>> = HashMap::new();
    let mut loads: Vec<(UOp, UOp)> = Vec::new();
    for u in topo {
        match u.op() {
            Op::Store => {
                if let Some(v) = view_of(u) {
                    stores_by_view.entry(v.clone()).or_default().push(u.clone());
                }
            }
            Op::Load => {
                if let Some(v) = view_of(u) {
                    loads.push((u.clone(), v.clone()));
                }
            }
            Op::Tile(t) => {
                for (x, o) in u.src().iter().zip(t.operands()) {
                    let Some(v) = index_view(x) else { continue };
                    if o.writes {
                        stores_by_view.entry(v.clone()).or_default().push(u.clone());
                    }
                    if o.reads {
                        loads.push((u.clone(), v.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    (loads, stores_by_view)
}

/// Each block's statements in an order their dependency `edges` allow (Kahn's algorithm, ties
/// broken by `Key::priority`: stores first, then creation order).
///
/// # Errors
///
/// Statements of one block whose dependencies form a cycle.
fn order_blocks(
    members: &HashMap<BlockId, Vec<Key>>,
    edges: &HashMap<Key, Vec<Key>>,
    indeg: &HashMap<Key, usize>,
) -> Result<HashMap<BlockId, Vec<Key>>, IrError> {
    let mut order: HashMap<BlockId, Vec<Key>> = HashMap::new();
    for (b, keys) in members {
        let set: HashSet<&Key> = keys.iter().collect();
        let mut deg: HashMap<&Key, usize> =
            keys.iter().map(|k| (k, indeg.get(k).copied().unwrap_or(0))).collect();
        let mut heap: BinaryHeap<Reverse<((bool, u64), usize)>> = BinaryHeap::new();
        for (i, k) in keys.iter().enumerate() {
            if deg[k] == 0 {
                heap.push(Reverse((k.priority(), i)));
            }
        }
        let index: HashMap<&Key, usize> = keys.iter().enumerate().map(|(i, k)| (k, i)).collect();
        let mut out = Vec::with_capacity(keys.len());
        while let Some(Reverse((_, i))) = heap.pop() {
            let k = &keys[i];
            out.push(k.clone());
            for nx in edges.get(k).into_iter().flatten() {
                if !set.contains(nx) {
                    continue;
                }
                let d = deg.get_mut(nx).expect("member");
                *d -= 1;
                if *d == 0 {
                    heap.push(Reverse((nx.priority(), index[nx])));
                }
            }
        }
        if out.len() != keys.len() {
            let stuck = keys.iter().find(|k| !out.contains(k)).expect("some key is stuck");
            let node = match stuck {
                Key::Node(u) | Key::Loop(u) => u,
            };
            return Err(IrError::new(
                IrErrorKind::Structure,
                node,
                "statements in this loop cannot be ordered (cyclic dependencies)",
            ));
        }
        order.insert(b.clone(), out);
    }

    Ok(order)
}

/// Linearizes `program` (usually a SINK) into nested, ordered statements.
///
/// It does not check types or bounds; [`crate::verify`] does both and returns this same
/// linearization.
///
/// # Errors
///
/// An [`IrError`] for ranges that are not ended or ENDs of ranges not open, stores outside the
/// loops whose variables they use, loops that do not nest, and cyclic orderings.
///
/// # Examples
///
/// ```rust
/// use uopc_ir::{AxisType, DType, Stmt, buffer, linearize, range, sink};
///
/// let out = buffer(0, DType::F32, 4);
/// let k = range(4, 0, AxisType::Loop);
/// let linear = linearize(&sink(&[out.index(&k).store(0.5f32).end(&[k.clone()])]))?;
/// // One top-level loop over k, and the store one level down inside it.
/// assert!(matches!(&linear.root[0], Stmt::Loop { range, .. } if *range == k));
/// assert!(linear.walk().iter().any(|(depth, s)| {
///     *depth == 1 && matches!(s, Stmt::Op(u) if u.op().name() == "STORE")
/// }));
/// # Ok::<(), uopc_ir::IrError>(())
/// ```
pub fn linearize(program: &UOp) -> Result<Linear, IrError> {
    linearize_with(program, false)
}

/// [`linearize`] with [`open_ranges_with`]'s `lenient` placement, for simplified programs.
///
/// # Errors
///
/// As [`linearize`].
pub fn linearize_with(program: &UOp, lenient: bool) -> Result<Linear, IrError> {
    let topo = UOp::toposort(std::slice::from_ref(program));
    let rng = open_ranges_with(&topo, lenient)?;

    if let Some(r) = rng[program].first() {
        let culprit =
            topo.iter().find(|u| matches!(u.op(), Op::Store) && rng[*u].contains(r)).unwrap_or(program);
        let has_end = topo.iter().any(|u| u.as_end().is_some_and(|e| e.range == r));
        return Err(if has_end {
            IrError::new(
                IrErrorKind::StoreOutsideRange,
                culprit,
                format!("uses {} but is not inside any END that closes it", r.short()),
            )
        } else {
            IrError::new(IrErrorKind::RangeNotEnded, r, "this RANGE is never closed by an END")
        });
    }

    let (ranges, ordered) = loop_nests(&topo, &rng)?;
    let mut placement = Placement { path: ordered, block: HashMap::new() };

    // Place every statement node in its innermost range.
    let mut thread: Option<UOp> = None;
    for u in &topo {
        if let Op::Range { axis: AxisType::Thread, .. } = u.op() {
            if thread.is_some() {
                return Err(IrError::new(IrErrorKind::Structure, u, "a program may have one THREAD range"));
            }
            if !placement.path[u].is_empty() {
                return Err(IrError::new(
                    IrErrorKind::Structure,
                    u,
                    "the THREAD range must be the outermost loop",
                ));
            }
            thread = Some(u.clone());
        }
        if is_hoisted(u) || matches!(u.op(), Op::Range { .. }) {
            continue;
        }
        let rs = &rng[u];
        let deepest = rs.iter().max_by_key(|r| placement.path[*r].len()).cloned();
        if let Some(d) = &deepest {
            let mut allowed = placement.path[d].clone();
            allowed.push(d.clone());
            if let Some(bad) = rs.iter().find(|r| !allowed.contains(r)) {
                return Err(IrError::new(
                    IrErrorKind::Structure,
                    u,
                    format!("uses {} and {}, which are not nested loops", d.short(), bad.short()),
                ));
            }
        }
        placement.block.insert(u.clone(), deepest);
    }

    // Dependency edges between statements of one block.
    let mut members: HashMap<BlockId, Vec<Key>> = HashMap::new();
    let mut edges: HashMap<Key, Vec<Key>> = HashMap::new();
    let mut indeg: HashMap<Key, usize> = HashMap::new();
    let add_key = |b: BlockId, k: Key, members: &mut HashMap<BlockId, Vec<Key>>| {
        members.entry(b).or_default().push(k);
    };
    for r in &ranges {
        add_key(placement.parent(r), Key::Loop(r.clone()), &mut members);
    }
    for u in &topo {
        if placement.block.contains_key(u) {
            add_key(placement.block[u].clone(), Key::Node(u.clone()), &mut members);
        }
    }
    let mut edge_set: HashSet<(Key, Key)> = HashSet::new();
    let mut add_edge = |a: Key, b: Key| {
        if a != b && edge_set.insert((a.clone(), b.clone())) {
            edges.entry(a).or_default().push(b.clone());
            *indeg.entry(b).or_default() += 1;
        }
    };
    for u in &topo {
        let (consumer, cblock): (Key, BlockId) = if matches!(u.op(), Op::Range { .. }) {
            (Key::Loop(u.clone()), placement.parent(u))
        } else if let Some(b) = placement.block.get(u) {
            (Key::Node(u.clone()), b.clone())
        } else {
            continue;
        };
        for s in u.src() {
            if is_hoisted(s) || matches!(s.op(), Op::Range { .. }) {
                continue;
            }
            let sblock = placement.block[s].clone();
            let l = placement.lca(&sblock, &cblock);
            let to = placement.rep_from(cblock.clone(), consumer.clone(), &l);
            add_edge(placement.rep(s, &l), to);
        }
    }
    let (loads, stores_by_view) = view_accesses(&topo);
    for (u, v) in &loads {
        for st in stores_by_view.get(v).into_iter().flatten() {
            if st == u {
                continue;
            }
            let l = placement.lca(&placement.block[u], &placement.block[st]);
            add_edge(placement.rep(u, &l), placement.rep(st, &l));
        }
    }

    let order = order_blocks(&members, &edges, &indeg)?;

    Ok(assemble(&topo, &order, thread, placement.path))
}

/// The [`Linear`] of ordered blocks `order`: the nested statements from the outermost block,
/// and `topo`'s buffers, allocs and variables by slot and its constants.
fn assemble(
    topo: &[UOp],
    order: &HashMap<BlockId, Vec<Key>>,
    thread: Option<UOp>,
    loop_paths: LoopPaths,
) -> Linear {
    fn build(b: &BlockId, order: &HashMap<BlockId, Vec<Key>>) -> Vec<Stmt> {
        order
            .get(b)
            .map(|keys| {
                keys.iter()
                    .map(|k| match k {
                        Key::Node(u) => Stmt::Op(u.clone()),
                        Key::Loop(r) => Stmt::Loop { range: r.clone(), body: build(&Some(r.clone()), order) },
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
    let root = build(&None, order);

    let mut buffers: Vec<UOp> =
        topo.iter().filter(|u| matches!(u.op(), Op::Buffer { .. })).cloned().collect();
    buffers.sort_by_key(|u| match u.op() {
        Op::Buffer { slot, .. } => slot.index(),
        _ => 0,
    });
    let mut allocs: Vec<UOp> = topo.iter().filter(|u| matches!(u.op(), Op::Alloc { .. })).cloned().collect();
    allocs.sort_by_key(|u| match u.op() {
        Op::Alloc { slot, .. } => slot.index(),
        _ => 0,
    });
    let mut vars: Vec<UOp> = topo.iter().filter(|u| matches!(u.op(), Op::Var { .. })).cloned().collect();
    vars.sort_by_key(|u| match u.op() {
        Op::Var { slot, .. } => slot.index(),
        _ => 0,
    });
    let consts = topo.iter().filter(|u| matches!(u.op(), Op::Const(_))).cloned().collect();
    Linear { root, buffers, allocs, vars, consts, thread, loop_paths }
}
