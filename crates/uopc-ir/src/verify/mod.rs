//! The verifier: rejects malformed loop programs with an error naming the offending node.

use crate::dtype::DType;
use crate::error::{IrError, IrErrorKind};
use crate::linearize::{Linear, linearize_with, open_ranges_with};
use crate::uop::{AxisType, Op, UOp};
use std::collections::{HashMap, HashSet};

mod types;
use types::check_types;

/// The BUFFER or ALLOC at the base of a view (through AFTER chains), if any.
pub fn view_base(view: &UOp) -> Option<&UOp> {
    let mut v = view;
    loop {
        match v.op() {
            Op::Buffer { .. } | Op::Alloc { .. } => return Some(v),
            Op::After => v = &v.src()[0],
            _ => return None,
        }
    }
}

/// The ranges an ALLOC is declared inside: the ranges common to every view that wraps it
/// directly (`acc.after(i)`); a bare use of the ALLOC declares it at the top level.
fn declared_scopes(topo: &[UOp], rng: &HashMap<UOp, Vec<UOp>>) -> HashMap<UOp, Vec<UOp>> {
    let mut scope: HashMap<UOp, Vec<UOp>> = HashMap::new();
    let mut merge = |alloc: &UOp, ranges: &[UOp]| {
        scope
            .entry(alloc.clone())
            .and_modify(|s| s.retain(|r| ranges.contains(r)))
            .or_insert_with(|| ranges.to_vec());
    };
    for u in topo {
        let direct = match u.op() {
            Op::After | Op::Index => &u.src()[0],
            _ => continue,
        };
        if matches!(direct.op(), Op::Alloc { .. }) {
            let ranges: &[UOp] = if matches!(u.op(), Op::After) { &rng[u] } else { &[] };
            merge(direct, ranges);
        }
    }
    scope
}

fn err(kind: IrErrorKind, u: &UOp, reason: impl Into<String>) -> IrError {
    IrError::new(kind, u, reason)
}

/// Checks a loop program and returns its linearization.
///
/// Rejects: ill-typed nodes; variables with empty bounds, two declarations of one variable
/// slot, or variable slots that are not `0..n`; ENDs of ranges that are not open; ranges never
/// ended; stores using a range they are not inside; loads of an ALLOC no store reaches; ALLOCs
/// written inside a THREAD range but declared outside it; stores to buffers outside the THREAD
/// range of a threaded program; indices not provably inside their buffer; loops that do not
/// nest; two stores that may write one element with nothing ordering them.
///
/// Every bounds proof takes a variable ([`crate::var`]) to be any value of its declared
/// `lo..=hi`, so a program proven here is in bounds for every value a runner admits.
///
/// # Errors
///
/// An [`IrError`] naming the first offending node, with its [`crate::IrErrorKind`] being one
/// of the rejections above.
///
/// # Examples
///
/// ```rust
/// use uopc_ir::{AxisType, DType, IrErrorKind, buffer, range, sink, verify};
///
/// let out = buffer(0, DType::F32, 4);
/// let k = range(4, 0, AxisType::Loop);
/// let fill = sink(&[out.index(&k).store(1.0f32).end(&[k.clone()])]);
/// let linear = verify(&fill)?;
/// assert_eq!(linear.buffers, vec![out.clone()]);
///
/// // k + 1 reaches 4, one past the end of the buffer.
/// let shifted = sink(&[out.index(&k + 1).store(1.0f32).end(&[k])]);
/// assert_eq!(verify(&shifted).unwrap_err().kind, IrErrorKind::OutOfBounds);
/// # Ok::<(), uopc_ir::IrError>(())
/// ```
pub fn verify(program: &UOp) -> Result<Linear, IrError> {
    verify_with(program, false)
}

/// [`verify`] for a program that came out of [`crate::simplify`] after its original passed
/// [`verify`]: loops keep the stores their ENDs enclose even where rewriting removed the loop
/// variable from them (see [`crate::open_ranges_with`]).
///
/// # Errors
///
/// As [`verify`]: an [`IrError`] naming the first offending node.
pub fn verify_simplified(program: &UOp) -> Result<Linear, IrError> {
    verify_with(program, true)
}

fn verify_with(program: &UOp, lenient: bool) -> Result<Linear, IrError> {
    let topo = UOp::toposort(std::slice::from_ref(program));
    let mut slots: HashMap<(bool, usize), UOp> = HashMap::new();
    for u in &topo {
        check_types(u)?;
        let slot = match u.op() {
            Op::Buffer { slot, .. } => Some(slot.index()),
            Op::Alloc { slot, .. } => Some(slot.index()),
            _ => None,
        };
        if let Some(slot) = slot {
            let key = (matches!(u.op(), Op::Buffer { .. }), slot);
            if let Some(prev) = slots.insert(key, u.clone())
                && prev != *u
            {
                return Err(err(
                    IrErrorKind::Structure,
                    u,
                    format!(
                        "slot {slot} is declared twice with different dtype or length ({})",
                        prev.short()
                    ),
                ));
            }
        }
    }
    check_var_slots(&topo, lenient)?;
    let rng = open_ranges_with(&topo, lenient)?;
    let linear = linearize_with(program, lenient)?;
    let scopes = declared_scopes(&topo, &rng);

    for u in &topo {
        match u.op() {
            Op::Index => check_bounds(u)?,
            Op::Store => {
                let base = u.as_store().and_then(|s| s.index.indexed_base()).expect("checked by check_types");
                check_write_scope(u, base, &rng[u], &scopes, linear.thread.is_some())?;
            }
            Op::Load => check_initialized(u)?,
            Op::Tile(t) => {
                for (x, operand) in u.src().iter().zip(t.operands()) {
                    check_extent(u, x, operand.extent)?;
                    if operand.reads && !operand.writes {
                        check_initialized_view(u, x.as_index().expect("checked by check_types").base)?;
                    }
                    if operand.writes {
                        let base = x.indexed_base().expect("checked by check_types");
                        check_write_scope(u, base, &rng[u], &scopes, linear.thread.is_some())?;
                    }
                }
            }
            _ => {}
        }
    }
    if !lenient {
        // Simplification keeps every dependency and rewrites indices to equal values, so a
        // program that passed here still passes after it.
        check_store_order(&topo)?;
    }
    Ok(linear)
}

/// One declaration per variable slot, and (as written, not `lenient`) slots `0..n` without a
/// gap: values are passed by position, so a gap would leave a value matched to no VAR.
/// Simplification may drop a variable's every use; the program still takes all its values.
fn check_var_slots(topo: &[UOp], lenient: bool) -> Result<(), IrError> {
    let mut by_slot: HashMap<usize, &UOp> = HashMap::new();
    for u in topo {
        if let Op::Var { slot, .. } = u.op()
            && let Some(prev) = by_slot.insert(slot.index(), u)
            && prev != u
        {
            return Err(err(
                IrErrorKind::Structure,
                u,
                format!("variable slot {slot} is declared twice with different bounds ({})", prev.short()),
            ));
        }
    }
    if lenient {
        return Ok(());
    }
    if let Some(missing) = (0..by_slot.len()).find(|k| !by_slot.contains_key(k)) {
        let highest = by_slot.iter().max_by_key(|(k, _)| **k).map(|(_, u)| *u).expect("not empty");
        return Err(err(
            IrErrorKind::Structure,
            highest,
            format!(
                "variable slots must be 0..{} without gaps, but no VAR has slot {missing}",
                by_slot.len()
            ),
        ));
    }
    Ok(())
}

/// Two STOREs to one BUFFER or ALLOC where neither depends on the other (through data or
/// AFTER) must write provably different elements in any one iteration: otherwise the element
/// keeps whichever store the linearizer happens to place last, and the interpreter and the
/// JIT (which linearizes the simplified program) could disagree.
fn check_store_order(topo: &[UOp]) -> Result<(), IrError> {
    let mut by_base: HashMap<UOp, Vec<UOp>> = HashMap::new();
    for u in topo {
        if matches!(u.op(), Op::Store) {
            let base = u.as_store().and_then(|s| s.index.indexed_base()).expect("checked by check_types");
            by_base.entry(base.clone()).or_default().push(u.clone());
        }
        if let Op::Tile(t) = u.op() {
            for (x, o) in u.src().iter().zip(t.operands()) {
                if o.writes {
                    let base = x.indexed_base().expect("checked by check_types");
                    let group = by_base.entry(base.clone()).or_default();
                    if !group.contains(u) {
                        group.push(u.clone());
                    }
                }
            }
        }
    }
    let grouped: Vec<UOp> = by_base.values().filter(|v| v.len() > 1).flatten().cloned().collect();
    if grouped.is_empty() {
        return Ok(());
    }
    let bit: HashMap<&UOp, usize> = grouped.iter().enumerate().map(|(i, s)| (s, i)).collect();
    let words = grouped.len().div_ceil(64);
    // For every node, the grouped stores among its transitive sources.
    let mut reach: HashMap<&UOp, Vec<u64>> = HashMap::with_capacity(topo.len());
    for u in topo {
        let mut set = vec![0u64; words];
        for s in u.src() {
            if let Some(r) = reach.get(s) {
                set.iter_mut().zip(r).for_each(|(a, b)| *a |= b);
            }
            if let Some(&i) = bit.get(s) {
                set[i / 64] |= 1 << (i % 64);
            }
        }
        reach.insert(u, set);
    }
    let reaches = |a: &UOp, b: &UOp| {
        let i = bit[b];
        reach[a][i / 64] & (1 << (i % 64)) != 0
    };
    let mut memo = HashMap::new();
    for stores in by_base.values().filter(|v| v.len() > 1) {
        for (k, a) in stores.iter().enumerate() {
            for b in &stores[k + 1..] {
                if reaches(a, b) || reaches(b, a) {
                    continue;
                }
                // A tile op writes a block: only an ordering makes it safe.
                if matches!(a.op(), Op::Tile(_)) || matches!(b.op(), Op::Tile(_)) {
                    return Err(err(
                        IrErrorKind::UnorderedStores,
                        b,
                        format!("may write memory {} writes, and no dependency orders the two", a.short()),
                    ));
                }
                let offset = |s: &UOp| {
                    s.as_store()
                        .and_then(|s| s.index.as_index())
                        .expect("checked by check_types")
                        .offset
                        .clone()
                };
                let (ia, ib) = (&offset(a), &offset(b));
                // Both indices are in bounds (checked above), so their difference fits their dtype.
                let diff = if ia.dtype() == ib.dtype() {
                    ia - ib
                } else {
                    ia.cast(DType::I64) - ib.cast(DType::I64)
                };
                let diff = crate::simplify_memo(&diff, Default::default(), &mut memo);
                let (lo, hi) = diff.bounds();
                if lo <= 0 && hi >= 0 {
                    return Err(err(
                        IrErrorKind::UnorderedStores,
                        b,
                        format!(
                            "may write the element {} writes, and no dependency orders the two (add .after)",
                            a.short()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn check_bounds(index: &UOp) -> Result<(), IrError> {
    let base = index.indexed_base().expect("checked by check_types");
    let len = match base.op() {
        Op::Buffer { len, .. } | Op::Alloc { len, .. } => *len as i64,
        _ => unreachable!("view_base returns BUFFER or ALLOC"),
    };
    let (lo, hi) = index.as_index().expect("checked by check_types").offset.bounds();
    if lo < 0 || hi >= len {
        return Err(err(
            IrErrorKind::OutOfBounds,
            index,
            format!("index may range over [{lo}, {hi}] but {} has {len} elements", base.short()),
        ));
    }
    Ok(())
}

/// A write by `u` (inside `ranges`) to `base`: an ALLOC written inside a THREAD range must be
/// declared inside it, and a threaded program may write buffers only inside its THREAD range.
fn check_write_scope(
    u: &UOp,
    base: &UOp,
    ranges: &[UOp],
    scopes: &HashMap<UOp, Vec<UOp>>,
    threaded: bool,
) -> Result<(), IrError> {
    let thread_ranges: Vec<&UOp> =
        ranges.iter().filter(|r| matches!(r.op(), Op::Range { axis: AxisType::Thread, .. })).collect();
    match base.op() {
        Op::Alloc { .. } => {
            let declared_in: &[UOp] = scopes.get(base).map(Vec::as_slice).unwrap_or(&[]);
            if let Some(t) = thread_ranges.iter().find(|t| !declared_in.contains(t)) {
                return Err(err(
                    IrErrorKind::ThreadRace,
                    u,
                    format!(
                        "writes {} inside THREAD range {} but it is declared outside it: threads would share it",
                        base.short(),
                        t.short()
                    ),
                ));
            }
        }
        _ if threaded && thread_ranges.is_empty() => {
            return Err(err(
                IrErrorKind::ThreadRace,
                u,
                "stores to a buffer outside the THREAD range: every thread would run it",
            ));
        }
        _ => {}
    }
    Ok(())
}

/// A tile operand starting at `index` spans `extent` elements: all inside the buffer.
fn check_extent(tile: &UOp, index: &UOp, extent: usize) -> Result<(), IrError> {
    if extent == 0 {
        return Ok(());
    }
    let base = index.indexed_base().expect("checked by check_types");
    let len = match base.op() {
        Op::Buffer { len, .. } | Op::Alloc { len, .. } => *len as i64,
        _ => unreachable!("view_base returns BUFFER or ALLOC"),
    };
    let (lo, hi) = index.as_index().expect("checked by check_types").offset.bounds();
    let last = hi.saturating_add(extent as i64 - 1);
    if lo < 0 || last >= len {
        return Err(err(
            IrErrorKind::OutOfBounds,
            tile,
            format!("an operand may span [{lo}, {last}] but {} has {len} elements", base.short()),
        ));
    }
    Ok(())
}

fn check_initialized(load: &UOp) -> Result<(), IrError> {
    check_initialized_view(
        load,
        load.as_load().and_then(|i| i.as_index()).expect("checked by check_types").base,
    )
}

/// Some store (or tile op writing it) reaches `view` when it is an ALLOC view.
fn check_initialized_view(load: &UOp, view: &UOp) -> Result<(), IrError> {
    let base = view_base(view).expect("checked by check_types");
    if !matches!(base.op(), Op::Alloc { .. }) {
        return Ok(());
    }
    // Some store to this ALLOC must be among the view's AFTER dependencies.
    let mut stack: Vec<UOp> = Vec::new();
    let mut v = view;
    while let Some(after) = v.as_after() {
        stack.extend(after.deps.iter().cloned());
        v = after.base;
    }
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x.clone()) {
            continue;
        }
        if x.as_store().and_then(|s| s.index.indexed_base()) == Some(base) {
            return Ok(());
        }
        if let Op::Tile(t) = x.op()
            && x.src().iter().zip(t.operands()).any(|(i, o)| o.writes && i.indexed_base() == Some(base))
        {
            return Ok(());
        }
        stack.extend(x.src().iter().cloned());
    }
    Err(err(
        IrErrorKind::UninitializedLoad,
        load,
        format!("loads {} but no store to it comes before", base.short()),
    ))
}
