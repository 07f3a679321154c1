//! Tile-op programs with inputs, shared by the expansion tests of uopc-ir and uopc-jit.

use crate::rng::uniform_values as values;
use uopc_ir::*;

/// A program and the buffers to run it on, one per BUFFER slot.
pub struct Case {
    /// The loop program.
    pub program: UOp,
    /// Its buffers in slot order, outputs included (zeroed).
    pub inputs: Vec<HostBuffer>,
}

/// One GEMM test case's shape and layout: the tile op's [`uopc_ir::GemmShape`] with the
/// padding of every stored row and the operands' offsets in their buffers.
#[derive(Clone, Copy, Debug)]
pub struct GemmCase {
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The reduction length.
    pub k: usize,
    /// A is stored transposed (`k x m`).
    pub a_trans: bool,
    /// B is stored transposed (`n x k`).
    pub b_trans: bool,
    /// C is added to (`C += A B`) instead of overwritten.
    pub accumulate: bool,
    /// Extra elements at the end of every stored row.
    pub pad: usize,
    /// Where A and B start inside their buffers.
    pub offset: usize,
}

impl GemmCase {
    /// The IR's tile op for this shape, leading dimensions padded by `pad`.
    pub fn op(&self) -> TileOp {
        let GemmCase { m, n, k, a_trans, b_trans, accumulate, pad, .. } = *self;
        let (lda, ldb) = (self.a_cols() + pad, self.b_cols() + pad);
        TileOp::Gemm(uopc_ir::GemmShape {
            m,
            n,
            k,
            lda,
            ldb,
            ldc: n + pad,
            a_trans,
            b_trans,
            accumulate,
            b_panel_width: 0,
            b_pair_panels: false,
            parallel: false,
        })
    }
    fn a_cols(&self) -> usize {
        if self.a_trans { self.m } else { self.k }
    }
    fn a_rows(&self) -> usize {
        if self.a_trans { self.k } else { self.m }
    }
    fn b_cols(&self) -> usize {
        if self.b_trans { self.k } else { self.n }
    }
    fn b_rows(&self) -> usize {
        if self.b_trans { self.n } else { self.k }
    }
    /// Elements of one task's A block (offset included).
    pub fn a_len(&self) -> usize {
        self.offset + self.a_rows() * (self.a_cols() + self.pad)
    }
    /// Elements of one task's B block (offset included).
    pub fn b_len(&self) -> usize {
        self.offset + self.b_rows() * (self.b_cols() + self.pad)
    }
    /// Elements of one task's C block.
    pub fn c_len(&self) -> usize {
        self.m * (self.n + self.pad)
    }
    /// A[i, p] of task `t`, from the stored buffer.
    pub fn a_at(&self, a: &[f32], t: usize, i: usize, p: usize) -> f32 {
        let ld = self.a_cols() + self.pad;
        a[t * self.a_len() + self.offset + if self.a_trans { p * ld + i } else { i * ld + p }]
    }
    /// B[p, j], from the stored buffer.
    pub fn b_at(&self, b: &[f32], p: usize, j: usize) -> f32 {
        let ld = self.b_cols() + self.pad;
        b[self.offset + if self.b_trans { j * ld + p } else { p * ld + j }]
    }
    /// Position of C[i, j] of task `t`.
    pub fn c_pos(&self, t: usize, i: usize, j: usize) -> usize {
        t * self.c_len() + i * (self.n + self.pad) + j
    }
}

/// `tasks` THREAD iterations, each `C_t (+)= A_t · B` on its own rows; every buffer has one
/// element past the last block, which nothing may write.
pub fn gemm_case(g: GemmCase, tasks: usize, seed: u64) -> Case {
    gemm_case_of(g, tasks, seed, (DType::F32, DType::F32))
}

/// [`gemm_case`] with bf16 A and B (the same values rounded to bf16) and an f32 C: the GEMM
/// the IR runs on the bf16 micro-kernels.
pub fn gemm_bf16_case(g: GemmCase, tasks: usize, seed: u64) -> Case {
    gemm_case_of(g, tasks, seed, (DType::BF16, DType::F32))
}

/// [`gemm_bf16_case`] writing a bf16 C, overwritten (`g.accumulate` is ignored): the f32 sums
/// rounded to bf16, as `uopc_tile::gemm_bf16_rounded` writes them.
pub fn gemm_bf16_rounded_case(g: GemmCase, tasks: usize, seed: u64) -> Case {
    gemm_case_of(GemmCase { accumulate: false, ..g }, tasks, seed, (DType::BF16, DType::BF16))
}

/// [`gemm_f16_case`] writing an f16 C, overwritten (`g.accumulate` is ignored): the f32 sums
/// rounded to f16, as `uopc_tile::gemm_f16_rounded` writes them.
pub fn gemm_f16_rounded_case(g: GemmCase, tasks: usize, seed: u64) -> Case {
    gemm_case_of(GemmCase { accumulate: false, ..g }, tasks, seed, (DType::F16, DType::F16))
}

/// [`gemm_case`] with f16 A and B (the same values rounded to f16) and an f32 C: the GEMM the
/// IR runs on the f16 kernel.
pub fn gemm_f16_case(g: GemmCase, tasks: usize, seed: u64) -> Case {
    gemm_case_of(g, tasks, seed, (DType::F16, DType::F32))
}

/// [`gemm_case`] with B stored in panels of `width` columns, `pad` elements between panels
/// (its `b_trans` is ignored): the layout `uopc_tile::pack_panels` writes and a GEMM with
/// `b_panel_width` reads in place. Every element of B's buffer is random, the padding columns of
/// the last panel included: they are read and their products dropped.
pub fn gemm_panels_case(g: GemmCase, width: usize, tasks: usize, seed: u64) -> Case {
    let stride = g.k * width + g.pad;
    let b_len = g.offset + (g.n.div_ceil(width) - 1) * stride + g.k * width;
    let op = match g.op() {
        TileOp::Gemm(s) => {
            TileOp::Gemm(uopc_ir::GemmShape { b_trans: false, ldb: stride, b_panel_width: width, ..s })
        }
        other => other,
    };
    let (a_len, c_len) = (g.a_len(), g.c_len());
    let a = buffer(0, DType::F32, a_len * tasks + 1);
    let b = buffer(1, DType::F32, b_len + 1);
    let c = buffer(2, DType::F32, c_len * tasks + 1);
    let t = range(tasks, 0, AxisType::Thread);
    let operands = [a.index(&t * a_len + g.offset as i64), b.index(g.offset as i64), c.index(&t * c_len)];
    let program = sink(&[sink(&[tile(op, &operands)]).end(&[t])]);
    let inputs = vec![
        HostBuffer::F32(values(a_len * tasks + 1, seed)),
        HostBuffer::F32(values(b_len + 1, seed + 1)),
        HostBuffer::F32(values(c_len * tasks + 1, seed + 2)),
    ];
    Case { program, inputs }
}

/// The GEMM case with A and B of dtype `ab` and C of dtype `c_dtype`.
fn gemm_case_of(g: GemmCase, tasks: usize, seed: u64, (ab, c_dtype): (DType, DType)) -> Case {
    let (a_len, b_len, c_len) = (g.a_len(), g.b_len(), g.c_len());
    let a = buffer(0, ab, a_len * tasks + 1);
    let b = buffer(1, ab, b_len + 1);
    let c = buffer(2, c_dtype, c_len * tasks + 1);
    let t = range(tasks, 0, AxisType::Thread);
    let operands = [a.index(&t * a_len + g.offset as i64), b.index(g.offset as i64), c.index(&t * c_len)];
    let program = sink(&[sink(&[tile(g.op(), &operands)]).end(&[t])]);
    let operand = |v: Vec<f32>, dtype: DType| match dtype {
        DType::BF16 => HostBuffer::BF16(v.into_iter().map(half::bf16::from_f32).collect()),
        DType::F16 => HostBuffer::F16(v.into_iter().map(half::f16::from_f32).collect()),
        _ => HostBuffer::F32(v),
    };
    let inputs = vec![
        operand(values(a_len * tasks + 1, seed), ab),
        operand(values(b_len + 1, seed + 1), ab),
        operand(values(c_len * tasks + 1, seed + 2), c_dtype),
    ];
    Case { program, inputs }
}

/// One softmax update's shape and layout.
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxShape {
    /// Query rows of the score tile.
    pub rows: usize,
    /// Keys of the score tile.
    pub cols: usize,
    /// Columns of the output tile (the head dimension).
    pub d: usize,
    /// Extra elements at the end of every stored row of S and O.
    pub pad: usize,
    /// Where each task's blocks start inside their buffers.
    pub offset: usize,
}

impl SoftmaxShape {
    /// The IR's tile op for this shape, leading dimensions padded by `pad`.
    pub fn op(&self) -> TileOp {
        self.scaled_op(1.0)
    }
    /// [`SoftmaxShape::op`] with the scores scaled by `scale` inside the op.
    pub fn scaled_op(&self, scale: f32) -> TileOp {
        let SoftmaxShape { rows, cols, d, pad, .. } = *self;
        TileOp::SoftmaxUpdate { rows, cols, lds: cols + pad, d, ldo: d + pad, scale: scale.to_bits() }
    }
    /// The rounded step of 16-bit attention on this shape: scores scaled by `scale`, P rounded
    /// to `round_to` with rows padded like S's.
    ///
    /// # Panics
    ///
    /// When `round_to` is not BF16 or F16.
    pub fn rounded_op(&self, scale: f32, round_to: DType) -> TileOp {
        let round_to = round_to.half().expect("probabilities round to BF16 or F16");
        let SoftmaxShape { rows, cols, d, pad, .. } = *self;
        TileOp::SoftmaxUpdateRounded {
            rows,
            cols,
            lds: cols + pad,
            d,
            ldo: d + pad,
            ldp: cols + pad,
            scale: scale.to_bits(),
            round_to,
        }
    }
    /// Elements per task of S, row_max, row_sum and O (offsets included).
    pub fn lens(&self) -> [usize; 4] {
        let SoftmaxShape { rows, cols, d, pad, offset } = *self;
        [offset + rows * (cols + pad), offset + rows, offset + rows, offset + rows * (d + pad)]
    }
}

/// `tasks` THREAD iterations of the update `op`, each on its own blocks of four f32 buffers
/// (S, row_max, row_sum, O, with `s`'s lengths and offset); with `p_over_s`, S is also the
/// op's fifth operand, P.
fn update_program(op: TileOp, s: &SoftmaxShape, tasks: usize, p_over_s: bool) -> UOp {
    let lens = s.lens();
    let bufs: Vec<UOp> = (0..4).map(|k| buffer(k, DType::F32, lens[k] * tasks + 1)).collect();
    let t = range(tasks, 0, AxisType::Thread);
    let mut operands: Vec<UOp> =
        bufs.iter().zip(lens).map(|(b, len)| b.index(&t * len + s.offset as i64)).collect();
    if p_over_s {
        operands.push(operands[0].clone());
    }
    sink(&[sink(&[tile(op, &operands)]).end(&[t])])
}

/// `tasks` THREAD iterations of one softmax update, each on its own blocks. With `special`
/// the first rows (where they exist) are, in order: all `-inf` (scores and max: P = 0, l and O
/// kept), a first block (max `-inf`, finite scores), masked (scores `-inf`, finite max), and
/// one whose maximum is its last score (the max moves late in the row).
pub fn softmax_case(s: SoftmaxShape, tasks: usize, special: bool, seed: u64) -> Case {
    let lens = s.lens();
    let program = update_program(s.op(), &s, tasks, false);

    let mut scores: Vec<f32> = values(lens[0] * tasks + 1, seed).iter().map(|x| x * 8.0).collect();
    let mut row_max: Vec<f32> = values(lens[1] * tasks + 1, seed + 1).iter().map(|x| x * 4.0).collect();
    let sums: Vec<f32> = values(lens[2] * tasks + 1, seed + 2).iter().map(|x| x.abs() + 0.5).collect();
    let o = values(lens[3] * tasks + 1, seed + 3);
    if special {
        let lds = s.cols + s.pad;
        for task in 0..tasks {
            let row = |r: usize| task * lens[0] + s.offset + r * lds;
            let max_at = |r: usize| task * lens[1] + s.offset + r;
            for r in 0..s.rows.min(4) {
                let cells = row(r)..row(r) + s.cols;
                match r {
                    0 => {
                        scores[cells].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
                        row_max[max_at(r)] = f32::NEG_INFINITY;
                    }
                    1 => row_max[max_at(r)] = f32::NEG_INFINITY,
                    2 => scores[cells].iter_mut().for_each(|x| *x = f32::NEG_INFINITY),
                    _ if s.cols > 0 => scores[row(r) + s.cols - 1] = 20.0,
                    _ => {}
                }
            }
        }
    }
    let inputs =
        vec![HostBuffer::F32(scores), HostBuffer::F32(row_max), HostBuffer::F32(sums), HostBuffer::F32(o)];
    Case { program, inputs }
}

/// [`softmax_case`] with the scores scaled by `scale` inside the op (the op of attention that
/// reads its queries unscaled): the same buffers and values.
pub fn softmax_scaled_case(s: SoftmaxShape, scale: f32, tasks: usize, special: bool, seed: u64) -> Case {
    let unscaled = softmax_case(s, tasks, special, seed);
    Case { program: update_program(s.scaled_op(scale), &s, tasks, false), inputs: unscaled.inputs }
}

/// [`softmax_case`] for [`TileOp::SoftmaxUpdateRounded`]: the same score, max, sum and output
/// blocks (the special rows included), with the scores scaled by `scale` inside the op and the
/// probabilities written, rounded to `p_dtype` (BF16 or F16), into a fifth buffer (slot 4) of
/// P blocks whose rows are padded like S's, which starts as NaNs so that any element the op
/// should write and does not shows.
pub fn softmax_rounded_case(
    s: SoftmaxShape,
    p_dtype: DType,
    scale: f32,
    tasks: usize,
    special: bool,
    seed: u64,
) -> Case {
    let f32_case = softmax_case(s, tasks, special, seed);
    let lens = s.lens();
    let p_len = lens[0];
    let op = s.rounded_op(scale, p_dtype);
    let mut bufs: Vec<UOp> = (0..4).map(|k| buffer(k, DType::F32, lens[k] * tasks + 1)).collect();
    bufs.push(buffer(4, p_dtype, p_len * tasks + 1));
    let t = range(tasks, 0, AxisType::Thread);
    let operands: Vec<UOp> = bufs
        .iter()
        .zip(lens.iter().copied().chain([p_len]))
        .map(|(b, len)| b.index(&t * len + s.offset as i64))
        .collect();
    let program = sink(&[sink(&[tile(op, &operands)]).end(&[t])]);
    let mut inputs = f32_case.inputs;
    inputs.push(match p_dtype {
        DType::BF16 => HostBuffer::BF16(vec![half::bf16::NAN; p_len * tasks + 1]),
        _ => HostBuffer::F16(vec![half::f16::NAN; p_len * tasks + 1]),
    });
    Case { program, inputs }
}

/// [`softmax_case`] for the in-place form of [`TileOp::SoftmaxUpdateRounded`]: the same four
/// buffers (the special rows included), the scores scaled by `scale` inside the op and
/// replaced by the probabilities rounded to `round_to` (BF16 or F16), P being the score
/// operand itself.
pub fn softmax_rounded_in_place_case(
    s: SoftmaxShape,
    round_to: DType,
    scale: f32,
    tasks: usize,
    special: bool,
    seed: u64,
) -> Case {
    let f32_case = softmax_case(s, tasks, special, seed);
    let program = update_program(s.rounded_op(scale, round_to), &s, tasks, true);
    Case { program, inputs: f32_case.inputs }
}

/// `tasks` THREAD iterations of one [`TileOp::Convert`] of a `rows x cols` block from `from`
/// to `to` (BF16 or F16 to F32, or F32 to BF16 or F16), the source rows `pad` elements
/// longer than the block's, the destination rows `2 pad` longer, both blocks starting
/// `offset` elements into their task's part. Sources span values far beyond f16's range and
/// below its normal one (overflow, subnormals, flush to zero), ties, NaN and infinities;
/// the destination starts as NaN (bf16 or f16) or a sentinel (f32), so untouched elements
/// show.
pub fn convert_case(
    (rows, cols, pad, offset): (usize, usize, usize, usize),
    from: DType,
    to: DType,
    tasks: usize,
    seed: u64,
) -> Case {
    let (lds, ldd) = (cols + pad, cols + 2 * pad);
    let (s_len, d_len) = (offset + rows * lds, offset + rows * ldd);
    let (src, dst) = (buffer(0, from, s_len * tasks + 1), buffer(1, to, d_len * tasks + 1));
    let t = range(tasks, 0, AxisType::Thread);
    let op = TileOp::Convert { rows, cols, lds, ldd };
    let operands = [src.index(&t * s_len + offset as i64), dst.index(&t * d_len + offset as i64)];
    let program = sink(&[sink(&[tile(op, &operands)]).end(&[t])]);
    let specials =
        [f32::NAN, f32::INFINITY, -f32::INFINITY, 65520.0, 1e-7, -3e-8, 1.0 + 1.0 / 2048.0, 0.0, -0.0];
    let raw: Vec<f32> = values(s_len * tasks + 1, seed)
        .iter()
        .enumerate()
        .map(|(i, x)| match i % 7 {
            0 => specials[(i / 7) % specials.len()],
            1 => x * 1e5,
            2 => x * 1e-5,
            _ => *x,
        })
        .collect();
    let buf = |dtype: DType, v: Vec<f32>| match dtype {
        DType::BF16 => HostBuffer::BF16(v.into_iter().map(half::bf16::from_f32).collect()),
        DType::F16 => HostBuffer::F16(v.into_iter().map(half::f16::from_f32).collect()),
        _ => HostBuffer::F32(v),
    };
    let sentinel = if to == DType::F32 { -1.75 } else { f32::NAN };
    let inputs = vec![buf(from, raw), buf(to, vec![sentinel; d_len * tasks + 1])];
    Case { program, inputs }
}

/// FlashAttention on tile ops, like `uopc::flash_tile_ops_ir` in small: per THREAD block of
/// `br` queries, over key blocks of `bc`: S = Q K^T into a scratch ALLOC, the softmax update,
/// O += P V, all ordered by AFTER; then out = O / l. Q holds base-2 scores' scale already.
pub fn flash_on_tile_ops(n: usize, d: usize, br: usize, bc: usize) -> UOp {
    let f32t = DType::F32;
    let (q, k, v, out) =
        (buffer(0, f32t, n * d), buffer(1, f32t, n * d), buffer(2, f32t, n * d), buffer(3, f32t, n * d));
    let (s, o, mx, l) =
        (alloc(0, f32t, br * bc), alloc(1, f32t, br * d), alloc(2, f32t, br), alloc(3, f32t, br));
    let t = range(n / br, 0, AxisType::Thread);
    let th = std::slice::from_ref(&t);
    let (si, oi, mi, li) = (s.after(th), o.after(th), mx.after(th), l.after(th));
    let z = range(br * d, 1, AxisType::Loop);
    let init_o = oi.index(&z).store(0.0f32).end(&[z]);
    let r = range(br, 2, AxisType::Loop);
    let init_ml = sink(&[mi.index(&r).store(f32c(f32::NEG_INFINITY)), li.index(&r).store(0.0f32)]).end(&[r]);
    let kb = range(n / bc, 3, AxisType::Reduce);
    let prev = [init_o, init_ml, kb.clone()];
    let scores = TileOp::Gemm(uopc_ir::GemmShape {
        m: br,
        n: bc,
        k: d,
        lda: d,
        ldb: d,
        ldc: bc,
        a_trans: false,
        b_trans: true,
        accumulate: false,
        b_panel_width: 0,
        b_pair_panels: false,
        parallel: false,
    });
    let g1 = tile(scores, &[q.index(&t * (br * d)), k.index(&kb * (bc * d)), si.after(&prev).index(0)]);
    let mut state = prev.to_vec();
    state.push(g1.clone());
    let update = TileOp::SoftmaxUpdate { rows: br, cols: bc, lds: bc, d, ldo: d, scale: 1f32.to_bits() };
    let sm = tile(
        update,
        &[
            si.after(&[g1]).index(0),
            mi.after(&state).index(0),
            li.after(&state).index(0),
            oi.after(&state).index(0),
        ],
    );
    let pv = TileOp::Gemm(uopc_ir::GemmShape {
        m: br,
        n: d,
        k: bc,
        lda: bc,
        ldb: d,
        ldc: d,
        a_trans: false,
        b_trans: false,
        accumulate: true,
        b_panel_width: 0,
        b_pair_panels: false,
        parallel: false,
    });
    let g2 = tile(pv, &[si.after(&[sm.clone()]).index(0), v.index(&kb * (bc * d)), oi.after(&[sm]).index(0)]);
    let done = [g2.end(&[kb])];
    let e = range(d, 4, AxisType::Loop);
    let rr = range(br, 5, AxisType::Loop);
    let inv = li.after(&done).index(&rr).load().recip();
    let st = out.index((&t * br + &rr) * d + &e).store(oi.after(&done).index(&rr * d + &e).load() * inv);
    sink(&[st.end(&[e, rr, t])])
}

/// Inputs of [`flash_on_tile_ops`]: Q, K and V uniform in [-3, 3), and a zeroed output.
pub fn flash_inputs(n: usize, d: usize, seed: u64) -> Vec<HostBuffer> {
    (0..3)
        .map(|k| HostBuffer::F32(values(n * d, seed + k).iter().map(|x| x * 3.0).collect()))
        .chain([HostBuffer::F32(vec![0.0; n * d])])
        .collect()
}

/// The elements of an f32 buffer; panics on any other dtype (a test's own mistake).
pub fn f32s(b: &HostBuffer) -> &[f32] {
    match b {
        HostBuffer::F32(v) => v,
        other => panic!("expected an f32 buffer, got {:?}", other.dtype()),
    }
}

/// The bits of every element of every f32, bf16 or f16 buffer (NaNs compare equal to
/// themselves).
pub fn bits(bufs: &[HostBuffer]) -> Vec<Vec<u32>> {
    bufs.iter()
        .map(|b| match b {
            HostBuffer::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
            HostBuffer::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
            _ => f32s(b).iter().map(|x| x.to_bits()).collect(),
        })
        .collect()
}

/// Whether `program` still has a tile op.
pub fn has_tile_op(program: &UOp) -> bool {
    UOp::toposort(std::slice::from_ref(program)).iter().any(|u| matches!(u.op(), Op::Tile(_)))
}
