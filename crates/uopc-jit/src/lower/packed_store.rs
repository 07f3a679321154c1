//! Packed stores after a register tile: four scalar stores to consecutive elements, computed
//! from the lanes of the tile's F32X4 accumulators, become one vector computation and store.

use super::tile::{LANES, packable};
use super::*;
use std::collections::HashSet;
use uopc_ir::{IndexView, simplify_memo};

/// Four scalar stores to consecutive elements whose values are lanes of one F32X4 computation
/// over a register tile's vectors: stored as one vector at the last of the four.
pub(super) struct PackedStore {
    /// The stored values, lane order.
    values: [UOp; LANES],
    /// The INDEX of lane 0.
    index: UOp,
}

/// What [`Lowerer::plan_packed_stores`] found in a block.
#[derive(Default)]
pub(super) struct PackedStores {
    /// Position of the last of each group's stores -> the group.
    pub at: HashMap<usize, PackedStore>,
    /// Positions of statements the groups compute instead (the other stores, the scalar math
    /// only they use).
    pub skip: HashSet<usize>,
}

/// The lanes of one node of four isomorphic value trees.
enum LaneNode {
    /// The same node in every lane: computed once as a scalar, then splat.
    Shared,
    /// Lane `k` reads lane `k` of one register tile vector.
    TileLanes,
    /// Lane `k` loads element `i + k` of one buffer (`i` the index of lane 0).
    Contiguous,
    /// The same operation on lane-varying operands.
    Op,
}

impl Lowerer<'_, '_> {
    /// Groups of four stores in `body[from..]` (a block after a register tile's loop) that
    /// write consecutive elements from isomorphic value trees over the tile's vectors, e.g.
    /// `O[i + k] = O[i + k] * c + acc_k`: each becomes one F32X4 computation and store,
    /// instead of extracting the tile's lanes and computing four scalars.
    pub(super) fn plan_packed_stores(&self, body: &[Stmt], from: usize) -> PackedStores {
        let mut found = PackedStores::default();
        if self.tile_results.is_empty() {
            return found;
        }
        // Up to the next loop, which may write the tile's registers (its own plan follows it);
        // up to the first write of a tile register, too, which ends its vector's validity.
        let end = body
            .iter()
            .skip(from)
            .position(|s| match s {
                Stmt::Loop { .. } => true,
                Stmt::Op(u) => u.as_store().is_some_and(|st| {
                    self.register_of(st.index).is_some_and(|r| self.tile_results.contains_key(&r.as_u32()))
                }),
            })
            .map_or(body.len(), |e| from + e);
        let body = &body[..end];
        let mut pos: HashMap<&UOp, usize> = HashMap::new();
        for (p, s) in body.iter().enumerate().skip(from) {
            if let Stmt::Op(u) = s {
                pos.insert(u, p);
            }
        }
        let mut memo = HashMap::new();
        let mut diff = |a: &UOp, b: &UOp| simplify_memo(&(a - b), Default::default(), &mut memo);
        // Candidate stores: to memory, f32, their value reading some tile vector.
        let reads_tile = |l: &Self, v: &UOp| {
            UOp::toposort(std::slice::from_ref(v)).iter().any(|x| {
                x.as_load().is_some_and(|i| {
                    l.register_of(i).is_some_and(|r| l.tile_results.contains_key(&r.as_u32()))
                })
            })
        };
        let stores: Vec<(usize, &UOp)> = body
            .iter()
            .enumerate()
            .skip(from)
            .filter_map(|(p, s)| match s {
                Stmt::Op(u)
                    if u.as_store().is_some_and(|s| {
                        s.value.dtype() == DType::F32
                            && self.register_of(s.index).is_none()
                            && s.index.indexed_base().is_some()
                            && reads_tile(self, s.value)
                    }) =>
                {
                    Some((p, u))
                }
                _ => None,
            })
            .collect();
        let mut taken: HashSet<usize> = HashSet::new();
        let mut keep: HashSet<UOp> = HashSet::new();
        let mut group_stores: HashSet<UOp> = HashSet::new();
        for &(p0, s0) in &stores {
            if taken.contains(&p0) {
                continue;
            }
            let base = view_base(access(s0).base);
            // Lane of every other candidate relative to s0, when it is within a vector.
            let near: Vec<(i64, usize, &UOp)> = stores
                .iter()
                .filter(|(p, s)| !taken.contains(p) && view_base(access(s).base) == base)
                .filter_map(|&(p, s)| {
                    let d = diff(access(s).offset, access(s0).offset).const_int()?;
                    (d.abs() < LANES as i64).then_some((d, p, s))
                })
                .collect();
            let group = (-(LANES as i64 - 1)..=0).find_map(|start| {
                let lanes: Vec<(usize, &UOp)> = (start..start + LANES as i64)
                    .map(|d| near.iter().find(|(x, _, _)| *x == d).map(|&(_, p, s)| (p, s)))
                    .collect::<Option<_>>()?;
                Some(lanes)
            });
            let Some(group) = group else { continue };
            let Some(stores) = group.iter().map(|(_, s)| s.as_store()).collect::<Option<Vec<_>>>() else {
                continue;
            };
            let values: [UOp; LANES] = std::array::from_fn(|k| stores[k].value.clone());
            let index = stores[0].index.clone();
            let mut leaves = Vec::new();
            let mut shared = Vec::new();
            if !self.lanes_pack(&values, &mut leaves, &mut shared, &mut diff) {
                continue;
            }
            let last = group.iter().map(|(p, _)| *p).max().expect("four lanes");
            let first_store = group.iter().map(|(p, _)| *p).min().expect("four lanes");
            // Memory: the group's loads move down to `last`, its stores down to `last`.
            // Loads placed before the block part (e.g. before the tile's loop) would stay
            // scalar and live across it: such groups are left alone.
            let Some(leaf_pos) = leaves.iter().map(|l| pos.get(l).copied()).collect::<Option<Vec<usize>>>()
            else {
                continue;
            };
            let first_load = leaf_pos.into_iter().min().unwrap_or(first_store);
            let window = first_load.min(first_store)..=last;
            if body[window.clone()].iter().any(|s| matches!(s, Stmt::Loop { .. })) {
                continue;
            }
            if !self.window_is_safe(&body[window], &group, &leaves, &index, &mut diff) {
                continue;
            }
            taken.extend(group.iter().map(|(p, _)| *p));
            group_stores.extend(group.iter().map(|(_, s)| (*s).clone()));
            keep.extend(shared);
            // Lane 0's addresses are the vector accesses' addresses.
            keep.insert(index.clone());
            keep.extend(leaves.iter().step_by(LANES).filter_map(|l| l.memory_index().cloned()));
            found.at.insert(last, PackedStore { values, index });
        }
        if !found.at.is_empty() {
            mark_replaced(body, from, &group_stores, &keep, &mut found);
        }
        found
    }

    /// Whether a group's moves are safe: its loads move down to its last store and its stores
    /// join it there, so no other access in `window` (the statements from the group's first
    /// load or store to its last store) may see or change memory the move reorders.
    fn window_is_safe(
        &self,
        window: &[Stmt],
        group: &[(usize, &UOp)],
        leaves: &[UOp],
        index: &UOp,
        diff: &mut impl FnMut(&UOp, &UOp) -> UOp,
    ) -> bool {
        let own: HashSet<&UOp> = group.iter().map(|(_, s)| *s).collect();
        let leaf_set: HashSet<&UOp> = leaves.iter().collect();
        let Some(store_at) = index.as_index() else { return false };
        let store_base = view_base(store_at.base);
        let mut safe = true;
        for s in window {
            let Stmt::Op(u) = s else { continue };
            let Some(memory) = u.memory_index() else { continue };
            if self.register_of(memory).is_some() {
                continue;
            }
            if leaf_set.contains(u) {
                continue;
            }
            let Some(view) = memory.as_index() else { continue };
            let (ub, ui) = (view_base(view.base), view.offset);
            let outside = |d: UOp| {
                let (lo, hi) = d.bounds();
                hi < 0 || lo >= LANES as i64
            };
            if matches!(u.op(), Op::Store) {
                // Stores in the window must not write what the moved loads read, except
                // a lane's own element (read before it is written either way).
                // (`leaves` holds four lanes at a time, so a leaf's lane is its position
                // mod 4.)
                let own_lane = if own.contains(u) { diff(ui, store_at.offset).const_int() } else { None };
                for (n, leaf) in leaves.iter().enumerate() {
                    if view_base(access(leaf).base) != ub {
                        continue;
                    }
                    let d = diff(ui, access(leaf).offset);
                    let (lo, hi) = d.bounds();
                    let same_lane = own_lane == Some((n % LANES) as i64);
                    safe &= hi < 0 || lo > 0 || same_lane;
                }
                if !own.contains(u) && ub == store_base {
                    safe &= outside(diff(ui, store_at.offset));
                }
            } else if ub == store_base {
                // A load outside the group must not see the moved stores late.
                safe &= outside(diff(ui, store_at.offset));
            }
        }
        safe
    }

    /// Whether four value trees are lanes of one F32X4 computation; collects the lane loads
    /// of memory (`leaves`) and the shared nodes computed as scalars (`shared`).
    fn lanes_pack(
        &self,
        lanes: &[UOp; LANES],
        leaves: &mut Vec<UOp>,
        shared: &mut Vec<UOp>,
        diff: &mut impl FnMut(&UOp, &UOp) -> UOp,
    ) -> bool {
        match self.lane_node(lanes, diff) {
            None => false,
            Some(LaneNode::Shared) => {
                shared.push(lanes[0].clone());
                true
            }
            Some(LaneNode::TileLanes) => true,
            Some(LaneNode::Contiguous) => {
                leaves.extend(lanes.iter().cloned());
                true
            }
            // Generic over the op's sources: the lanes pack when each source position does.
            Some(LaneNode::Op) => (0..lanes[0].src().len())
                .all(|i| self.lanes_pack(&lanes.clone().map(|x| x.src()[i].clone()), leaves, shared, diff)),
        }
    }

    fn lane_node(&self, lanes: &[UOp; LANES], diff: &mut impl FnMut(&UOp, &UOp) -> UOp) -> Option<LaneNode> {
        let u = &lanes[0];
        if u.dtype() != DType::F32 {
            return None;
        }
        if lanes.iter().all(|x| x == u) {
            return Some(LaneNode::Shared);
        }
        if !lanes.iter().all(|x| x.op() == u.op() && x.src().len() == u.src().len()) || !packable(u) {
            return None;
        }
        if !matches!(u.op(), Op::Load) {
            return Some(LaneNode::Op);
        }
        let regs: Option<Vec<Variable>> =
            lanes.iter().map(|x| x.as_load().and_then(|i| self.register_of(i))).collect();
        if let Some(regs) = regs {
            let first = self.tile_results.get(&regs[0].as_u32())?;
            let same_vector = regs
                .iter()
                .enumerate()
                .all(|(k, r)| self.tile_results.get(&r.as_u32()).is_some_and(|t| t.0 == first.0 && t.1 == k));
            return same_vector.then_some(LaneNode::TileLanes);
        }
        let view = access(u);
        let base = view_base(view.base)?;
        let contiguous = lanes.iter().enumerate().all(|(k, x)| {
            x.as_load().is_some_and(|i| self.register_of(i).is_none())
                && view_base(access(x).base) == Some(base)
                && diff(access(x).offset, view.offset).const_int() == Some(k as i64)
        });
        contiguous.then_some(LaneNode::Contiguous)
    }

    /// Emits a [`PackedStore`]: the lanes' computation in F32X4, one vector store.
    pub(super) fn emit_packed_store(&mut self, plan: &PackedStore) -> Result<(), JitError> {
        let mut memo = HashMap::new();
        let v = self.packed(&plan.values, &mut memo)?;
        match self.address_parts(&plan.index)? {
            Ok((addr, offset)) => {
                self.b.ins().store(MemFlagsData::new().with_notrap(), v, addr, offset);
                Ok(())
            }
            Err(_) => Err(JitError::Internal("packed store to a register".into())),
        }
    }
}

/// Marks in `found.skip` the statements of `body[from..]` the packed groups compute instead:
/// the groups' other stores, and scalar math only they use (counted through every use in
/// `body`, nested loops included). `keep` lists what the groups still need as scalars.
fn mark_replaced(
    body: &[Stmt],
    from: usize,
    group_stores: &HashSet<UOp>,
    keep: &HashSet<UOp>,
    found: &mut PackedStores,
) {
    // Statements only the groups use are not emitted as scalars.
    let mut users: HashMap<UOp, usize> = HashMap::new();
    fn count(stmts: &[Stmt], users: &mut HashMap<UOp, usize>) {
        for s in stmts {
            match s {
                Stmt::Op(u) => {
                    for x in u.src() {
                        *users.entry(x.clone()).or_default() += 1;
                    }
                }
                Stmt::Loop { body, .. } => count(body, users),
            }
        }
    }
    count(body, &mut users);
    let mut dead: HashMap<UOp, usize> = HashMap::new();
    for (p, s) in body.iter().enumerate().skip(from).rev() {
        let Stmt::Op(u) = s else { continue };
        let is_group_store = group_stores.contains(u);
        let unused = !matches!(u.op(), Op::Store | Op::End | Op::Sink | Op::After | Op::Tile(_))
            && !keep.contains(u)
            && users.get(u).is_some_and(|&n| n > 0 && dead.get(u) == Some(&n));
        if is_group_store || unused {
            if !found.at.contains_key(&p) {
                found.skip.insert(p);
            }
            for x in u.src() {
                *dead.entry(x.clone()).or_default() += 1;
            }
        }
    }
}

/// The INDEX parts of a LOAD or STORE; a verified program addresses memory only through an
/// INDEX, so anything else is a broken invariant.
fn access(u: &UOp) -> IndexView<'_> {
    u.memory_index().and_then(UOp::as_index).expect("a verified LOAD or STORE goes through an INDEX")
}
