//! Whether the iterations of a THREAD range write disjoint memory, so that they may run at
//! once: a symbolic test for accesses `c * t + r`, and an exhaustive one that enumerates each
//! iteration's footprint.

use super::written_bases;
use crate::formula::IndexFormula;
use crate::simplify::split_linear;
use crate::uop::{Op, UOp};
use crate::verify::view_base;
use std::collections::HashMap;

/// Whether different iterations of THREAD range `thread` write disjoint memory, so they may run
/// in parallel. `topo` is every node of the program ([`UOp::toposort`] of its SINK).
///
/// True when `thread` runs at most once, or when every access (load or store) to every written
/// BUFFER is `c * t + r` with `0 <= r < c`, for one stride `c` per buffer: then iteration `t`
/// only touches `[c*t, c*t + c)`. A tile operand covers `r .. r + extent`, which must stay below
/// `c` too. ALLOCs are not looked at: the verifier proved those written inside the THREAD range
/// are declared inside it, so each iteration has its own.
pub fn threads_write_disjoint(topo: &[UOp], thread: &UOp) -> bool {
    if thread.as_range().is_some_and(|r| r.end.vmax() <= 1) {
        return true; // one iteration cannot race with itself
    }
    strided_writes_disjoint(topo, thread) || enumerated_footprints_disjoint(topo, thread)
}

/// The BUFFERs some STORE or tile op among `topo` writes, each once.
fn written_buffers(topo: &[UOp]) -> Vec<UOp> {
    let mut written: Vec<UOp> = Vec::new();
    for b in written_bases(topo) {
        if matches!(b.op(), Op::Buffer { .. }) && !written.contains(&b) {
            written.push(b);
        }
    }
    written
}

/// The symbolic test of [`threads_write_disjoint`]: every access to a written buffer is
/// `c * t + r` with `0 <= r` and `r + extent <= c`.
fn strided_writes_disjoint(topo: &[UOp], thread: &UOp) -> bool {
    let mut stride: HashMap<UOp, i64> = HashMap::new();
    // A tile operand touches a block of elements from its INDEX on, not one element.
    let mut extent: HashMap<UOp, i64> = HashMap::new();
    for u in topo {
        if let Op::Tile(t) = u.op() {
            for (x, o) in u.src().iter().zip(t.operands()) {
                let e = extent.entry(x.clone()).or_insert(1);
                *e = (*e).max(o.extent as i64);
            }
        }
    }
    let written = written_buffers(topo);
    for u in topo {
        let Some(index) = u.as_index() else { continue };
        let Some(base) = view_base(index.base) else { continue };
        if !written.contains(base) {
            continue;
        }
        let Some((c, rest)) = split_linear(index.offset, thread) else { return false };
        let span = extent.get(u).copied().unwrap_or(1).max(1);
        if c <= 0 || rest.vmin() < 0 || rest.vmax().saturating_add(span - 1) >= c {
            return false;
        }
        if *stride.entry(base.clone()).or_insert(c) != c {
            return false;
        }
    }
    true
}

/// The most footprint rows (or walked points) [`enumerated_footprints_disjoint`] enumerates:
/// beyond it the answer is "not proven" (the program runs serially) rather than a slow compile.
const MAX_ENUMERATED_ROWS: usize = 1 << 20;

/// Rows, columns and row stride of the block of elements an access touches from its offset.
type Block = (usize, usize, usize);

/// The offset and footprint of a plain (non-tile) access at `offset` inside THREAD range
/// `thread`: `offset` as `f(thread) + s_r * r + s_c * c` over at most two inner loops `r < R`,
/// `c < C` of constant trip counts, with `s_c = 1` and `s_r >= C` when there are two (an
/// epilogue walking a `R x C` block of rows `s_r` apart) or any positive stride for one. The
/// footprint is the block `(R, C, s_r)`; `None` when the offset is of no such form.
fn loop_footprint(offset: &UOp, thread: &UOp) -> Option<(IndexFormula, Block)> {
    let mut inner: Vec<UOp> = offset.ranges_mentioned().into_iter().filter(|r| r != thread).collect();
    inner.sort();
    inner.dedup();
    let mut rest = offset.clone();
    // (stride, trip count) per inner loop.
    let mut loops: Vec<(usize, usize)> = Vec::new();
    for r in &inner {
        let trips = usize::try_from(r.as_range()?.end.const_int()?).ok()?;
        let (stride, without) = split_linear(&rest, r)?;
        rest = without;
        if trips > 1 {
            loops.push((usize::try_from(stride).ok().filter(|&s| s > 0)?, trips));
        }
    }
    let formula = IndexFormula::over_ranges(&rest, std::slice::from_ref(thread))?;
    loops.sort_unstable();
    let block = match loops.as_slice() {
        [] => (1, 1, 1),
        [(1, c)] => (1, *c, 1),
        [(stride, rows)] => (*rows, 1, *stride),
        [(1, c), (stride, rows)] if stride >= c => (*rows, *c, *stride),
        _ => return None,
    };
    Some((formula, block))
}

/// The exhaustive test of [`threads_write_disjoint`], for accesses the symbolic test cannot
/// split (a 2-D grid of GEMM tiles, whose offset is `(t / nb) * R + (t % nb) * C`): when every
/// access to a written buffer has an offset that depends on `thread` alone, or walks a block
/// in at most two inner loops from such an offset ([`loop_footprint`]), or walks rows whose
/// count or position the thread decides ([`walked_rows`]), and `thread` has a constant trip
/// count, each iteration's footprint (a tile operand's `rows x cols` block with its row
/// stride, the loops' block, the walked rows, or one element) is computed for every iteration
/// and the row intervals of different iterations are checked not to overlap.
fn enumerated_footprints_disjoint(topo: &[UOp], thread: &UOp) -> bool {
    let Some(trips) = thread.as_range().and_then(|r| r.end.const_int()) else { return false };
    let Ok(trips) = usize::try_from(trips) else { return false };
    // (rows, cols, row stride) of each tile operand, by its INDEX node.
    let mut blocks: HashMap<UOp, Block> = HashMap::new();
    for u in topo {
        if let Op::Tile(t) = u.op() {
            for (x, block) in u.src().iter().zip(t.blocks()) {
                blocks.insert(x.clone(), block);
            }
        }
    }
    let written = written_buffers(topo);
    // (start, end, iteration) of every row every access to a buffer touches, in element units.
    let mut per_buffer: HashMap<UOp, Vec<(i64, i64, usize)>> = HashMap::new();
    let mut budget = MAX_ENUMERATED_ROWS;
    for u in topo {
        let Some(index) = u.as_index() else { continue };
        let Some(base) = view_base(index.base) else { continue };
        if !written.contains(base) {
            continue;
        }
        let footprint = match blocks.get(u) {
            Some(&block) => IndexFormula::over_ranges(index.offset, std::slice::from_ref(thread))
                .map(|offset| (offset, block)),
            None => loop_footprint(index.offset, thread),
        };
        let rows = per_buffer.entry(base.clone()).or_default();
        let complete = match footprint {
            Some((offset, block)) => block_rows(&offset, block, trips, &mut budget, rows),
            None => walked_rows(index.offset, thread, trips, &mut budget, rows),
        };
        if !complete {
            return false;
        }
    }
    per_buffer.into_values().all(|mut rows| {
        rows.sort_unstable();
        // Sweep in start order, holding the furthest end seen and its iteration: a row of another
        // iteration starting before that end overlaps it.
        let mut reach: Option<(i64, usize)> = None;
        for &(start, end, t) in &rows {
            match reach {
                Some((far, owner)) if start < far && owner != t => return false,
                Some((far, _)) if far >= end => {}
                _ => reach = Some((end, t)),
            }
        }
        true
    })
}

/// Pushes the rows of block `(r, c, ld)` at `offset` for every iteration of a THREAD range of
/// `trips`; false when an offset cannot be evaluated or the rows exceed `budget`.
fn block_rows(
    offset: &IndexFormula,
    (r, c, ld): Block,
    trips: usize,
    budget: &mut usize,
    rows: &mut Vec<(i64, i64, usize)>,
) -> bool {
    if r == 0 || c == 0 {
        return true;
    }
    let Some(left) = budget.checked_sub(r.saturating_mul(trips)) else { return false };
    *budget = left;
    for t in 0..trips {
        let Some(start) = offset.eval(&[t as i64]) else { return false };
        rows.extend((0..r).map(|i| {
            let first = start + (i * ld) as i64;
            (first, first + c as i64, t)
        }));
    }
    true
}

/// Pushes the rows a plain access at `offset` touches in every iteration of THREAD range
/// `thread` (of `trips`), where no block describes them: each inner loop but a contiguous
/// innermost one (stride 1, constant trip count: the row's columns) is walked iteration by
/// iteration, its trip count evaluated per thread iteration, and the offset evaluated at each
/// point, clamps (`min`, `max`) and all. This is the store loop of a task whose last rows
/// overlap the task before it and are skipped: `rows - skip(t)` rows, each row at
/// `min(skip(t) + r, rows - 1)`. Consecutive rows of one iteration that continue each other
/// are merged. False when something cannot be evaluated, a trip count depends on another
/// inner loop, or the points exceed `budget`.
fn walked_rows(
    offset: &UOp,
    thread: &UOp,
    trips: usize,
    budget: &mut usize,
    rows: &mut Vec<(i64, i64, usize)>,
) -> bool {
    let mut inner: Vec<UOp> = offset.ranges_mentioned().into_iter().filter(|r| r != thread).collect();
    inner.dedup();
    // The contiguous innermost loop, if any: its iterations are one row's columns.
    let mut cols = 1i64;
    let mut rest = offset.clone();
    if let Some(pos) = inner.iter().position(|r| {
        r.as_range().and_then(|v| v.end.const_int()).is_some()
            && split_linear(offset, r).is_some_and(|(s, _)| s == 1)
    }) {
        let r = inner.remove(pos);
        let Some(c) = r.as_range().and_then(|v| v.end.const_int()) else { return false };
        let Some((_, without)) = split_linear(offset, &r) else { return false };
        (cols, rest) = (c, without);
    }
    if cols <= 0 || inner.len() > MAX_WALKED_LOOPS {
        return false;
    }
    let mut vars = vec![thread.clone()];
    vars.extend(inner.iter().cloned());
    let Some(at) = IndexFormula::over_ranges(&rest, &vars) else { return false };
    let Some(loop_trips) = inner
        .iter()
        .map(|r| IndexFormula::over_ranges(r.as_range()?.end, std::slice::from_ref(thread)))
        .collect::<Option<Vec<IndexFormula>>>()
    else {
        return false;
    };
    for t in 0..trips {
        let Some(counts) = loop_trips.iter().map(|f| f.eval(&[t as i64])).collect::<Option<Vec<i64>>>()
        else {
            return false;
        };
        let points: i64 = counts.iter().map(|&n| n.max(0)).product();
        let Some(left) = usize::try_from(points).ok().and_then(|p| budget.checked_sub(p)) else {
            return false;
        };
        *budget = left;
        if points == 0 {
            continue;
        }
        let mut point = vec![0i64; counts.len()];
        let first_row = rows.len();
        loop {
            let mut env = vec![t as i64];
            env.extend_from_slice(&point);
            let Some(start) = at.eval(&env) else { return false };
            let continues = rows.len() > first_row && rows.last().is_some_and(|last| last.1 == start);
            match rows.last_mut() {
                Some(last) if continues => last.1 = start + cols,
                _ => rows.push((start, start + cols, t)),
            }
            // The next point, the last loop fastest; done when every loop wrapped.
            let Some(k) = (0..point.len()).rev().find(|&k| point[k] + 1 < counts[k]) else { break };
            point[k] += 1;
            point[k + 1..].fill(0);
        }
    }
    true
}

/// Inner loops [`walked_rows`] walks point by point at most (a store loop over heads, rows).
const MAX_WALKED_LOOPS: usize = 3;
