//! Symbolic simplification with value bounds, as named rule tables run by the rewrite engine.
//!
//! Integer expressions get `vmin`/`vmax` bounds from the ranges they mention; with them,
//! `simplify` canonicalizes linear sums and folds division and modulo, proving for example
//! `((i*N + j)//N) % N == i` when `0 <= j < N`. Questions such as "which loops does this
//! expression depend on" must be asked of a simplified expression: unsimplified index
//! arithmetic can mention a loop whose value cancels out, and code placed by that answer would
//! sit in a loop it does not need.
//!
//! The rules live in [`rules`], in tables run in a fixed order ([`tables`] lists them).

mod bounds;
mod coverage;
mod linear;
mod program;
mod rules;
#[cfg(test)]
mod tests;

use crate::rewrite::{Pass, Revisit, RuleTable};
use crate::uop::{Op, UOp};
pub use coverage::{stores_every_element, stores_every_element_linear};
use linear::LinearForm;
pub use program::simplify_program;
use std::collections::HashMap;
use std::sync::LazyLock;

pub use crate::alu::{int_div, int_mod};

/// Whether `u` has the number of sources its op needs (malformed input is left alone).
fn well_formed(u: &UOp) -> bool {
    let n = u.src().len();
    match u.op() {
        Op::Unary(_) | Op::Cast => n == 1,
        Op::Binary(_) => n == 2,
        Op::Where => n == 3,
        Op::Range { .. } => n == 1,
        _ => true,
    }
}

/// Options of [`simplify_with`].
#[derive(Clone, Copy, Debug)]
pub struct SimplifyOptions {
    /// Fold IDIV and MOD using bounds (the `divmod` table). Off, index arithmetic of reshapes
    /// keeps loops it does not depend on, which tests use to show what that costs.
    pub fold_divmod: bool,
}

impl Default for SimplifyOptions {
    fn default() -> Self {
        SimplifyOptions { fold_divmod: true }
    }
}

/// Simplifies `u` to a fixed point (bottom-up, explicit stack).
///
/// The result computes the same values as `u`; it is a new graph, and `u` is unchanged.
///
/// # Examples
///
/// Bounds of a loop variable fold index arithmetic: for `k` in `0..4`, `k % 8` is `k` and
/// `k / 4` is 0.
///
/// ```rust
/// use uopc_ir::{AxisType, range, simplify};
///
/// let k = range(4, 0, AxisType::Loop);
/// assert_eq!(simplify(&(&k * 1 + 0)), k);
/// assert_eq!(simplify(&(&k % 8)), k);
/// assert_eq!(simplify(&(&k / 4)).const_int(), Some(0));
/// ```
#[must_use]
pub fn simplify(u: &UOp) -> UOp {
    simplify_with(u, SimplifyOptions::default())
}

/// [`simplify`] with options.
///
/// # Examples
///
/// The row of a flattened `(i, j)` index, `(i * 4 + j) / 4` for `j` in `0..4`, is `i`; without
/// the divmod table the division stays:
///
/// ```rust
/// use uopc_ir::{AxisType, SimplifyOptions, range, simplify_with};
///
/// let (i, j) = (range(3, 0, AxisType::Loop), range(4, 1, AxisType::Loop));
/// let row = (&i * 4 + &j) / 4;
/// assert_eq!(simplify_with(&row, SimplifyOptions::default()), i);
/// let kept = simplify_with(&row, SimplifyOptions { fold_divmod: false });
/// assert_ne!(kept, i);
/// assert!(kept.ranges_mentioned().contains(&j));
/// ```
#[must_use]
pub fn simplify_with(u: &UOp, opts: SimplifyOptions) -> UOp {
    let mut memo: HashMap<UOp, UOp> = HashMap::new();
    simplify_memo(u, opts, &mut memo)
}

/// [`simplify_with`] sharing a memo across calls (for simplifying many roots of one graph).
///
/// The memo maps every node seen to its simplification (results map to themselves); it must
/// only ever be used with one value of `opts`.
#[must_use]
pub fn simplify_memo(u: &UOp, opts: SimplifyOptions, memo: &mut HashMap<UOp, UOp>) -> UOp {
    let pass = if opts.fold_divmod { &*SIMPLIFY } else { &*SIMPLIFY_NO_DIVMOD };
    pass.run(u, &mut (), memo).0
}

/// Rewrites per node at most: a few reach a fixed point; the bound stops rules that cycle.
const MAX_ROUNDS: usize = 16;

struct Tables {
    constant_folding: RuleTable,
    algebraic: RuleTable,
    selection: RuleTable,
    linear: RuleTable,
    divmod: RuleTable,
}

static TABLES: LazyLock<Tables> = LazyLock::new(|| Tables {
    constant_folding: rules::constant_folding(),
    algebraic: rules::algebraic(),
    selection: rules::selection(),
    linear: rules::linear(),
    divmod: rules::divmod(),
});

/// Every simplify table, in the order they are tried (the divmod table last, so switching it
/// off does not change the order of the others).
pub fn tables() -> [&'static RuleTable; 5] {
    let t = &*TABLES;
    [&t.constant_folding, &t.algebraic, &t.selection, &t.linear, &t.divmod]
}

static SIMPLIFY: LazyLock<Pass<'static>> =
    LazyLock::new(|| Pass::new("simplify", tables().to_vec(), Revisit::Fixpoint { max_rounds: MAX_ROUNDS }));

static SIMPLIFY_NO_DIVMOD: LazyLock<Pass<'static>> = LazyLock::new(|| {
    let t = tables();
    Pass::new("simplify_no_divmod", t[..4].to_vec(), Revisit::Fixpoint { max_rounds: MAX_ROUNDS })
});

/// Writes `expr` as `coeff * var + rest` where `rest` does not mention `var`, if it is linear in
/// `var`. Used to prove that THREAD iterations touch disjoint memory.
pub fn split_linear(expr: &UOp, var: &UOp) -> Option<(i64, UOp)> {
    let lin = LinearForm::of(expr)?;
    let mut coeff = 0;
    let mut rest = LinearForm { terms: Vec::new(), constant: lin.constant };
    for (t, c) in &lin.terms {
        if t == var {
            coeff += c;
        } else if t.ranges_mentioned().contains(var) {
            return None;
        } else {
            rest.terms.push((t.clone(), *c));
        }
    }
    Some((coeff, rest.build(expr.dtype())))
}
