//! Whether a program writes a buffer whole: the fact that lets a caller pass it uninitialized.
//!
//! A store covers its buffer only if it runs at all, so the question is asked of the program
//! as linearized: a store whose index walks the whole buffer still writes nothing inside a loop
//! that may run zero times (an empty constant range, or a runtime variable at its lower bound).

use super::linear::LinearForm;
use crate::linearize::{Linear, Stmt, linearize_with};
use crate::uop::{ConstValue, Op, UOp};

/// Whether `program` writes every element of BUFFER slot `slot` and never reads it: the slot
/// is touched only by STOREs and by tile GEMMs that overwrite it as their C (not
/// accumulating), none by a load or another tile op, and one of those writes
///
/// - has an index that maps its ranges one to one onto `0..len` (a dense row-major walk:
///   ranges of constant extent whose coefficients, sorted, are 1 and then each the previous
///   one times its range's extent, with no constant term; a GEMM's `m x n` block of C counts
///   as two more such ranges, of coefficients `ldc` and 1), and
/// - sits, once the program is linearized, only inside loops proven to run at least once
///   (each loop's trip count has a lower bound of at least 1, whatever the variables are).
///
/// Stores are unconditional in this IR, so after a run the buffer then holds no value from
/// before it: a caller need not initialize it. `false` whenever that cannot be shown,
/// including for a program that does not linearize.
///
/// ```rust
/// use uopc_ir::{AxisType, DType, buffer, range, sink, stores_every_element};
/// let (x, out) = (buffer(0, DType::F32, 12), buffer(1, DType::F32, 12));
/// let (i, j) = (range(3, 0, AxisType::Loop), range(4, 1, AxisType::Loop));
/// let at = &i * 4i64 + &j;
/// let copy = sink(&[out.index(&at).store(x.index(&at).load()).end(&[j.clone(), i.clone()])]);
/// assert!(stores_every_element(&copy, 1));
/// let half = sink(&[out.index(&i).store(x.index(&i).load()).end(&[i.clone()])]);
/// assert!(!stores_every_element(&half, 1), "3 of 12 elements");
/// // The same dense store inside a loop that never runs writes nothing.
/// let empty = range(0, 2, AxisType::Loop);
/// let value = x.index(&at).load() + empty.cast(DType::F32);
/// let never = sink(&[out.index(&at).store(value).end(&[empty, j, i])]);
/// assert!(!stores_every_element(&never, 1));
/// ```
pub fn stores_every_element(program: &UOp, slot: usize) -> bool {
    linearize_with(program, true).is_ok_and(|linear| stores_every_element_linear(&linear, slot))
}

/// [`stores_every_element`] judged on a program already linearized, as a backend compiles it
/// (for example [`crate::PreparedKernel::linear`]).
pub fn stores_every_element_linear(linear: &Linear, slot: usize) -> bool {
    let Some(len) = linear.buffers.iter().find_map(|b| match b.op() {
        Op::Buffer { slot: s, len } if s.index() == slot => Some(*len),
        _ => None,
    }) else {
        return false;
    };
    let is_slot = |view: &UOp| {
        crate::view_base(view)
            .is_some_and(|b| matches!(b.op(), Op::Buffer { slot: s, .. } if s.index() == slot))
    };
    // The element index of an access to the slot (a LOAD's or STORE's first source).
    let slot_index = |u: &UOp| -> Option<UOp> {
        let index = u.src().first()?.as_index()?;
        is_slot(index.base).then(|| index.offset.clone())
    };
    let mut covered = false;
    let mut enclosing: Vec<&UOp> = Vec::new();
    let mut stack: Vec<std::slice::Iter<'_, Stmt>> = vec![linear.root.iter()];
    while let Some(body) = stack.last_mut() {
        let Some(stmt) = body.next() else {
            stack.pop();
            enclosing.pop();
            continue;
        };
        let u = match stmt {
            Stmt::Loop { range, body } => {
                enclosing.push(range);
                stack.push(body.iter());
                continue;
            }
            Stmt::Op(u) => u,
        };
        let touches = |s: &UOp| s.as_index().is_some_and(|i| is_slot(i.base)) || is_slot(s);
        match u.op() {
            Op::Load if slot_index(u).is_some() => return false,
            Op::Tile(_) if u.src().iter().any(touches) => {
                // A GEMM overwriting its C (zeroing it when k = 0) writes the `m x n` block.
                let Some(g) = u.as_gemm().filter(|g| !g.shape.accumulate) else { return false };
                let Some(at) = g.c.as_index().filter(|i| is_slot(i.base)) else { return false };
                if touches(g.a) || touches(g.b) {
                    return false;
                }
                let block = [(g.shape.ldc, g.shape.m), (1, g.shape.n)];
                covered |= dense_walk_with(at.offset, &block, len)
                    && enclosing.iter().all(|r| runs_at_least_once(r));
            }
            Op::Store => match slot_index(u) {
                Some(i) if u.src().len() == 2 => {
                    covered |= dense_walk(&i, len) && enclosing.iter().all(|r| runs_at_least_once(r));
                }
                Some(_) => return false,
                None => {}
            },
            _ => {}
        }
    }
    covered
}

/// Whether the loop over `range` is proven to run at least once (its trip count's lower bound,
/// over every value of the variables and enclosing ranges it mentions, is at least 1).
fn runs_at_least_once(range: &UOp) -> bool {
    range.as_range().is_some_and(|r| r.end.vmin() >= 1)
}

/// Whether `index` takes each value of `0..len` exactly once as its ranges run (see
/// [`stores_every_element`]).
fn dense_walk(index: &UOp, len: usize) -> bool {
    dense_walk_with(index, &[], len)
}

/// [`dense_walk`] of `index` plus further ranges `(coefficient, extent)` (a tile's rows and
/// columns).
fn dense_walk_with(index: &UOp, extra: &[(usize, usize)], len: usize) -> bool {
    let Some(lin) = LinearForm::of(index) else { return false };
    if lin.constant != 0 {
        return false;
    }
    let mut steps: Vec<(i64, i64)> = Vec::with_capacity(lin.terms.len() + extra.len());
    for &(coeff, extent) in extra {
        let (Ok(coeff), Ok(extent)) = (i64::try_from(coeff), i64::try_from(extent)) else { return false };
        if coeff <= 0 || extent <= 0 {
            return false;
        }
        steps.push((coeff, extent));
    }
    for (atom, coeff) in &lin.terms {
        let Some(r) = atom.as_range() else { return false };
        let Some(ConstValue::Int(extent)) = r.end.const_value() else { return false };
        if *coeff <= 0 || extent <= 0 {
            return false;
        }
        steps.push((*coeff, extent));
    }
    steps.sort_unstable();
    let mut next = 1i64;
    for (coeff, extent) in steps {
        if coeff != next {
            return false;
        }
        let Some(n) = next.checked_mul(extent) else { return false };
        next = n;
    }
    usize::try_from(next).is_ok_and(|n| n == len)
}

#[cfg(test)]
mod tests {
    use super::stores_every_element;
    use crate::uop::{GemmShape, TileOp};
    use crate::{AxisType, DType, buffer, range, sink, tile};

    /// A GEMM program over two column blocks of a 4 x 8 C, one per THREAD task.
    fn column_blocks(accumulate: bool, cols: usize, ldc: usize) -> crate::UOp {
        let (a, b, c) =
            (buffer(0, DType::F32, 4 * 3), buffer(1, DType::F32, 3 * 8), buffer(2, DType::F32, 32));
        let t = range(2, 0, AxisType::Thread);
        let g = GemmShape { ldb: 8, ldc, ..GemmShape::dense(4, cols, 3, false, false, accumulate) };
        let at = &t * cols as i64;
        sink(&[tile(TileOp::Gemm(g), &[a.index(0), b.index(&at), c.index(&at)]).end(&[t])])
    }

    #[test]
    fn an_overwriting_gemm_covers_its_c_blocks() {
        assert!(stores_every_element(&column_blocks(false, 4, 8), 2));
        // Accumulating reads C; half the columns leave the rest unwritten.
        assert!(!stores_every_element(&column_blocks(true, 4, 8), 2));
        assert!(!stores_every_element(&column_blocks(false, 2, 8), 2));
        // A GEMM never covers its A or B.
        assert!(!stores_every_element(&column_blocks(false, 4, 8), 1));
    }
}
