//! Splitting a loop into the pieces its body tells apart by division: a loop over `0..E`
//! whose body reads its index only whole or through `i / c` and `i % c`, for one constant `c`
//! that divides `E` into a few pieces, becomes one loop over `0..c` per piece `p`, with `i`
//! replaced by `p * c + i'`. Within a piece `i / c` is the constant `p` and `i % c` is `i'`,
//! so whatever the body selects by the piece folds away: the gradient of a concatenation (two
//! halves of a fused projection, each with its own formula) then computes each half's formula
//! on its own columns, instead of both everywhere plus a select, and the index arithmetic left
//! is linear (which the backend vectorizes).

use crate::analysis::written_bases;
use crate::builder::{range, sink};
use crate::simplify::simplify;
use crate::uop::{AxisType, BinaryOp, ConstValue, Op, UOp};
use std::collections::HashMap;

/// The most pieces one loop is split into: past a few, the copies of the body cost more in
/// code than the selects they save.
const MAX_PIECES: usize = 4;

/// `program` with every loop split into the pieces its body tells apart by division: a `Loop`
/// range over `0..E` whose body uses its index `i` through `i / c` and `i % c` for one constant
/// `c` (`E / c` pieces, 2 to 4), and perhaps by divisors of `c`, and whose iterations are independent (no tile op, nothing read
/// that the body writes), becomes one loop over `0..c` per piece `p` with `i = p c + i'`, its
/// body simplified (`i / c` is `p`, `i % c` is `i'`, selects on constants taken). Other loops
/// stay as they are. The result computes the same values with the same stores.
#[must_use]
pub fn split_loops_at_divisors(program: &UOp) -> UOp {
    let nodes = UOp::toposort(std::slice::from_ref(program));
    let mut next_id = nodes.iter().filter_map(|u| u.as_range().map(|r| r.id.index() + 1)).max().unwrap_or(0);
    // A range some node other than index arithmetic reads (an AFTER's dependency, a cast), or
    // that more than one END closes (one loop holding several effects), is left whole.
    let mut ends: HashMap<&UOp, usize> = HashMap::new();
    let mut other_use: Vec<&UOp> = Vec::new();
    for u in &nodes {
        for (k, s) in u.src().iter().enumerate() {
            if s.as_range().is_none() {
                continue;
            }
            match u.op() {
                Op::End if k == 1 => *ends.entry(s).or_default() += 1,
                Op::Binary(_) => {}
                _ => other_use.push(s),
            }
        }
    }
    let whole = |r: &UOp| ends.get(r) != Some(&1) || other_use.contains(&r);
    let mut map: HashMap<UOp, UOp> = HashMap::new();
    for u in &nodes {
        let rebuilt = u.with_src(u.src().iter().map(|s| map[s].clone()).collect());
        let split = u.as_end().filter(|end| !whole(end.range)).and(rebuilt.as_end()).and_then(|end| {
            let (extent, divisor) = splittable(end.body, end.range)?;
            let pieces: Vec<UOp> = (0..extent / divisor)
                .map(|p| {
                    let piece = range(divisor as i64, next_id, AxisType::Loop);
                    next_id += 1;
                    let index = &piece + (p * divisor) as i64;
                    let body = simplify(&replace(end.body, end.range, &index, &mut next_id));
                    fold_constant_selects(&body).end(&[piece])
                })
                .collect();
            Some(sink(&pieces))
        });
        map.insert(u.clone(), split.unwrap_or(rebuilt));
    }
    map[program].clone()
}

/// The trip count of `range` and the divisor its uses in `body` split it by, when `range` is a
/// `Loop` of constant extent whose index `body` divides or takes the remainder of by constants
/// of which the largest, `c`, is a multiple of every other and divides the extent into 2 to
/// [`MAX_PIECES`] pieces, and
/// the iterations are independent: `body` runs no tile op and reads nothing it writes (so no
/// value flows from one iteration to the next, and the pieces may run in any order).
fn splittable(body: &UOp, range: &UOp) -> Option<(usize, usize)> {
    let r = range.as_range()?;
    let extent = usize::try_from(r.end.const_int()?).ok()?;
    if r.axis != AxisType::Loop {
        return None;
    }
    let nodes = UOp::toposort(std::slice::from_ref(body));
    let written = written_bases(&nodes);
    let reads_written = nodes.iter().any(|u| {
        matches!(u.op(), Op::Load)
            && u.src().first().and_then(UOp::indexed_base).is_some_and(|b| written.contains(b))
    });
    if reads_written || nodes.iter().any(|u| matches!(u.op(), Op::Tile(_))) {
        return None;
    }
    let mut divisors: Vec<usize> = Vec::new();
    for u in nodes {
        if let Op::Binary(BinaryOp::IDiv | BinaryOp::Mod) = u.op()
            && u.src()[0] == *range
        {
            divisors.push(usize::try_from(u.src()[1].const_int()?).ok()?);
        }
    }
    // The pieces are cut at the largest divisor; a smaller one that divides it reads within a
    // piece as the piece's own index divided by it (a head's columns inside a projection's
    // third), any other would straddle the cuts.
    let c = divisors.iter().copied().max()?;
    let nested = divisors.iter().all(|&d| d > 0 && c.is_multiple_of(d));
    (nested && c > 1 && extent.is_multiple_of(c) && (2..=MAX_PIECES).contains(&(extent / c)))
        .then_some((extent, c))
}

/// `u` with every select whose condition is a constant replaced by the side it takes (the
/// piece's own index folds the concatenation's conditions to constants, which the index
/// simplifier leaves in their selects).
fn fold_constant_selects(u: &UOp) -> UOp {
    let mut map: HashMap<UOp, UOp> = HashMap::new();
    for n in UOp::toposort(std::slice::from_ref(u)) {
        let src: Vec<UOp> = n.src().iter().map(|s| map[s].clone()).collect();
        let new = match (n.op(), src.as_slice()) {
            (Op::Where, [cond, a, b]) => match cond.const_value() {
                Some(ConstValue::Bool(c)) => {
                    if c {
                        a.clone()
                    } else {
                        b.clone()
                    }
                }
                _ => n.with_src(src),
            },
            _ => n.with_src(src),
        };
        map.insert(n, new);
    }
    map[u].clone()
}

/// `body` with every use of `range` replaced by `index`, and every range the body opens itself
/// renumbered from `next_id` on (each piece's inner loops are loops of their own).
fn replace(body: &UOp, range: &UOp, index: &UOp, next_id: &mut usize) -> UOp {
    let nodes = UOp::toposort(std::slice::from_ref(body));
    // The loops the body opens: those an END inside it closes (outer ones are only read).
    let opened: Vec<&UOp> = nodes.iter().filter_map(|u| u.as_end().map(|e| e.range)).collect();
    let mut map: HashMap<UOp, UOp> = HashMap::new();
    for u in nodes.iter().cloned() {
        let src: Vec<UOp> = u.src().iter().map(|s| map[s].clone()).collect();
        let new = match u.as_range() {
            _ if u == *range => index.clone(),
            Some(inner) if opened.contains(&&u) => {
                *next_id += 1;
                crate::builder::range(src[0].clone(), *next_id - 1, inner.axis)
            }
            _ => u.with_src(src),
        };
        map.insert(u, new);
    }
    map[body].clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostBuffer;
    use crate::builder::buffer;
    use crate::dtype::DType;
    use crate::interp::{self, Precision};

    /// `out[r, j] = j < 3 ? 2 x[r, j % 3] : x[r, j % 3] + 1` over 4 rows of 6: a concatenation.
    fn concatenation() -> UOp {
        let (x, out) = (buffer(0, DType::F32, 12), buffer(1, DType::F32, 24));
        let (r, j) = (range(4, 0, AxisType::Thread), range(6, 1, AxisType::Loop));
        let v = x.index(&r * 3 + &(&j % 3)).load();
        let value = (&j / 3).lt(1).where_(&v * 2.0f32, &v + 1.0f32);
        sink(&[out.index(&r * 6 + &j).store(value).end(&[j, r])])
    }

    /// The bits of the `out_len` floats `program` writes to slot 1 from `x` in slot 0.
    fn outputs(program: &UOp, x: Vec<f32>, out_len: usize) -> Vec<u32> {
        let mut bufs = vec![HostBuffer::F32(x), HostBuffer::F32(vec![0.0; out_len])];
        interp::run(program, &mut bufs, Precision::Native).unwrap();
        match &bufs[1] {
            HostBuffer::F32(v) => v.iter().map(|f| f.to_bits()).collect(),
            _ => unreachable!("an f32 buffer"),
        }
    }

    /// [`outputs`] of [`concatenation`]'s buffers.
    fn run(program: &UOp) -> Vec<u32> {
        outputs(program, (0..12).map(|i| i as f32 * 0.5 - 2.0).collect(), 24)
    }

    #[test]
    fn a_concatenation_splits_into_pieces_without_selects_or_division() {
        let program = concatenation();
        let split = split_loops_at_divisors(&program);
        assert_eq!(run(&split), run(&program));
        let nodes = UOp::toposort(std::slice::from_ref(&split));
        let count = |f: &dyn Fn(&Op) -> bool| nodes.iter().filter(|u| f(u.op())).count();
        assert_eq!(count(&|op| matches!(op, Op::Range { axis: AxisType::Loop, .. })), 2, "two pieces");
        assert_eq!(count(&|op| matches!(op, Op::Where)), 0, "the select folded");
        assert_eq!(count(&|op| matches!(op, Op::Binary(BinaryOp::IDiv | BinaryOp::Mod))), 0);
        crate::verify(&split).unwrap();
    }

    #[test]
    fn each_piece_opens_its_own_inner_loops() {
        // out[i, k] = x[(i % 2) * 3 + k] + (i / 2): the split loop holds a loop of its own.
        let (x, out) = (buffer(0, DType::F32, 6), buffer(1, DType::F32, 18));
        let (i, k) = (range(6, 0, AxisType::Loop), range(3, 1, AxisType::Loop));
        let value = x.index(&(&i % 2) * 3 + &k).load() + x.index(&i / 2).load();
        let program = sink(&[out.index(&i * 3 + &k).store(value).end(&[k, i])]);
        let split = split_loops_at_divisors(&program);
        assert_ne!(split, program);
        crate::verify(&split).unwrap();
        let run = |p: &UOp| outputs(p, (0..6).map(|v| v as f32).collect(), 18);
        assert_eq!(run(&split), run(&program));
    }

    #[test]
    fn a_loop_closed_twice_or_read_beyond_its_index_is_kept() {
        let (x, out) = (buffer(0, DType::F32, 12), buffer(1, DType::F32, 12));
        let j = range(6, 0, AxisType::Loop);
        let halves = x.index(&j % 3).load();
        // Two ENDs close `j` (one loop, two effects).
        let a = out.index(&j).store(halves.clone()).end(std::slice::from_ref(&j));
        let b = out.index(&j + 6i64).store(halves.clone()).end(std::slice::from_ref(&j));
        let twice = sink(&[a, b]);
        assert_eq!(split_loops_at_divisors(&twice), twice);
        // `j` read as a value (cast), beside its division.
        let value = &halves + &j.cast(DType::F32);
        let cast = sink(&[out.index(&j).store(value).end(std::slice::from_ref(&j))]);
        assert_eq!(split_loops_at_divisors(&cast), cast);
    }

    #[test]
    fn a_divisor_of_the_cut_reads_within_each_piece() {
        // out[r, j] over 0..12 = j < 6 ? x[(j / 2) % 3] : 2 x[j % 2] + r: heads of 2 inside
        // thirds of 6, as a projection's gradient concatenates them; cut at 6, the divisor 2
        // stays.
        let (x, out) = (buffer(0, DType::F32, 6), buffer(1, DType::F32, 24));
        let (r, j) = (range(2, 0, AxisType::Thread), range(12, 1, AxisType::Loop));
        let first = x.index(&(&j / 2) % 3).load();
        let second = x.index(&j % 2).load() * 2.0f32 + r.cast(DType::F32);
        let value = (&j / 6).lt(1).where_(first, second);
        let program = sink(&[out.index(&r * 12 + &j).store(value).end(&[j, r])]);
        let split = split_loops_at_divisors(&program);
        crate::verify(&split).unwrap();
        let nodes = UOp::toposort(std::slice::from_ref(&split));
        let loops = nodes.iter().filter(|u| matches!(u.op(), Op::Range { axis: AxisType::Loop, .. })).count();
        assert_eq!(loops, 2, "two pieces");
        assert_eq!(nodes.iter().filter(|u| matches!(u.op(), Op::Where)).count(), 0, "the select folded");
        let run = |p: &UOp| outputs(p, (0..6).map(|v| v as f32 * 1.5 - 2.0).collect(), 24);
        assert_eq!(run(&split), run(&program));
    }

    #[test]
    fn loops_without_one_divisor_are_kept() {
        let (x, out) = (buffer(0, DType::F32, 24), buffer(1, DType::F32, 24));
        let j = range(24, 0, AxisType::Loop);
        // Two divisors neither of which divides the other, then a divisor giving 12 pieces,
        // then none.
        let two = x.index(&(&j % 4) + &(&j / 6)).load();
        let many = x.index(&j % 2).load();
        for value in [two, many, x.index(&j).load()] {
            let program = sink(&[out.index(&j).store(value).end(std::slice::from_ref(&j))]);
            assert_eq!(split_loops_at_divisors(&program), program);
        }
    }
}
