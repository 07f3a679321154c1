//! [`simplify_program`]: simplification of a whole loop program, which keeps every load of
//! memory the program writes, and every store, in the loops it was written in.

use super::simplify_memo;
use crate::analysis::written_bases;
use crate::linearize::open_ranges_with;
use crate::uop::UOp;
use std::collections::{HashMap, HashSet};

/// [`simplify`](super::simplify) for a loop program: the same values, and the same memory
/// effects in the same order.
///
/// The linearizer places a node in the innermost loop among the ranges it mentions, and
/// rewriting an index to an equal value can drop a range from it (`r * 0`, or any use of a
/// range of one trip, whose uses fold to 0). For a load of memory nothing writes that only
/// hoists invariant work; for a load of a BUFFER or ALLOC the program writes it would read
/// the memory once, before the loop it left, and miss what that loop's earlier iterations
/// stored. So every such load that lost a range reads through an AFTER of its view on the
/// ranges it lost, which keeps it where the program as written reads it (the linearizer
/// still orders it before the stores through the view it wraps). A STORE that lost a range
/// likewise writes through an AFTER of its view on it: left outside, it would run even where
/// the loop runs zero times, and before the loop's other stores to the same element rather
/// than after them. A program without either is exactly [`simplify`](super::simplify)'s
/// result.
///
/// A program whose ranges cannot be computed (a malformed END) is simplified as an
/// expression; [`crate::verify_simplified`] then reports it.
#[must_use]
pub fn simplify_program(program: &UOp) -> UOp {
    let mut memo = HashMap::new();
    let simplified = simplify_memo(program, Default::default(), &mut memo);
    let topo = UOp::toposort(std::slice::from_ref(program));
    let pins = lost_ranges(&topo, &simplified, &memo);
    if pins.is_empty() {
        return simplified;
    }
    let pinned = pin_accesses(&topo, &pins);
    let again = simplify_memo(&pinned, Default::default(), &mut memo);
    debug_assert!(
        lost_ranges(&UOp::toposort(std::slice::from_ref(&pinned)), &again, &memo).is_empty(),
        "a pinned access keeps every range it had"
    );
    again
}

/// For each STORE of `topo` (the program as written), and each LOAD through a view of a
/// BUFFER or ALLOC the program writes, the ranges it mentions that its simplification (through
/// `memo`, in the graph of `simplified`) no longer mentions; those that lost none are left out.
fn lost_ranges(topo: &[UOp], simplified: &UOp, memo: &HashMap<UOp, UOp>) -> HashMap<UOp, Vec<UOp>> {
    let written: HashSet<UOp> = written_bases(topo).into_iter().collect();
    let pinnable = |u: &UOp| {
        u.as_store().is_some() || u.as_load().and_then(UOp::indexed_base).is_some_and(|b| written.contains(b))
    };
    if !topo.iter().any(pinnable) {
        return HashMap::new();
    }
    let simplified_topo = UOp::toposort(std::slice::from_ref(simplified));
    let (Ok(before), Ok(after)) = (open_ranges_with(topo, true), open_ranges_with(&simplified_topo, true))
    else {
        return HashMap::new();
    };
    let mut lost = HashMap::new();
    for access in topo.iter().filter(|u| pinnable(u)) {
        // An access that simplification dropped is not placed at all.
        let Some(now) = memo.get(access).and_then(|s| after.get(s)) else { continue };
        let gone: Vec<UOp> = before[access]
            .iter()
            .filter(|r| memo.get(*r).is_none_or(|r2| !now.contains(r2)))
            .cloned()
            .collect();
        if !gone.is_empty() {
            lost.insert(access.clone(), gone);
        }
    }
    lost
}

/// The program of `topo` (sources first, the program last) with each LOAD of `pins` reading,
/// and each STORE writing, through an AFTER of its view on its ranges there.
fn pin_accesses(topo: &[UOp], pins: &HashMap<UOp, Vec<UOp>>) -> UOp {
    let mut rebuilt: HashMap<&UOp, UOp> = HashMap::with_capacity(topo.len());
    for u in topo {
        let src: Vec<UOp> = u.src().iter().map(|s| rebuilt[s].clone()).collect();
        let mut v = u.with_src(src);
        if let Some(ranges) = pins.get(u) {
            let index = v.memory_index().expect("only LOADs and STOREs are pinned");
            let ranges: Vec<UOp> = ranges.iter().map(|r| rebuilt[r].clone()).collect();
            // A view that is not an INDEX is the verifier's to report.
            if let Some(view) = index.as_index() {
                let pinned_index = index.with_src(vec![view.base.after(&ranges), view.offset.clone()]);
                let mut src = v.src().to_vec();
                src[0] = pinned_index;
                v = v.with_src(src);
            }
        }
        rebuilt.insert(u, v);
    }
    rebuilt[topo.last().expect("a program has a node")].clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{buffer, idx, range, sink};
    use crate::dtype::DType;
    use crate::linearize::Stmt;
    use crate::uop::{AxisType, Op};
    use crate::verify::{verify, verify_simplified};

    /// `(loop depth, buffer slot)` of every LOAD of the linearization of `program`, a
    /// simplified program, in execution order; and whether each load of `slot` comes before
    /// the store to it in the same loop body.
    fn loads(program: &UOp) -> Vec<(usize, String)> {
        let linear = verify_simplified(program).expect("verifies");
        linear
            .walk()
            .into_iter()
            .filter_map(|(depth, s)| match s {
                Stmt::Op(u) if matches!(u.op(), Op::Load | Op::Store) => {
                    Some((depth, u.op().name().to_lowercase()))
                }
                _ => None,
            })
            .collect()
    }

    fn pairs(list: &[(usize, &str)]) -> Vec<(usize, String)> {
        list.iter().map(|(d, s)| (*d, s.to_string())).collect()
    }

    /// `for r0 in 0..3 { for r1 in 0..1 { b[r0 + r1] = b[r1 * 2] + 1 } }`: iteration r0 = 1
    /// reads the b[0] that iteration 0 stored. `r1 * 2` folds to 0, and the load, mentioning
    /// no range any more, would be read once before the loops.
    #[test]
    fn a_load_of_written_memory_keeps_the_loop_a_one_trip_range_put_it_in() {
        let b = buffer(0, DType::F32, 4);
        let r0 = range(3, 0, AxisType::Loop);
        let r1 = range(1, 1, AxisType::Loop);
        let v = b.index(&r1 * 2).load();
        let p = sink(&[b.index(&r0 + &r1).store(v + 1.0f32).end(&[r1]).end(&[r0])]);
        verify(&p).expect("the program as written verifies");
        assert_eq!(loads(&crate::simplify(&p)), pairs(&[(0, "load"), (2, "store")]), "plain: hoisted");
        assert_eq!(loads(&simplify_program(&p)), pairs(&[(2, "load"), (2, "store")]));
    }

    /// `for r in 0..3 { b[r] = b[r * 0 + 1] * 2 }`: iteration 2 reads the b[1] that iteration
    /// 1 stored.
    #[test]
    fn a_load_of_written_memory_keeps_a_range_multiplied_by_zero() {
        let b = buffer(0, DType::F32, 3);
        let r = range(3, 0, AxisType::Loop);
        let times_zero = &r * &idx(0);
        let p = sink(&[b.index(&r).store(b.index(times_zero + 1).load() * 2.0f32).end(&[r])]);
        verify(&p).expect("the program as written verifies");
        assert_eq!(loads(&simplify_program(&p)), pairs(&[(1, "load"), (1, "store")]));
    }

    /// `for r0 in 0..2 { for r1 in 0..1 { x = b[r1]; b[r0] = 7; out[r0] = x } }`: the store
    /// does not depend on the load, so only the rule "loads through a view before stores
    /// through it" orders them, and it must hold for the pinned load too.
    #[test]
    fn a_pinned_load_still_comes_before_the_stores_through_its_view() {
        let (b, out) = (buffer(0, DType::F32, 2), buffer(1, DType::F32, 2));
        let r0 = range(2, 0, AxisType::Loop);
        let r1 = range(1, 1, AxisType::Loop);
        let x = b.index(&r1 + 0).load();
        let body = sink(&[b.index(&r0 + &r1).store(7.0f32), out.index(&r0 + &r1).store(x)]);
        let p = sink(&[body.end(&[r1]).end(&[r0])]);
        verify(&p).expect("the program as written verifies");
        let order = loads(&simplify_program(&p));
        assert_eq!(order.first(), Some(&(2, "load".to_string())), "{order:?}");
        assert_eq!(order.len(), 3);
    }

    /// `for r in 0..0 { out[r % 1] = 5; out[r % 1] = 7 }`, the second store ordered after the
    /// first through an AFTER (a fuzzed program's shape): both indices fold to 0, and the first
    /// store, reached only through that AFTER, was placed before the loop, so it ran although
    /// the loop runs no iteration.
    #[test]
    fn a_store_that_lost_its_range_stays_in_the_loop() {
        let out = buffer(0, DType::F32, 1);
        let r = range(0, 0, AxisType::Loop);
        let first = out.index(r.modulo(1)).store(5.0f32);
        let second = out.after(std::slice::from_ref(&first)).index(r.modulo(1)).store(7.0f32);
        let p = sink(&[second.end(&[r])]);
        verify(&p).expect("the program as written verifies");
        assert_eq!(loads(&crate::simplify(&p)), pairs(&[(0, "store"), (1, "store")]), "plain: hoisted");
        assert_eq!(loads(&simplify_program(&p)), pairs(&[(1, "store"), (1, "store")]));
    }

    #[test]
    fn loads_of_memory_nothing_writes_are_hoisted_as_before() {
        let (a, out) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 3));
        let (r0, r1) = (range(3, 0, AxisType::Loop), range(1, 1, AxisType::Loop));
        let p = sink(&[out.index(&r0 + &r1).store(a.index(&r1 * 2).load()).end(&[r1]).end(&[r0])]);
        assert_eq!(simplify_program(&p), crate::simplify(&p));
        assert_eq!(loads(&simplify_program(&p)), pairs(&[(0, "load"), (2, "store")]));
    }

    #[test]
    fn a_program_whose_loads_keep_their_ranges_is_plain_simplification() {
        // An in-place update: the load mentions r0, which stays.
        let b = buffer(0, DType::F32, 3);
        let r0 = range(3, 0, AxisType::Loop);
        let cell = b.index(&r0 + 0);
        let p = sink(&[cell.store(cell.load() * 2.0f32).end(&[r0])]);
        assert_eq!(simplify_program(&p), crate::simplify(&p));
    }
}
