//! One kernel prepared for a backend: checked, rewritten, analysed and linearized once.
//!
//! [`prepare`] is the IR half of compiling a loop program: it runs every stage that needs no
//! knowledge of the target, in order, each once, and returns a [`PreparedKernel`] holding the
//! linearized program and every fact the backend's translation asks about it. A backend then
//! only translates (`uopc-jit` declares a function, emits its code, finalizes).

use crate::analysis::{
    BufferSpec, VarSpec, buffer_specs, contractible_muls, gemm_like, local_bytes, register_allocs,
    threads_write_disjoint, var_specs, written_bases,
};
use crate::error::IrError;
use crate::estimate::{Estimates, estimate};
use crate::expand::expand_tile_ops;
use crate::formula::IndexFormula;
use crate::linearize::Linear;
use crate::print::print_linear;
use crate::simplify::simplify_program;
use crate::uop::UOp;
use crate::verify::{verify, verify_simplified};
use std::collections::HashSet;

/// What [`prepare`] does besides the stages every kernel goes through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Rewrite tile ops into their reference loops ([`expand_tile_ops`]) before simplifying,
    /// for a backend that does not call tile micro-kernels.
    pub expand_tile_ops: bool,
}

/// Why [`prepare`] refused a program.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The program as written is malformed, or an index of the simplified program cannot be
    /// proven inside its buffer.
    #[error(transparent)]
    Invalid(#[from] IrError),
    /// The program is well formed, but the reference loops its tile ops expand into are not (see
    /// the limitations of [`expand_tile_ops`]).
    #[error("the reference loops of its tile ops: {0}")]
    Expansion(#[source] IrError),
}

/// The THREAD range of a prepared kernel and what its iterations do.
#[derive(Clone, Debug)]
pub struct ThreadInfo {
    /// The RANGE node (a top-level loop of [`PreparedKernel::linear`]).
    pub range: UOp,
    /// Its trip count, when that is a constant.
    pub extent: Option<usize>,
    /// Its end as a formula of the program's variables, when it is built only of constants,
    /// VARs and integer ALU ops: a runtime evaluates it before the call to split the work.
    pub end: Option<IndexFormula>,
    /// Whether different iterations write disjoint memory ([`threads_write_disjoint`]): only
    /// then may they run at once.
    pub writes_disjoint: bool,
}

/// A loop program after [`prepare`]: the simplified program, linearized, with the answers to
/// every question its translation asks.
#[derive(Clone, Debug)]
pub struct PreparedKernel {
    /// The simplified program (tile ops expanded when asked), as lowered.
    pub program: UOp,
    /// Its linearization: the statements a backend translates, in order.
    pub linear: Linear,
    /// The argument slots of the program as written, in slot order. The simplified program
    /// may no longer touch every buffer, but a caller passes them all.
    pub buffers: Vec<BufferSpec>,
    /// The variable slots of the program as written, in slot order (like `buffers`, a caller
    /// passes a value for each even if simplification removed its every use).
    pub vars: Vec<VarSpec>,
    /// The THREAD range, if there is one.
    pub thread: Option<ThreadInfo>,
    /// BUFFERs of the simplified program that no STORE or tile op writes.
    pub read_only: HashSet<UOp>,
    /// ALLOCs that can live in registers ([`register_allocs`]).
    pub register_allocs: HashSet<UOp>,
    /// Float MULs that may fuse into the ADD using them ([`contractible_muls`]).
    pub contractible_muls: HashSet<UOp>,
    /// Whether the kernel is a register-tiled GEMM ([`gemm_like`]).
    pub gemm_like: bool,
    /// Bytes all ALLOCs need ([`local_bytes`]).
    pub local_bytes: usize,
    /// Static FLOP and byte counts ([`estimate`]).
    pub estimates: Estimates,
}

impl PreparedKernel {
    /// The linearized program as nested loops ([`print_linear`]).
    pub fn loop_ir(&self) -> String {
        print_linear(&self.linear)
    }
}

/// Prepares `program` for a backend, each stage once:
///
/// 1. verifies the program as written ([`verify`]): the argument slots and variables come
///    from it (the verifier linearizes it to check loop nesting and statement order; only its
///    buffer and variable lists are kept);
/// 2. with [`PrepareOptions::expand_tile_ops`], expands tile ops and verifies the expansion
///    (it must order its stores like any program);
/// 3. simplifies ([`simplify_program`]: loads of memory the program writes keep their loops);
/// 4. checks and linearizes the simplified program ([`verify_simplified`]): every index of the
///    code a backend emits is proven inside its buffer here;
/// 5. answers the analyses of [`PreparedKernel`] on it, and counts its work.
///
/// # Errors
///
/// [`PrepareError::Invalid`] when the program is malformed or an index cannot be proven in
/// bounds; [`PrepareError::Expansion`] when the expansion of its tile ops does not verify.
pub fn prepare(program: &UOp, opts: &PrepareOptions) -> Result<PreparedKernel, PrepareError> {
    let as_written = verify(program)?;
    let program_nodes = UOp::toposort(std::slice::from_ref(program));
    let buffers = buffer_specs(&as_written.buffers, &written_bases(&program_nodes));
    let expanded = if opts.expand_tile_ops { expand_tile_ops(program) } else { program.clone() };
    if expanded != *program {
        // The lenient check of the simplified program below does not look at store order.
        verify(&expanded).map_err(PrepareError::Expansion)?;
    }
    let simplified = simplify_program(&expanded);
    let linear = verify_simplified(&simplified)?;
    let nodes = UOp::toposort(std::slice::from_ref(&simplified));
    let written = written_bases(&nodes);
    let thread = linear.thread.as_ref().map(|t| ThreadInfo {
        range: t.clone(),
        extent: t.as_range().and_then(|r| r.end.const_int()).map(|n| n.max(0) as usize),
        end: t.as_range().and_then(|r| IndexFormula::of(r.end)),
        writes_disjoint: threads_write_disjoint(&nodes, t),
    });
    let read_only = linear.buffers.iter().filter(|b| !written.contains(b)).cloned().collect();
    let register_allocs = register_allocs(&linear);
    Ok(PreparedKernel {
        gemm_like: gemm_like(&linear, &register_allocs),
        contractible_muls: contractible_muls(&linear),
        local_bytes: local_bytes(&linear),
        estimates: estimate(&linear),
        register_allocs,
        read_only,
        thread,
        buffers,
        vars: var_specs(&as_written.vars),
        linear,
        program: simplified,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{buffer, range, sink, tile};
    use crate::dtype::DType;
    use crate::error::IrErrorKind;
    use crate::uop::{AxisType, Op, TileOp};

    #[test]
    fn prepares_a_threaded_program() {
        let (a, b, out) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 8), buffer(2, DType::F32, 8));
        let i = range(8, 0, AxisType::Thread);
        // `b[i] * 0` simplifies away: buffer 1 is still an argument.
        let value = a.index(&i).load() * 2.0f32 + b.index(&i).load() * 0.0f32;
        let program = sink(&[out.index(&i).store(value).end(&[i.clone()])]);
        let k = prepare(&program, &PrepareOptions::default()).unwrap();
        assert_eq!(k.buffers.len(), 3);
        assert_eq!(k.buffers.iter().map(|s| s.written).collect::<Vec<_>>(), vec![false, false, true]);
        let t = k.thread.as_ref().expect("a THREAD range");
        assert_eq!((t.extent, t.writes_disjoint), (Some(8), true));
        assert!(k.read_only.contains(&a) && !k.read_only.contains(&out));
        assert!(k.loop_ir().contains("for r0 in 0..8 (thread)"), "{}", k.loop_ir());
        assert!(!k.gemm_like);
        assert_eq!(k.local_bytes, 0);
    }

    #[test]
    fn refuses_an_index_out_of_bounds() {
        let a = buffer(0, DType::F32, 4);
        let i = range(4, 0, AxisType::Loop);
        let program = sink(&[a.index(&i + 1).store(0.0f32).end(&[i])]);
        match prepare(&program, &PrepareOptions::default()) {
            Err(PrepareError::Invalid(e)) => assert_eq!(e.kind, IrErrorKind::OutOfBounds),
            other => panic!("expected an out-of-bounds error, got {other:?}"),
        }
    }

    #[test]
    fn expands_tile_ops_when_asked() {
        let (a, b, c) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 4), buffer(2, DType::F32, 4));
        let gemm = TileOp::Gemm(crate::GemmShape::dense(2, 2, 2, false, false, false));
        let program = sink(&[tile(gemm, &[a.index(0), b.index(0), c.index(0)])]);
        let has_tile = |k: &PreparedKernel| {
            UOp::toposort(std::slice::from_ref(&k.program)).iter().any(|u| matches!(u.op(), Op::Tile(_)))
        };
        let kept = prepare(&program, &PrepareOptions::default()).unwrap();
        assert!(has_tile(&kept));
        let expanded = prepare(&program, &PrepareOptions { expand_tile_ops: true }).unwrap();
        assert!(!has_tile(&expanded));
        assert_eq!(kept.buffers, expanded.buffers);
    }
}
