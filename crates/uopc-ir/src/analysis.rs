//! Questions a backend asks of a verified, simplified loop program: which memory it writes,
//! whether its THREAD iterations can run at once, which ALLOCs fit in registers, which
//! multiplies fuse into their add, and whether it is a register-tiled GEMM.
//!
//! Each answer is a plain function of the program (its nodes in toposort order, or its
//! linearization), so a backend asks them once per kernel (see [`crate::prepare`]) and the
//! answers can be tested without generating code.

use crate::dtype::DType;
use crate::linearize::{Linear, Stmt};
use crate::uop::{BinaryOp, Op, UOp, UnaryOp};
use crate::verify::view_base;
use std::collections::{HashMap, HashSet};

mod disjoint;
pub use disjoint::threads_write_disjoint;

/// What a compiled program expects in one argument slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    /// Argument position.
    pub slot: usize,
    /// Element type.
    pub dtype: DType,
    /// Exact number of elements.
    pub len: usize,
    /// Whether the program stores to it (it must then be passed mutably).
    pub written: bool,
}

/// What a compiled program expects in one variable slot: a scalar INDEX value in `lo..=hi`
/// (a VAR of the program, [`crate::var`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VarSpec {
    /// Variable position (variables are numbered `0..n`, apart from buffer slots).
    pub slot: usize,
    /// The smallest value the program accepts.
    pub lo: i64,
    /// The largest value the program accepts: every bounds proof holds up to it.
    pub hi: i64,
}

impl VarSpec {
    /// Whether `value` lies in `lo..=hi`.
    pub fn admits(&self, value: i64) -> bool {
        (self.lo..=self.hi).contains(&value)
    }
}

impl std::fmt::Display for VarSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "variable {} in {}..={}", self.slot, self.lo, self.hi)
    }
}

/// One [`VarSpec`] per VAR of `vars` (a [`Linear`]'s variables, sorted by slot).
pub fn var_specs(vars: &[UOp]) -> Vec<VarSpec> {
    vars.iter()
        .filter_map(|v| match v.op() {
            Op::Var { slot, lo, hi } => Some(VarSpec { slot: slot.index(), lo: *lo, hi: *hi }),
            _ => None,
        })
        .collect()
}

/// The BUFFERs and ALLOCs some STORE or tile op among `nodes` writes, in the order the writes
/// appear (a base written twice is listed twice).
pub fn written_bases<'a>(nodes: impl IntoIterator<Item = &'a UOp>) -> Vec<UOp> {
    let mut out = Vec::new();
    for u in nodes {
        match u.op() {
            Op::Store => out.extend(u.as_store().and_then(|s| s.index.indexed_base()).cloned()),
            Op::Tile(t) => {
                for (x, o) in u.src().iter().zip(t.operands()) {
                    if o.writes {
                        out.extend(x.indexed_base().cloned());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// One [`BufferSpec`] per BUFFER of `buffers` (a [`Linear`]'s buffers, sorted by slot), marked
/// written when it is among `written` (from [`written_bases`]).
pub fn buffer_specs(buffers: &[UOp], written: &[UOp]) -> Vec<BufferSpec> {
    buffers
        .iter()
        .filter_map(|b| match b.op() {
            Op::Buffer { slot, len } => Some(BufferSpec {
                slot: slot.index(),
                dtype: b.dtype(),
                len: *len,
                written: written.contains(b),
            }),
            _ => None,
        })
        .collect()
}

/// The statements of `lin` that are ops (not loops), depth first.
fn op_statements(lin: &Linear) -> Vec<&UOp> {
    lin.walk()
        .into_iter()
        .filter_map(|(_, s)| match s {
            Stmt::Op(u) => Some(u),
            Stmt::Loop { .. } => None,
        })
        .collect()
}

/// The ALLOCs of `lin` that can live in registers instead of memory: at most 32 elements, only
/// ever indexed by constants (so every element is a distinct scalar), and no tile op's operand
/// (a tile op takes its operands' addresses).
pub fn register_allocs(lin: &Linear) -> HashSet<UOp> {
    let ops = op_statements(lin);
    let tile_operands: HashSet<&UOp> = ops
        .iter()
        .filter(|u| matches!(u.op(), Op::Tile(_)))
        .flat_map(|u| u.src().iter().filter_map(|x| x.indexed_base()))
        .collect();
    lin.allocs
        .iter()
        .filter(|a| {
            !tile_operands.contains(a)
                && matches!(a.op(), Op::Alloc { len, .. } if *len <= 32)
                && ops.iter().all(|u| match u.as_index() {
                    Some(i) if view_base(i.base) == Some(*a) => i.offset.const_int().is_some(),
                    _ => true,
                })
        })
        .cloned()
        .collect()
}

/// Float MULs of `lin` used exactly once, by a float ADD of two different operands: `a*b + c`
/// may become one fused multiply-add (like `-ffp-contract=fast`: one rounding instead of two).
/// An ADD contracts at most one MUL, its first MUL operand.
pub fn contractible_muls(lin: &Linear) -> HashSet<UOp> {
    let mut uses: HashMap<UOp, usize> = HashMap::new();
    let mut add_operands: Vec<UOp> = Vec::new();
    for u in op_statements(lin) {
        for x in u.src() {
            *uses.entry(x.clone()).or_default() += 1;
        }
        if let Some((BinaryOp::Add, a, b)) = u.as_binary()
            && u.dtype().is_float()
            && a != b
            && let Some(m) = u.src().iter().find(|x| matches!(x.op(), Op::Binary(BinaryOp::Mul)))
        {
            add_operands.push(m.clone());
        }
    }
    add_operands.into_iter().filter(|m| uses.get(m) == Some(&1)).collect()
}

/// Whether `lin` is GEMM-like: some innermost loop updates four or more register accumulators
/// (ALLOCs in `registers`, from [`register_allocs`]) with `acc = acc + x` (a register tile),
/// and no statement computes an exp2, log2, sqrt or reciprocal. Such kernels want their
/// statements kept in the order emitted, which holds a register tile's loads next to their
/// uses; kernels with transcendental math gain more from reordering optimizations.
pub fn gemm_like(lin: &Linear, registers: &HashSet<UOp>) -> bool {
    let all = lin.walk();
    if all
        .iter()
        .any(|(_, s)| matches!(s, Stmt::Op(u) if matches!(u.op(), Op::Unary(op) if *op != UnaryOp::Neg)))
    {
        return false;
    }
    let in_registers = |index: &UOp| index.indexed_base().is_some_and(|b| registers.contains(b));
    all.iter().any(|(_, s)| {
        let Stmt::Loop { body, .. } = s else { return false };
        if !body.iter().all(|s| matches!(s, Stmt::Op(_))) {
            return false;
        }
        let updates = body
            .iter()
            .filter(|s| match s {
                Stmt::Op(u) => u.as_store().is_some_and(|s| {
                    in_registers(s.index) && matches!(s.value.as_binary(), Some((BinaryOp::Add, ..)))
                }),
                Stmt::Loop { .. } => false,
            })
            .count();
        updates >= 4
    })
}

/// ALLOCs of at least this many bytes start on a cache line ([`ALLOC_LINE_BYTES`]): tiles that
/// whole rows of 64 bytes are read from and written to (tile ops' operands) would otherwise
/// split every row access across two lines, while small arrays gain nothing from it.
pub const LINE_ALIGNED_ALLOC_MIN_BYTES: usize = 1024;

/// The cache line an ALLOC of [`LINE_ALIGNED_ALLOC_MIN_BYTES`] or more starts on; a backend
/// whose stack is aligned to less reserves this much more and aligns the start itself.
pub const ALLOC_LINE_BYTES: usize = 64;

/// Bytes of memory an ALLOC of `bytes` takes: its elements, and the room to align a large one
/// to a cache line.
pub fn alloc_bytes(bytes: usize) -> usize {
    if bytes >= LINE_ALIGNED_ALLOC_MIN_BYTES { bytes.saturating_add(ALLOC_LINE_BYTES) } else { bytes }
}

/// Bytes of memory the ALLOCs of `lin` need, each as [`alloc_bytes`] counts it (saturating: a
/// huge sum stays huge).
pub fn local_bytes(lin: &Linear) -> usize {
    lin.allocs
        .iter()
        .map(|a| match a.op() {
            Op::Alloc { len, .. } => alloc_bytes(len.saturating_mul(a.dtype().size())),
            _ => 0,
        })
        .fold(0usize, usize::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{alloc, buffer, range, sink, tile};
    use crate::linearize::linearize;
    use crate::uop::{AxisType, GemmShape, TileOp};

    fn topo(program: &UOp) -> Vec<UOp> {
        UOp::toposort(std::slice::from_ref(program))
    }

    /// `out[i] = a[i]` over a THREAD range of `n`.
    fn copy(n: usize) -> (UOp, UOp, UOp) {
        let (a, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
        let i = range(n, 0, AxisType::Thread);
        let program = sink(&[out.index(&i).store(a.index(&i).load()).end(&[i.clone()])]);
        (program, out, i)
    }

    #[test]
    fn written_bases_lists_stored_buffers_only() {
        let (program, out, _) = copy(8);
        assert_eq!(written_bases(&topo(&program)), vec![out]);
    }

    #[test]
    fn buffer_specs_mark_written_slots() {
        let (program, _, _) = copy(8);
        let lin = linearize(&program).unwrap();
        let specs = buffer_specs(&lin.buffers, &written_bases(&topo(&program)));
        let flags: Vec<(usize, bool, usize)> = specs.iter().map(|s| (s.slot, s.written, s.len)).collect();
        assert_eq!(flags, vec![(0, false, 8), (1, true, 8)]);
    }

    #[test]
    fn threads_writing_their_own_rows_are_disjoint() {
        let (program, _, i) = copy(8);
        assert!(threads_write_disjoint(&topo(&program), &i));
        // Rows of 4: out[4 t + j] for j < 4 is disjoint; j < 5 overlaps the next row.
        for (cols, disjoint) in [(4, true), (5, false)] {
            let out = buffer(0, DType::F32, 64);
            let t = range(8, 0, AxisType::Thread);
            let j = range(cols, 1, AxisType::Loop);
            let program = sink(&[out.index(&t * 4 + &j).store(1.0f32).end(&[j, t.clone()])]);
            assert_eq!(threads_write_disjoint(&topo(&program), &t), disjoint, "{cols} columns");
        }
    }

    #[test]
    fn a_tile_operand_covers_its_whole_block() {
        // Each THREAD iteration t writes a 2 x 8 GEMM tile at C[16 t]: disjoint with a row
        // stride of 8 (16 elements), overlapping the next tile with a stride of 9 (17).
        for (ldc, disjoint) in [(8, true), (9, false)] {
            let (a, b, c) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 16), buffer(2, DType::F32, 80));
            let t = range(4, 0, AxisType::Thread);
            let shape = GemmShape { m: 2, n: 8, k: 2, lda: 2, ldb: 8, ldc, ..GemmShape::default() };
            let g = tile(TileOp::Gemm(shape), &[a.index(0), b.index(0), c.index(&t * 16)]);
            let program = sink(&[sink(&[g]).end(&[t.clone()])]);
            assert_eq!(threads_write_disjoint(&topo(&program), &t), disjoint, "ldc {ldc}");
        }
    }

    #[test]
    fn a_grid_of_tiles_is_disjoint_when_its_tiles_do_not_overlap() {
        // C is 4 x 12, cut into 2 x 3 tiles of 2 rows: iteration t writes the tile at row block
        // t / 3 and column block t % 3. Tiles 4 wide fit; 5 wide overlap the next column block.
        for (cols, disjoint) in [(4, true), (5, false)] {
            let (a, b, c) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 24), buffer(2, DType::F32, 49));
            let t = range(6, 0, AxisType::Thread);
            let shape = GemmShape { m: 2, n: cols, k: 2, lda: 2, ldb: 12, ldc: 12, ..GemmShape::default() };
            let at = t.idiv(3) * 24 + t.modulo(3) * 4;
            let g = tile(TileOp::Gemm(shape), &[a.index(0), b.index(t.modulo(3) * 4), c.index(at)]);
            let program = sink(&[sink(&[g]).end(&[t.clone()])]);
            assert_eq!(threads_write_disjoint(&topo(&program), &t), disjoint, "{cols} columns");
        }
    }

    #[test]
    fn footprints_that_depend_on_an_inner_loop_are_enumerated_as_blocks() {
        // out[(t % 2) * 4 + j]: iterations 0 and 2 write the same four elements.
        let out = buffer(0, DType::F32, 8);
        let t = range(4, 0, AxisType::Thread);
        let j = range(4, 1, AxisType::Loop);
        let program = sink(&[out.index(t.modulo(2) * 4 + &j).store(1.0f32).end(&[j, t.clone()])]);
        assert!(!threads_write_disjoint(&topo(&program), &t));
        // A 4 x 12 output cut into 2 x 3 blocks of 2 rows, each walked by a row and a column
        // loop (a GEMM epilogue): blocks 4 wide fit, 5 wide overlap the next column block.
        for (cols, disjoint) in [(4, true), (5, false)] {
            let out = buffer(0, DType::F32, 64);
            let t = range(6, 0, AxisType::Thread);
            let (r, c) = (range(2, 1, AxisType::Loop), range(cols, 2, AxisType::Loop));
            let at = t.idiv(3) * 24 + t.modulo(3) * 4 + &r * 12 + &c;
            let read = out.index(&at).load();
            let program = sink(&[out.index(&at).store(read + 1.0f32).end(&[c, r]).end(&[t.clone()])]);
            assert_eq!(threads_write_disjoint(&topo(&program), &t), disjoint, "{cols} columns");
        }
        // Rows closer together than the block is wide (r * 3 + c with c < 4) are no block:
        // only the symbolic test can prove such accesses disjoint (here t * 32 does).
        let out = buffer(0, DType::F32, 64);
        let t = range(2, 0, AxisType::Thread);
        let (r, c) = (range(2, 1, AxisType::Loop), range(4, 2, AxisType::Loop));
        let walk = [c.clone(), r.clone()];
        let program = sink(&[out.index(&t * 32 + &r * 3 + &c).store(1.0f32).end(&walk).end(&[t.clone()])]);
        assert!(threads_write_disjoint(&topo(&program), &t));
        let t = range(8, 0, AxisType::Thread);
        let program =
            sink(&[out.index(t.modulo(2) * 32 + &r * 3 + &c).store(1.0f32).end(&[c, r]).end(&[t.clone()])]);
        assert!(!threads_write_disjoint(&topo(&program), &t));
    }

    /// The store loop of tasks of `bq` rows over `n` rows of `cols` columns in `heads` heads,
    /// the last task of a head starting early enough to be full (`q0 = min(b bq, n - bq)`) and
    /// skipping `skip` of its rows, as the attention kernels store their outputs.
    fn overlapping_last_block(n: usize, bq: usize, heads: usize, cols: usize, skips: bool) -> (UOp, UOp) {
        let blocks = n.div_ceil(bq);
        let out = buffer(0, DType::F32, heads * n * cols);
        let t = range(heads * blocks, 0, AxisType::Thread);
        let (head, qblk) = (t.idiv(blocks as i64), t.modulo(blocks as i64));
        let q0 = -((-(&qblk * bq)).maximum(-((n - bq) as i64)));
        let skip = if skips { (&qblk * bq - (n - bq) as i64).maximum(0) } else { crate::builder::idx(0) };
        let r = range(-&skip + bq as i64, 1, AxisType::Loop);
        let e = range(cols, 2, AxisType::Loop);
        let row = -((-(&skip + &r)).maximum(-(bq as i64 - 1)));
        let at = (&head * n + &q0 + &row) * cols + &e;
        let program = sink(&[out.index(at).store(1.0f32).end(&[e, r]).end(&[t.clone()])]);
        (program, t)
    }

    #[test]
    fn a_last_block_that_skips_the_rows_it_overlaps_is_disjoint() {
        // 10 rows in blocks of 4: the last block starts at row 6 and writes rows 8 and 9 only.
        for (n, bq, heads, cols) in [(10, 4, 1, 3), (10, 4, 3, 3), (1009, 202, 8, 16), (257, 129, 3, 8)] {
            let (program, t) = overlapping_last_block(n, bq, heads, cols, true);
            assert!(threads_write_disjoint(&topo(&program), &t), "{n} rows in blocks of {bq}");
            // Writing every row of the last block overwrites rows of the block before it.
            let (program, t) = overlapping_last_block(n, bq, heads, cols, false);
            assert!(!threads_write_disjoint(&topo(&program), &t), "{n} rows in blocks of {bq}, no skip");
        }
        // Divisible rows need no skipping: every block writes its own rows either way.
        let (program, t) = overlapping_last_block(12, 4, 2, 3, false);
        assert!(threads_write_disjoint(&topo(&program), &t));
    }

    #[test]
    fn threads_writing_one_element_race() {
        let out = buffer(0, DType::F32, 1);
        let t = range(8, 0, AxisType::Thread);
        let program = sink(&[out.index(0).store(1.0f32).end(&[t.clone()])]);
        assert!(!threads_write_disjoint(&topo(&program), &t));
        // One iteration cannot race with itself.
        let one = range(1, 0, AxisType::Thread);
        let program = sink(&[out.index(0).store(1.0f32).end(&[one.clone()])]);
        assert!(threads_write_disjoint(&topo(&program), &one));
    }

    /// `out[0] = sum_k a[k]` with the sum in a one-element ALLOC of `len` elements, indexed by
    /// a constant or, with `by_range`, by the reduce range itself.
    fn reduction(len: usize, by_range: bool) -> (Linear, UOp) {
        let (a, out) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 1));
        let acc = alloc(0, DType::F32, len);
        let k = range(4, 0, AxisType::Reduce);
        let at = |v: &UOp| if by_range { v.index(&k) } else { v.index(0) };
        let init = acc.index(0).store(0.0f32);
        let inner = acc.after(&[init, k.clone()]);
        let step = at(&inner).store(at(&inner).load() + a.index(&k).load());
        let total = acc.after(&[step.end(&[k.clone()])]).index(0).load();
        (linearize(&sink(&[out.index(0).store(total)])).unwrap(), acc)
    }

    #[test]
    fn small_allocs_indexed_by_constants_live_in_registers() {
        let (lin, acc) = reduction(1, false);
        assert!(register_allocs(&lin).contains(&acc));
        let (lin, acc) = reduction(4, true);
        assert!(!register_allocs(&lin).contains(&acc), "indexed by a range");
        let (lin, acc) = reduction(33, false);
        assert!(!register_allocs(&lin).contains(&acc), "too large");
    }

    #[test]
    fn a_single_use_mul_feeding_an_add_contracts() {
        let (a, out) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 8));
        let i = range(4, 0, AxisType::Loop);
        let x = a.index(&i).load();
        let product = &x * &x;
        let once = out.index(&i).store(&product + 1.0f32);
        let lin = linearize(&sink(&[once.end(&[i.clone()])])).unwrap();
        assert_eq!(contractible_muls(&lin), HashSet::from([product.clone()]));
        // Used twice (also stored on its own): not contracted.
        let j = range(4, 1, AxisType::Loop);
        let y = a.index(&j).load();
        let p = &y * &y;
        let twice = sink(&[out.index(&j).store(&p + 1.0f32), out.index(&j + 4).store(p.clone())]);
        let lin = linearize(&sink(&[twice.end(&[j])])).unwrap();
        assert!(contractible_muls(&lin).is_empty());
    }

    /// Four register accumulators updated in one innermost loop, with an optional exp2.
    fn register_tile(with_exp2: bool) -> Linear {
        let (a, out) = (buffer(0, DType::F32, 16), buffer(1, DType::F32, 4));
        let acc = alloc(0, DType::F32, 4);
        let k = range(16, 0, AxisType::Reduce);
        let init = sink(&(0..4).map(|c| acc.index(c).store(0.0f32)).collect::<Vec<_>>());
        let inner = acc.after(&[init, k.clone()]);
        let x = a.index(&k).load();
        let x = if with_exp2 { x.exp2() } else { x };
        let steps: Vec<UOp> = (0..4).map(|c| inner.index(c).store(inner.index(c).load() + &x)).collect();
        let done = acc.after(&[sink(&steps).end(&[k])]);
        let outs: Vec<UOp> = (0..4).map(|c| out.index(c).store(done.index(c).load())).collect();
        linearize(&sink(&outs)).unwrap()
    }

    #[test]
    fn register_tiles_without_transcendentals_are_gemm_like() {
        let lin = register_tile(false);
        assert!(gemm_like(&lin, &register_allocs(&lin)));
        let lin = register_tile(true);
        assert!(!gemm_like(&lin, &register_allocs(&lin)), "an exp2 rules it out");
        let lin = register_tile(false);
        assert!(!gemm_like(&lin, &HashSet::new()), "accumulators in memory are no register tile");
    }

    #[test]
    fn local_bytes_sums_every_alloc() {
        let (lin, _) = reduction(10, false);
        assert_eq!(local_bytes(&lin), 40);
        assert_eq!(local_bytes(&register_tile(false)), 16);
        // A tile large enough to start on a cache line takes a line's room more.
        let (tile, _) = reduction(256, false);
        assert_eq!(local_bytes(&tile), 1024 + ALLOC_LINE_BYTES);
        assert_eq!(alloc_bytes(LINE_ALIGNED_ALLOC_MIN_BYTES - 4), LINE_ALIGNED_ALLOC_MIN_BYTES - 4);
    }
}
