//! Programmable attention: a score function and a mask function over `(batch, head, query,
//! key)`, written with uopc's own IR builders and compiled into the FlashAttention-2 kernel.
//!
//! [`AttentionMods`] holds them, with the tensors they read ([`Capture`]s: a per-head slope
//! vector, a bias table, per-token document ids, per-head sink logits) and optional attention
//! sinks. [`Sdpa::compile_flex`](super::Sdpa::compile_flex) builds the kernel: the functions
//! run on the score tile of every key block that needs them, inside the kernel, and no
//! `n_q x n_k` tensor is written.
//!
//! Key blocks are skipped from the mask at compile time where it can be bounded along the
//! key axis: each conjunct of the mask that is an integer comparison `x < y` with `x - y`
//! linear in the key index with coefficient 1 or -1 ends or starts the keys a query row sees
//! (causal, sliding windows, prefix limits). Blocks outside every row's bounds are skipped;
//! blocks inside every row's bounds run without the mask when those comparisons are the whole
//! mask; the others evaluate it.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use crate::masked::min_idx;
use uopc_ir::{AxisType, BinaryOp, DType, UOp, boolc, buffer, idx, linear_in, range};

/// A score function: the modified score of `(b, h, q, kv)` from the scaled score `s = scale *
/// q · k` (the value softmax then sees), as an f32 expression.
pub type ScoreFn = dyn Fn(&ScoreArgs<'_>, &UOp) -> UOp + Send + Sync;

/// A mask function: whether query `q` of `(b, h)` sees key `kv`, as a Bool expression.
pub type MaskFn = dyn Fn(&ScoreArgs<'_>) -> UOp + Send + Sync;

/// A tensor a score or mask function reads, declared with [`AttentionMods::capture`]: its
/// values are given to every run ([`Extras::captures`](super::Extras::captures)), in the order
/// of declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capture(usize);

impl Capture {
    /// Its position among the captures (and in [`Extras::captures`](super::Extras::captures)).
    pub fn position(self) -> usize {
        self.0
    }
}

/// A captured tensor's name, shape and element type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureSpec {
    /// The name errors use.
    pub name: String,
    /// Its shape (row-major).
    pub shape: Vec<usize>,
    /// F32, or I32 (ids, positions).
    pub dtype: DType,
}

impl CaptureSpec {
    /// Elements it holds.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a score or mask function builds on: the batch item `b`, the query head `h`, the query
/// row `q` and the key `kv` (INDEX expressions), and [`ScoreArgs::load`] of a captured tensor.
pub struct ScoreArgs<'a> {
    /// The batch item.
    pub b: UOp,
    /// The query head.
    pub h: UOp,
    /// The query row (its position in the sequence of queries).
    pub q: UOp,
    /// The key (its position in the sequence of keys).
    pub kv: UOp,
    buffers: &'a [UOp],
    specs: &'a [CaptureSpec],
    problems: &'a RefCell<Vec<String>>,
}

impl ScoreArgs<'_> {
    /// Element `at` (one INDEX expression per axis) of captured tensor `c`, as an expression of
    /// its dtype. A wrong number of indices is reported by the compile as an error naming the
    /// tensor; an index that may leave its axis is refused by the compile's bounds check.
    pub fn load(&self, c: Capture, at: &[UOp]) -> UOp {
        let (Some(buf), Some(spec)) = (self.buffers.get(c.0), self.specs.get(c.0)) else {
            self.problems.borrow_mut().push(format!("capture #{} is not one of these mods'", c.0));
            return idx(0).cast(DType::F32);
        };
        if at.len() != spec.shape.len() {
            self.problems.borrow_mut().push(format!(
                "capture `{}` of shape {:?} is read with {} index(es)",
                spec.name,
                spec.shape,
                at.len()
            ));
            return idx(0).cast(spec.dtype);
        }
        let mut flat = idx(0);
        for (i, dim) in at.iter().zip(&spec.shape) {
            flat = flat * *dim as i64 + i;
        }
        buf.index(flat).load()
    }
}

/// `a && b` for Bool expressions, as a mask function writes a conjunction (read back by the
/// block bounds as two conjuncts).
pub fn and(a: &UOp, b: &UOp) -> UOp {
    a.where_(b, boolc(false))
}

/// `a || b` for Bool expressions.
pub fn or(a: &UOp, b: &UOp) -> UOp {
    a.where_(boolc(true), b)
}

/// A score function, a mask function, attention sinks and the tensors they read, for
/// [`Sdpa::compile_flex`](super::Sdpa::compile_flex).
///
/// # Examples
///
/// ALiBi and a sliding window of 256 keys:
///
/// ```rust
/// use uopc_ir::DType;
/// use uopc_kernels::sdpa::{AttentionMods, and};
///
/// let mut mods = AttentionMods::new();
/// let slopes = mods.capture("slopes", &[8], DType::F32);
/// let mods = mods
///     .score(move |x, s| s + x.load(slopes, &[x.h.clone()]) * (&x.kv - &x.q).cast(DType::F32))
///     .mask(|x| and(&x.kv.lt(&x.q + 1), &(&x.q - &x.kv).lt(256)));
/// assert_eq!(mods.captures().len(), 1);
/// ```
#[derive(Clone, Default)]
pub struct AttentionMods {
    score: Option<Arc<ScoreFn>>,
    mask: Option<Arc<MaskFn>>,
    sinks: Option<Capture>,
    captures: Vec<CaptureSpec>,
}

impl fmt::Debug for AttentionMods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttentionMods")
            .field("score", &self.score.is_some())
            .field("mask", &self.mask.is_some())
            .field("sinks", &self.sinks)
            .field("captures", &self.captures)
            .finish()
    }
}

impl AttentionMods {
    /// No score function, no mask, no sinks: plain attention.
    pub fn new() -> AttentionMods {
        AttentionMods::default()
    }

    /// Declares a tensor of `shape` and `dtype` (F32 or I32) that the functions read with
    /// [`ScoreArgs::load`]; its values come with each run.
    pub fn capture(&mut self, name: &str, shape: &[usize], dtype: DType) -> Capture {
        self.captures.push(CaptureSpec { name: name.to_string(), shape: shape.to_vec(), dtype });
        Capture(self.captures.len() - 1)
    }

    /// Sets the score function.
    ///
    /// A soft-cap, `c * tanh(k * s)` of the score alone with [`tanh`](super::tanh) (or its
    /// formula spelled out from `exp2`), runs as the soft-capping tile op on the score tile
    /// instead of in the kernel's mask loop; its backward is the generated code's.
    #[must_use]
    pub fn score(mut self, f: impl Fn(&ScoreArgs<'_>, &UOp) -> UOp + Send + Sync + 'static) -> Self {
        self.score = Some(Arc::new(f));
        self
    }

    /// Sets the mask function.
    #[must_use]
    pub fn mask(mut self, f: impl Fn(&ScoreArgs<'_>) -> UOp + Send + Sync + 'static) -> Self {
        self.mask = Some(Arc::new(f));
        self
    }

    /// Attention sinks: one extra logit per query head (the captured tensor `logits`, of shape
    /// `[heads]` and dtype F32) in every row's softmax denominator, with no value.
    #[must_use]
    pub fn sinks(mut self, logits: Capture) -> Self {
        self.sinks = Some(logits);
        self
    }

    /// These mods without their mask function (the kernel applies an equivalent mask).
    pub(crate) fn without_mask(&self) -> AttentionMods {
        AttentionMods { mask: None, ..self.clone() }
    }

    /// These mods without their score function (the kernel runs an equivalent tile op).
    pub(crate) fn without_score(&self) -> AttentionMods {
        AttentionMods { score: None, ..self.clone() }
    }

    /// The captured tensors, in declaration order.
    pub fn captures(&self) -> &[CaptureSpec] {
        &self.captures
    }

    /// The sink logits' capture, when set.
    pub fn sink_logits(&self) -> Option<Capture> {
        self.sinks
    }

    /// Whether sinks are set.
    pub fn has_sink_logits(&self) -> bool {
        self.sinks.is_some()
    }

    /// Whether a score function is set.
    pub fn has_score(&self) -> bool {
        self.score.is_some()
    }

    /// Whether a mask function is set.
    pub fn has_mask(&self) -> bool {
        self.mask.is_some()
    }

    /// The functions built over `args`' indices and `buffers` (one per capture): the modified
    /// score of `score` (None without a score function) and the mask (None without one), and
    /// the problems found while building them.
    pub(crate) fn build(
        &self,
        (b, h, q, kv): (&UOp, &UOp, &UOp, &UOp),
        buffers: &[UOp],
        score: Option<&UOp>,
    ) -> (Option<UOp>, Option<UOp>, Vec<String>) {
        let problems = RefCell::new(Vec::new());
        let args = ScoreArgs {
            b: b.clone(),
            h: h.clone(),
            q: q.clone(),
            kv: kv.clone(),
            buffers,
            specs: &self.captures,
            problems: &problems,
        };
        let s = match (&self.score, score) {
            (Some(f), Some(s)) => Some(f(&args, s)),
            _ => None,
        };
        let m = self.mask.as_ref().map(|f| f(&args));
        (s, m, problems.into_inner())
    }

    /// The captures' buffers, from slot `first` on.
    pub(crate) fn buffers(&self, first: usize) -> Vec<UOp> {
        self.captures.iter().enumerate().map(|(i, c)| buffer(first + i, c.dtype, c.len())).collect()
    }

    /// Whether each capture is read by the functions `reads` names: a kernel's buffer slots
    /// hold only the captures it reads (a program's slots have no gaps).
    pub(crate) fn captures_read(&self, reads: Reads) -> Vec<bool> {
        let [b, h, q, kv] = placeholders();
        let buffers = self.buffers(0);
        let s = idx(0).cast(DType::F32);
        let (score, mask, _) = self.build((&b, &h, &q, &kv), &buffers, Some(&s));
        let roots: Vec<UOp> =
            [score.filter(|_| reads.score), mask.filter(|_| reads.mask)].into_iter().flatten().collect();
        let nodes = UOp::toposort(&roots);
        buffers
            .iter()
            .enumerate()
            .map(|(i, buf)| nodes.contains(buf) || (reads.sinks && self.sinks.is_some_and(|c| c.0 == i)))
            .collect()
    }

    /// Whether each capture gets a gradient from the backward kernel: an F32 capture it reads.
    pub(crate) fn captures_with_gradient(&self) -> Vec<bool> {
        let read = self.captures_read(Reads::BACKWARD);
        self.captures.iter().zip(read).map(|(spec, read)| read && spec.dtype == DType::F32).collect()
    }

    /// The captures' buffers for a kernel that reads those `used` (see
    /// [`AttentionMods::captures_read`]): in slots `first, first + 1, ..` in declaration order;
    /// the others in slots no program has (they are never read, so never emitted).
    pub(crate) fn buffers_used(&self, first: usize, used: &[bool]) -> Vec<UOp> {
        let mut next = first;
        self.captures
            .iter()
            .zip(used)
            .enumerate()
            .map(|(i, (c, &read))| {
                let slot = if read {
                    next += 1;
                    next - 1
                } else {
                    UNREAD_SLOTS + i
                };
                buffer(slot, c.dtype, c.len())
            })
            .collect()
    }

    /// The mask function over [`placeholders`] and its key bounds, for the choices made before
    /// a kernel is built; `None` without a mask function.
    pub(crate) fn mask_analysis(&self) -> Option<MaskAnalysis> {
        let [b, h, q, kv] = placeholders();
        let (_, mask, _) = self.build((&b, &h, &q, &kv), &self.buffers(0), None);
        let mask = mask?;
        Some(MaskAnalysis {
            bounds: KeyBounds::of(&mask, &kv),
            reads_head: UOp::toposort(std::slice::from_ref(&mask)).contains(&h),
            q,
        })
    }

    /// Checks the functions once over placeholder indices: a score of a float type, a Bool
    /// mask, captures read with one index per axis, sinks of shape `[heads]`.
    pub(crate) fn check(&self, heads: usize) -> Result<(), String> {
        for spec in &self.captures {
            if !matches!(spec.dtype, DType::F32 | DType::I32) {
                return Err(format!("capture `{}` is {}, want F32 or I32", spec.name, spec.dtype));
            }
        }
        if let Some(c) = self.sinks {
            let spec = self.captures.get(c.0).ok_or("the sinks' capture is not one of these mods'")?;
            if spec.shape != [heads] || spec.dtype != DType::F32 {
                return Err(format!(
                    "sink logits `{}` are {} of shape {:?}, want F32 of shape [{heads}]",
                    spec.name, spec.dtype, spec.shape
                ));
            }
        }
        let [b, h, q, kv] = placeholders();
        let s = idx(0).cast(DType::F32);
        let (score, mask, problems) = self.build((&b, &h, &q, &kv), &self.buffers(0), Some(&s));
        if let Some(p) = problems.into_iter().next() {
            return Err(p);
        }
        if let Some(s) = score
            && !s.dtype().is_float()
        {
            return Err(format!("the score function returns {}, want a float", s.dtype()));
        }
        if let Some(m) = mask
            && m.dtype() != DType::Bool
        {
            return Err(format!("the mask function returns {}, want Bool", m.dtype()));
        }
        Ok(())
    }
}

/// The score function built over placeholder indices, a placeholder score and the captures'
/// buffers: what the analyses before a kernel's build read (the backward's derivative and
/// tiles, the soft-cap's recognition).
pub(crate) struct ScoreFunction {
    /// The modified score.
    pub f: UOp,
    /// The load standing for the score.
    pub score: UOp,
    /// The captures' buffers, in declaration order.
    pub buffers: Vec<UOp>,
}

impl ScoreFunction {
    /// `mods`' score function, `None` without one.
    pub(crate) fn of(mods: &AttentionMods) -> Option<ScoreFunction> {
        let [b, h, q, kv] = placeholders();
        let buffers = mods.buffers(0);
        let score = buffer(buffers.len(), DType::F32, 1).index(idx(0)).load();
        let (f, _, _) = mods.build((&b, &h, &q, &kv), &buffers, Some(&score));
        Some(ScoreFunction { f: f?, score, buffers })
    }
}

/// Which of the mods' functions a kernel runs ([`AttentionMods::captures_read`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reads {
    /// The score function.
    pub score: bool,
    /// The mask function.
    pub mask: bool,
    /// The sinks' step.
    pub sinks: bool,
}

impl Reads {
    /// The forward attention kernel's: every function.
    pub const ALL: Reads = Reads { score: true, mask: true, sinks: true };
    /// The per-run plan's counting kernel: the mask.
    pub const MASK: Reads = Reads { score: false, mask: true, sinks: false };
    /// The backward's: the score and mask functions (the sinks reach it through the lse).
    pub const BACKWARD: Reads = Reads { score: true, mask: true, sinks: false };
}

/// Which captures each kernel of a compiled attention reads, read off the functions once at
/// compile time (each is an analysis over placeholders, not to be run again per call).
#[derive(Clone, Debug, Default)]
pub(crate) struct CaptureReads {
    /// The forward attention kernel's ([`Reads::ALL`]).
    pub all: Vec<bool>,
    /// The per-run plan's counting kernel's ([`Reads::MASK`]).
    pub mask: Vec<bool>,
    /// The backward kernel's ([`Reads::BACKWARD`]).
    pub backward: Vec<bool>,
    /// The captures the backward differentiates ([`AttentionMods::captures_with_gradient`]).
    pub with_gradient: Vec<bool>,
}

impl CaptureReads {
    /// What `mods`' kernels read.
    pub fn of(mods: &AttentionMods) -> CaptureReads {
        CaptureReads {
            all: mods.captures_read(Reads::ALL),
            mask: mods.captures_read(Reads::MASK),
            backward: mods.captures_read(Reads::BACKWARD),
            with_gradient: mods.captures_with_gradient(),
        }
    }
}

/// Where captures a kernel does not read are numbered from (past any program's slots).
const UNREAD_SLOTS: usize = 1 << 20;

/// What [`AttentionMods::mask_analysis`] finds.
pub(crate) struct MaskAnalysis {
    /// The key bounds read off the mask.
    pub bounds: KeyBounds,
    /// Whether the mask reads the head index.
    pub reads_head: bool,
    /// The placeholder standing for the query row in the bounds.
    pub q: UOp,
}

/// Four RANGEs that stand for `b`, `h`, `q` and `kv` in an analysis (never in a program: their
/// ids are far past any program's).
pub(crate) fn placeholders() -> [UOp; 4] {
    std::array::from_fn(|i| range(1usize << 30, (1usize << 30) + i, AxisType::Loop))
}

/// Where the keys a query row sees start and end, read off a mask's conjuncts: the row sees
/// no key below any `start` or at or past any `end` (each an INDEX expression free of the key).
/// `exact` when those comparisons are the whole mask, so a key inside every bound is seen.
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyBounds {
    pub start: Vec<UOp>,
    pub end: Vec<UOp>,
    pub exact: bool,
}

impl KeyBounds {
    /// The bounds of `mask` over the key `kv`.
    pub fn of(mask: &UOp, kv: &UOp) -> KeyBounds {
        let mut kb = KeyBounds { exact: true, ..KeyBounds::default() };
        for c in conjuncts(mask) {
            if let Some((a, b)) = disjuncts(&c) {
                match union_bound(&KeyBounds::of(a, kv), &KeyBounds::of(b, kv)) {
                    Some((true, s)) => kb.start.push(s),
                    Some((false, e)) => kb.end.push(e),
                    None => kb.exact = false,
                }
                continue;
            }
            match comparison_bound(&c, kv) {
                Some((true, s)) => kb.start.push(s),
                Some((false, e)) => kb.end.push(e),
                None => kb.exact = false,
            }
        }
        kb
    }

    /// Whether any bound was read off: the keys some row sees start or end somewhere.
    pub fn is_bounded(&self) -> bool {
        !(self.start.is_empty() && self.end.is_empty())
    }

    /// For one query row and a block of `cols` keys from key `first`: the column of the row's
    /// first seen key (the greatest start) and that of the first key past them (the least
    /// end), each clamped to `0..=cols`; `None` without starts, or without ends. The row sees
    /// the columns between them: a row that sees none of the block has the columns before the
    /// first and those from the second cover it.
    pub fn block_columns(self, first: &UOp, cols: usize) -> (Option<UOp>, Option<UOp>) {
        let column = |x: UOp| min_idx(&(&x - first).maximum(idx(0)), &idx(cols as i64));
        let seen_from = self.start.into_iter().reduce(|a, b| a.maximum(&b)).map(column);
        let seen_to = self.end.into_iter().reduce(|a, b| min_idx(&a, &b)).map(column);
        (seen_from, seen_to)
    }

    /// Over a block of query rows, `[lowest, seen_from, seen_to, highest]`: no row sees a key
    /// below `lowest` or from `highest` on, and every row sees the keys from `seen_from` to
    /// `seen_to` (an empty span, `n_k` to 0, unless these bounds are the whole mask and each
    /// is read off). `over(e, least)` is bound `e`'s least (or greatest) value over the rows,
    /// `None` when it cannot be read off; such a bound is left out of `lowest` and `highest`,
    /// which only widens them. Unclamped.
    pub fn extremes(&self, over: impl Fn(&UOp, bool) -> Option<UOp>, n_k: i64) -> [UOp; 4] {
        let fold = |xs: Vec<UOp>, max: bool| {
            xs.into_iter().reduce(|a, b| if max { a.maximum(&b) } else { min_idx(&a, &b) })
        };
        let lowest = fold(self.start.iter().filter_map(|s| over(s, true)).collect(), true);
        let highest = fold(self.end.iter().filter_map(|e| over(e, false)).collect(), false);
        let starts: Option<Vec<UOp>> = self.start.iter().map(|s| over(s, false)).collect();
        let ends: Option<Vec<UOp>> = self.end.iter().map(|e| over(e, true)).collect();
        let (seen_from, seen_to) = match (starts, ends) {
            (Some(s), Some(e)) if self.exact => {
                (fold(s, true).unwrap_or_else(|| idx(0)), fold(e, false).unwrap_or_else(|| idx(n_k)))
            }
            _ => (idx(n_k), idx(0)),
        };
        [lowest.unwrap_or_else(|| idx(0)), seen_from, seen_to, highest.unwrap_or_else(|| idx(n_k))]
    }
}

/// `a || b` as `where(a, true, b)` (what [`or`] builds).
fn disjuncts(m: &UOp) -> Option<(&UOp, &UOp)> {
    let w = m.as_where()?;
    let is_true = w.then.const_value() == Some(uopc_ir::ConstValue::Bool(true));
    (is_true && w.otherwise.dtype() == DType::Bool).then_some((w.cond, w.otherwise))
}

/// The exact bound of the union of two exact key sets that are both prefixes (ends only: the
/// union ends at the later end) or both suffixes (starts only: it starts at the earlier
/// start), as `(is_start, bound)`; `None` otherwise (a prefix-LM mask, `kv < prefix || kv <=
/// q`, is two prefixes).
fn union_bound(a: &KeyBounds, b: &KeyBounds) -> Option<(bool, UOp)> {
    if !(a.exact && b.exact) {
        return None;
    }
    let least = |xs: &[UOp]| xs.iter().cloned().reduce(|x, y| min_idx(&x, &y));
    let greatest = |xs: &[UOp]| xs.iter().cloned().reduce(|x, y| x.maximum(&y));
    match (a.start.is_empty(), a.end.is_empty(), b.start.is_empty(), b.end.is_empty()) {
        (true, false, true, false) => Some((false, least(&a.end)?.maximum(&least(&b.end)?))),
        (false, true, false, true) => Some((true, min_idx(&greatest(&a.start)?, &greatest(&b.start)?))),
        _ => None,
    }
}

/// The conjuncts of a Bool expression: `where(a, b, false)` splits, a true constant has none.
fn conjuncts(m: &UOp) -> Vec<UOp> {
    if let Some(w) = m.as_where()
        && w.otherwise.const_value().is_some_and(|c| c == uopc_ir::ConstValue::Bool(false))
        && w.then.dtype() == DType::Bool
    {
        let mut all = conjuncts(w.cond);
        all.extend(conjuncts(w.then));
        return all;
    }
    if m.const_value() == Some(uopc_ir::ConstValue::Bool(true)) {
        return Vec::new();
    }
    vec![m.clone()]
}

/// `(true, start)` when `c` holds exactly for `kv >= start`, `(false, end)` when exactly for
/// `kv < end`: an integer `x < y` with `x - y = ±kv + rest`.
fn comparison_bound(c: &UOp, kv: &UOp) -> Option<(bool, UOp)> {
    let (op, x, y) = c.as_binary()?;
    if op != BinaryOp::CmpLt || !matches!(x.dtype(), DType::I32 | DType::I64) {
        return None;
    }
    match linear_in(&(x - y), kv)? {
        // kv + rest < 0
        (1, rest) => Some((false, -rest)),
        // rest - kv < 0
        (-1, rest) => Some((true, rest + 1)),
        _ => None,
    }
}

/// `a == b` for integer expressions (document ids, positions), as a Bool.
pub fn eq(a: &UOp, b: &UOp) -> UOp {
    a.ne(b).where_(boolc(false), boolc(true))
}
