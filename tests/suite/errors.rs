//! `uopc::Error`: `?` on the errors of several crates in one function, and real failures
//! reported with the original message, naming the argument at fault, and matchable by variant.

use uopc::gpt::{GptBlock, GptConfig, GptError};
use uopc::ir::{AxisType, DType, buffer, range, sink};
use uopc::jit::{JitError, Program};
use uopc::kernels::sdpa::SdpaError;
use uopc::prelude::*;
use uopc::tensor::TensorError;
use uopc::tile::{GemmShape, Isa, TileError, gemm};

const CONFIG: GptConfig = GptConfig { d_model: 16, heads: 2, hidden: 32, eps: 1e-5 };

/// The parts of one computation each fail in their own crate's error type; `?` takes them all.
/// `k_width` is the head width of the keys (16 / 2 = 8 fits the queries); `c_len` the length
/// of the output of a checked 2 x 2 tile GEMM (4 fits).
fn mixed(k_width: usize, c_len: usize, out_len: usize) -> uopc::Result<(f32, uopc::ndarray::Array2<f32>)> {
    // uopc-tensor
    let x = Tensor::try_from_vec((0..2 * 4 * 16).map(|i| (i % 7) as f32 / 7.0).collect(), &[2, 4, 16])?;
    // the facade's GptError
    let block = GptBlock::random(CONFIG, 5)?;
    let y = block.forward(&x)?;
    // uopc-kernels' SdpaError
    let q = y.try_reshape(&[2, 4, 2, 8])?.try_permute(&[0, 2, 1, 3])?;
    let k = Tensor::try_ones(&[2, 2, 4, k_width])?;
    let att = scaled_dot_product_attention(&q, &k, &k, None, true, None)?;
    // uopc-tile's TileError
    let mut c = vec![0.0f32; c_len];
    gemm(Isa::Portable, &GemmShape::dense(2, 2, 2, false, false, false), &[1.0; 4], &[1.0; 4], &mut c)?;
    // uopc-jit's JitError: a loop program that copies one buffer into another.
    let (src, dst) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 4));
    let i = range(4, 0, AxisType::Thread);
    let copy = Program::compile(&sink(&[dst.index(&i).store(src.index(&i).load()).end(&[i])]), "copy")?;
    let mut out = vec![0.0f32; out_len];
    copy.run_f32(&[&c], &mut [&mut out])?;
    // ndarray's ShapeError, through the re-exported ndarray.
    let grid = uopc::ndarray::Array2::from_shape_vec((2, 2), out)?;
    Ok((att.try_reshape(&[2 * 2 * 4 * 8])?.try_sum(0, false)?.item()?, grid))
}

#[test]
fn question_mark_takes_every_crates_error() {
    let (attention_total, grid) = mixed(8, 4, 4).unwrap();
    assert!(attention_total.is_finite());
    // A 2 x 2 x 2 product of ones is 2 in each cell, copied through the loop program.
    assert_eq!(grid, uopc::ndarray::arr2(&[[2.0, 2.0], [2.0, 2.0]]));
}

#[test]
fn an_attention_argument_that_does_not_fit_is_named() {
    let err = mixed(4, 4, 4).unwrap_err();
    let msg = err.to_string();
    assert_eq!(msg, "sdpa: `k` head size 4 differs from q's 8");
    assert!(matches!(err, uopc::Error::Sdpa(SdpaError::Shape { arg: "k", .. })), "{err:?}");
}

#[test]
fn a_short_tile_buffer_is_named() {
    let err = mixed(8, 3, 4).unwrap_err();
    assert_eq!(err.to_string(), "operand c: buffer holds 3 elements but the shape needs 4");
    assert!(matches!(err, uopc::Error::Tile(TileError::BufferTooSmall { operand: "c", needed: 4, len: 3 })));
}

#[test]
fn a_wrong_run_argument_is_a_jit_error() {
    let err = mixed(8, 4, 3).unwrap_err();
    assert!(matches!(err, uopc::Error::Jit(JitError::Argument(_))), "{err:?}");
    assert!(err.to_string().contains("buffer"), "{err}");
}

#[test]
fn a_shape_mismatch_names_the_op_and_both_shapes() {
    let run = || -> uopc::Result<Tensor> {
        let a = Tensor::try_ones(&[2, 3])?;
        let b = Tensor::try_ones(&[4, 5])?;
        Ok(a.try_matmul(&b)?)
    };
    let err = run().unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("matmul: ") && msg.contains("[2, 3]") && msg.contains("[4, 5]"), "{msg}");
    assert!(matches!(err, uopc::Error::Tensor(TensorError::Shape { op: "matmul", .. })), "{err:?}");
}

#[test]
fn a_bad_gpt_config_is_an_error_not_a_panic() {
    let bad = |config: GptConfig| -> uopc::Result<GptBlock> { Ok(GptBlock::random(config, 1)?) };
    let err = bad(GptConfig { heads: 3, ..CONFIG }).unwrap_err();
    assert_eq!(err.to_string(), "gpt: d_model (16) must be a positive multiple of heads (3)");
    assert!(matches!(err, uopc::Error::Gpt(GptError::Shape(_))));
    for config in [
        GptConfig { heads: 0, ..CONFIG },
        GptConfig { d_model: 0, ..CONFIG },
        GptConfig { hidden: 0, ..CONFIG },
        GptConfig { eps: f32::NAN, ..CONFIG },
        GptConfig { d_model: 1 << 21, heads: 1, ..CONFIG },
    ] {
        let err = bad(config).unwrap_err().to_string();
        assert!(err.starts_with("gpt: "), "{config:?}: {err}");
    }
    assert!(bad(CONFIG).is_ok());
}

#[test]
fn the_source_chain_passes_through() {
    // A malformed program: the verifier's IrError, inside the JIT's, inside uopc::Error.
    let out = buffer(0, DType::F32, 4);
    let i = range(8, 0, AxisType::Thread); // 8 rows into a buffer of 4
    let program = sink(&[out.index(&i).store(1.0f32).end(&[i])]);
    let err: uopc::Error = Program::compile(&program, "oob").unwrap_err().into();
    assert!(matches!(err, uopc::Error::Jit(JitError::Ir(_))), "{err:?}");
    assert!(err.to_string().starts_with("invalid program: "), "{err}");
    // A store inside a range that no END closes: the verifier's error, converted directly.
    let j = range(4, 1, AxisType::Loop);
    let unclosed = sink(&[out.index(&j).store(1.0f32)]);
    let direct: uopc::Error = uopc::ir::verify(&unclosed).unwrap_err().into();
    assert!(matches!(direct, uopc::Error::Ir(_)), "{direct:?}");
}
