//! Activations on [`TileOp::Activation`]: which kernel bodies end in one (the epilogue of a
//! GEMM, [`crate::epilogue`], asks too), and an elementwise kernel that is one, lowered as
//! rangeify's loop over the activation's argument with the tile op applied to each row right
//! after the loop wrote it; or that multiplies one by another value (a gated unit), lowered
//! through a row buffer. Elementwise kernels that end in rounding to a 16-bit float take the
//! conversion's tile op per row the same way (a plain conversion straight from its source).

use crate::error::Result;
use crate::rangeify::{Ctx, lower};
use uopc_ir::{AxisType, BinaryOp, ConstValue, DType, Op, TileOp, UOp, idx, simplify, sink, tile};
use uopc_tile::Activation;

/// A unary tensor op, as a function.
type TensorOp = fn(&crate::Tensor) -> crate::Tensor;

/// The activations an epilogue hands to [`TileOp::Activation`], each with the tensor op that
/// builds it: a body that is exactly that op's graph over some value is that value's loop,
/// then the tile op over the block.
const TILE_ACTIVATIONS: [(Activation, TensorOp); 3] = [
    (Activation::GeluTanh, crate::Tensor::gelu_tanh),
    (Activation::Silu, crate::Tensor::silu),
    (Activation::Gelu, crate::Tensor::gelu),
];

/// `Some((x, kind))` when `body` is the graph `kind` builds over `x` (a factor of `body`'s
/// product, or of its first factor's), with what only autograd reads dropped as the kernelizer
/// drops it: the tensor op
/// is run on `x` and the graphs compared by identity (nodes are hash-consed), so a body
/// matches only if every node is the one the op builds.
pub(crate) fn tile_activation(body: &UOp) -> Option<(UOp, Activation)> {
    if body.dtype() != DType::F32 || !gated_product(body) {
        return None;
    }
    // x is a factor of the product, or (exact GELU) of its first factor.
    let factors = body.src().iter().flat_map(|f| match f.as_binary() {
        Some((BinaryOp::Mul, a, b)) => vec![f, a, b],
        _ => vec![f],
    });
    let factors: Vec<&UOp> = factors.collect();
    TILE_ACTIVATIONS.iter().find_map(|&(kind, build)| {
        factors.iter().find_map(|&x| {
            let built = build(&crate::Tensor::from_uop(x.clone()));
            let (canonical, _) = crate::passes::canonicalize(std::slice::from_ref(built.uop()));
            (canonical.first() == Some(body)).then(|| (x.clone(), kind))
        })
    })
}

/// Whether `body` has the outline of an activation: `x * sigmoid(z)`, the sigmoid a select
/// between its two tails (GELU's tanh form, SiLU), or `(x * (erf(..) + 1)) * 1/2`, erf's sign
/// a select (exact GELU). Other bodies are not worth building the activations' graphs for.
fn gated_product(body: &UOp) -> bool {
    let is = |u: &UOp, op: BinaryOp| matches!(u.op(), Op::Binary(b) if *b == op);
    let any_src = |u: &UOp, f: &dyn Fn(&UOp) -> bool| u.src().iter().any(f);
    let select = |u: &UOp| matches!(u.op(), Op::Where);
    is(body, BinaryOp::Mul)
        && (any_src(body, &select)
            || any_src(body, &|p| {
                is(p, BinaryOp::Mul) && any_src(p, &|sum| is(sum, BinaryOp::Add) && any_src(sum, &select))
            }))
}

/// `Some((x, kind))` when `body` is the gradient autograd derives for `kind`'s graph over `x`
/// with `cotangent` ([`crate::autograd::vjp`]), what only autograd reads dropped as the
/// kernelizer drops it: a GEMM epilogue in a training step's backward, whose GEMM computes
/// the gradient arriving at the activation. The candidates for `x` are the argument of every
/// sigmoid select's comparison (SiLU's input), every value squared (GELU's) and the factor of
/// every scaled value squared (exact GELU's), each tried
/// with every activation by building its gradient and comparing the graphs by identity.
pub(crate) fn tile_activation_grad(body: &UOp, cotangent: &UOp) -> Option<(UOp, Activation)> {
    if body.dtype() != DType::F32 || !matches!(body.op(), Op::Binary(BinaryOp::Add)) {
        return None;
    }
    let mut candidates: Vec<UOp> = Vec::new();
    for u in UOp::toposort(std::slice::from_ref(body)) {
        let x = match (u.op(), u.src()) {
            (Op::Where, [cond, ..]) => match cond.as_binary() {
                Some((BinaryOp::CmpLt, z, _)) => z.clone(),
                _ => continue,
            },
            (Op::Binary(BinaryOp::Mul), [a, b]) if a == b => a.clone(),
            _ => continue,
        };
        // Exact GELU squares its argument scaled (erf's slope at `x / sqrt 2`).
        let scaled = match x.as_binary() {
            Some((BinaryOp::Mul, y, c)) if c.const_value().is_some() => Some(y.clone()),
            _ => None,
        };
        for x in std::iter::once(x).chain(scaled) {
            if !candidates.contains(&x) {
                candidates.push(x);
            }
        }
    }
    let g = crate::Tensor::from_uop(cotangent.clone());
    candidates.into_iter().find_map(|x| {
        let xt = crate::Tensor::from_uop(x.clone());
        TILE_ACTIVATIONS.iter().find_map(|&(kind, build)| {
            let grad = crate::autograd::vjp(&build(&xt), &[&xt], &g).ok()?;
            let (canonical, _) = crate::passes::canonicalize(std::slice::from_ref(grad[0].uop()));
            (canonical.first() == Some(body)).then(|| (x.clone(), kind))
        })
    })
}

/// The program of an f32 elementwise kernel `body` that ends in an activation of
/// [`TILE_ACTIVATIONS`], writing `out`: rangeify's program for the activation's argument,
/// when it is one THREAD loop over rows around one loop over each row's `n` contiguous
/// elements, with the tile op applied to each row after it; `None` for any other body or
/// program shape (rangeify then lowers the whole body).
pub(crate) fn lower_activation_rows(body: &UOp, out: &UOp, ctx: &mut Ctx) -> Option<Result<UOp>> {
    if out.dtype() != DType::F32 {
        return None;
    }
    let (x, kind) = tile_activation(body)?;
    let program = match lower(&x, out, ctx) {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    let [nest] = program.src() else { return None };
    let outer = nest.as_end()?;
    let inner = outer.body.as_end()?;
    let (thread, col) = (outer.range.as_range()?, inner.range.as_range()?);
    let store = inner.body.as_store()?;
    let n = match col.end.const_value()? {
        ConstValue::Int(n) => usize::try_from(n).ok()?,
        _ => return None,
    };
    let at = store.index.as_index()?;
    let row_start = simplify(&(outer.range * n as i64));
    let contiguous = *at.offset == simplify(&(&row_start + inner.range)) && at.base == out;
    if thread.axis != AxisType::Thread || col.axis != AxisType::Loop || !contiguous {
        return None;
    }
    let act = TileOp::Activation { rows: 1, cols: n, ld: n, kind };
    let row = tile(act, &[out.after(std::slice::from_ref(outer.body)).index(&row_start)]);
    Some(Ok(sink(&[row.end(std::slice::from_ref(outer.range))])))
}

/// The widest row an elementwise kernel keeps in a buffer of its own on the worker's stack
/// (the row lowerings below).
const ROW_BUFFER_MAX: usize = 16 * 1024;

/// The narrowest row the row lowerings take: one AVX-512 vector. A tile op call per shorter
/// row costs more than the loop it replaces.
const ROW_MIN: usize = 16;

/// `Some((x, kind, y))` when `product` is `act(x) * y` (either order), `act` one of
/// [`TILE_ACTIVATIONS`] matched as [`tile_activation`] matches it: a gated linear unit
/// (SwiGLU's `silu(gate) * up`, GeGLU's).
fn gated_activation(product: &UOp) -> Option<(UOp, Activation, UOp)> {
    let Some((BinaryOp::Mul, a, b)) = product.as_binary() else { return None };
    if product.dtype() != DType::F32 {
        return None;
    }
    let gated = |act: &UOp, y: &UOp| tile_activation(act).map(|(x, kind)| (x, kind, y.clone()));
    gated(a, b).or_else(|| gated(b, a))
}

/// The loops of a row lowering over an output of `shape` (rows of its last axis, at least
/// [`ROW_MIN`] wide, so a row always has its loop): a THREAD loop over the rows, absent for
/// one row (its index is 0: simplify folds a RANGE of one iteration, so an END of it would
/// close a loop its body never opened), and loops over a row's elements.
struct RowLoops<'a> {
    leading: &'a [usize],
    n: usize,
    row: Option<UOp>,
}

impl<'a> RowLoops<'a> {
    /// The loops over `shape`, or `None` for an empty output or rows narrower than
    /// [`ROW_MIN`] or wider than [`ROW_BUFFER_MAX`].
    fn new(shape: &'a [usize], ctx: &mut Ctx) -> Option<RowLoops<'a>> {
        let (&n, leading) = shape.split_last()?;
        let rows: usize = leading.iter().product();
        if rows == 0 || !(ROW_MIN..=ROW_BUFFER_MAX).contains(&n) {
            return None;
        }
        let row = (rows > 1).then(|| ctx.fresh_range(rows, AxisType::Thread, &[]));
        Some(RowLoops { leading, n, row })
    }

    /// The row's index (0 for one row).
    fn row_index(&self) -> UOp {
        self.row.clone().unwrap_or_else(|| idx(0))
    }

    /// A fresh loop over a row's elements.
    fn column(&self, ctx: &mut Ctx) -> UOp {
        ctx.fresh_range(self.n, AxisType::Loop, self.row.as_slice())
    }

    /// `u`'s value at element `column` (a loop over the row, or a constant) of the row, computed
    /// within the row's loop and that column loop.
    fn value(&self, ctx: &mut Ctx, u: &UOp, column: &UOp) -> Result<UOp> {
        let mut index = crate::view::unravel(&self.row_index(), self.leading);
        index.push(column.clone());
        let loops: Vec<UOp> = self
            .row
            .iter()
            .chain(std::iter::once(column).filter(|c| c.as_range().is_some()))
            .cloned()
            .collect();
        ctx.value_within(u, &index, &loops)
    }

    /// A row buffer of f32, one per task.
    fn buffer(&self, ctx: &mut Ctx) -> UOp {
        let row = ctx.fresh_alloc(DType::F32, self.n);
        match &self.row {
            Some(r) => row.after(std::slice::from_ref(r)),
            None => row,
        }
    }

    /// The flat output offset of the row's first element.
    fn row_start(&self) -> UOp {
        simplify(&(self.row_index() * self.n as i64))
    }

    /// The row buffer `buffer`, once `written` has filled it, rounded into `out`'s row by one
    /// [`TileOp::Convert`] (16 values per instruction where a CAST in a loop takes four).
    fn round_into(&self, buffer: &UOp, written: &UOp, out: &UOp) -> UOp {
        let convert = TileOp::Convert { rows: 1, cols: self.n, lds: self.n, ldd: self.n };
        tile(convert, &[buffer.after(std::slice::from_ref(written)).index(0), out.index(self.row_start())])
    }

    /// The kernel: `effect` closed by the row loop, if there is one.
    fn program(&self, effect: UOp) -> UOp {
        sink(&[self.row.iter().fold(effect, |e, r| e.end(std::slice::from_ref(r)))])
    }
}

/// The program of an elementwise kernel `body` that is a gated activation `act(x) * y`
/// ([`gated_activation`]), perhaps rounded to `out`'s dtype, over rows of at most
/// [`ROW_BUFFER_MAX`] elements: per row (a THREAD task), a loop writes `x` into a row buffer,
/// the activation's tile op runs over it, and a second loop writes `act(x) * y` (into the row
/// buffer when `out` is 16-bit, which [`TileOp::Convert`] then rounds into `out`). `None` for
/// any other body (rangeify then lowers it, computing the activation in the loop).
pub(crate) fn lower_gated_activation_rows(body: &UOp, out: &UOp, ctx: &mut Ctx) -> Option<Result<UOp>> {
    let product = match body.op() {
        Op::Cast if body.dtype() == out.dtype() => &body.src()[0],
        _ => body,
    };
    let (x, kind, y) = gated_activation(product)?;
    if !(out.dtype() == DType::F32 || out.dtype().is_half()) {
        return None;
    }
    let rl = RowLoops::new(body.shape(), ctx)?;
    Some(gated_program(&rl, ctx, (&x, kind, &y), out))
}

/// [`lower_gated_activation_rows`]'s program over `rl` for `act(x) * y`.
fn gated_program(
    rl: &RowLoops<'_>,
    ctx: &mut Ctx,
    (x, kind, y): (&UOp, Activation, &UOp),
    out: &UOp,
) -> Result<UOp> {
    let n = rl.n;
    let x_row = rl.buffer(ctx);
    let c = rl.column(ctx);
    let written = x_row.index(&c).store(rl.value(ctx, x, &c)?).end(std::slice::from_ref(&c));
    let act = TileOp::Activation { rows: 1, cols: n, ld: n, kind };
    let activated = tile(act, &[x_row.after(std::slice::from_ref(&written)).index(0)]);
    let c = rl.column(ctx);
    let v = x_row.after(std::slice::from_ref(&activated)).index(&c).load() * rl.value(ctx, y, &c)?;
    let row_done = if out.dtype() == DType::F32 {
        out.index(simplify(&(rl.row_start() + &c))).store(v).end(std::slice::from_ref(&c))
    } else {
        // A 16-bit output: the products go back into the row buffer, which one conversion
        // rounds.
        let multiplied = x_row.index(&c).store(v).end(std::slice::from_ref(&c));
        rl.round_into(&x_row, &multiplied, out)
    };
    Ok(rl.program(row_done))
}

/// Whether a conversion from `from` to `to` is one [`TileOp::Convert`] performs.
fn converts(from: DType, to: DType) -> bool {
    (from.is_half() && to == DType::F32) || (from == DType::F32 && to.is_half())
}

/// The program of an elementwise kernel `body` that only converts between f32 and a 16-bit
/// float, reading each output row from one contiguous run of its input (a widening copy of a
/// bf16 residual stream, a rounding copy back): one [`TileOp::Convert`] per row, 16 values per
/// instruction where a CAST in rangeify's loop takes four. `None` for any other body.
pub(crate) fn lower_convert_rows(body: &UOp, out: &UOp, ctx: &mut Ctx) -> Option<Result<UOp>> {
    let source = body.src().first()?;
    if !matches!(body.op(), Op::Cast) || body.dtype() != out.dtype() || !converts(source.dtype(), out.dtype())
    {
        return None;
    }
    // The row lowerings compute one element at a time, without rangeify's accumulators.
    if crate::opt::has_reduce(source) {
        return None;
    }
    let rl = RowLoops::new(body.shape(), ctx)?;
    let c = rl.column(ctx);
    let (value, first) = match (rl.value(ctx, source, &c), rl.value(ctx, source, &idx(0))) {
        (Ok(v), Ok(f)) => (v, f),
        (Err(e), _) | (_, Err(e)) => return Some(Err(e)),
    };
    // The source must be one load whose offset is its first column's plus the column.
    let (at, row_start) = (value.as_load()?.as_index()?, first.as_load()?.as_index()?.offset.clone());
    if *at.offset != simplify(&(&row_start + &c)) || at.base.dtype() != source.dtype() {
        return None;
    }
    let n = rl.n;
    let convert = TileOp::Convert { rows: 1, cols: n, lds: n, ldd: n };
    let row = tile(convert, &[at.base.index(&row_start), out.index(rl.row_start())]);
    Some(Ok(rl.program(row)))
}

/// The program of an elementwise kernel `body` that computes an f32 value and rounds it to a
/// 16-bit float (a normalization's output in a bf16 model), over rows of at most
/// [`ROW_BUFFER_MAX`] elements and without a reduction inside: per row a loop writes the f32
/// values into a row buffer and one [`TileOp::Convert`] rounds it into `out`. `None` for any
/// other body.
pub(crate) fn lower_rounded_rows(body: &UOp, out: &UOp, ctx: &mut Ctx) -> Option<Result<UOp>> {
    let value = body.src().first()?;
    if !matches!(body.op(), Op::Cast) || body.dtype() != out.dtype() || !out.dtype().is_half() {
        return None;
    }
    if value.dtype() != DType::F32 || crate::opt::has_reduce(value) {
        return None;
    }
    let rl = RowLoops::new(body.shape(), ctx)?;
    let row = rl.buffer(ctx);
    let c = rl.column(ctx);
    let written = match rl.value(ctx, value, &c) {
        Ok(v) => row.index(&c).store(v).end(std::slice::from_ref(&c)),
        Err(e) => return Some(Err(e)),
    };
    Some(Ok(rl.program(rl.round_into(&row, &written, out))))
}
