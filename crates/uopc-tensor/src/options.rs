//! What a realize call can be asked to do. [`RealizeOptions`] is hashable and is the plan
//! cache's key as it is, so an option cannot change a plan without also changing the key.

use crate::opt::{DefaultOpt, FlashOpt, Layout, Optimizer, SharedOptimizer};

/// Options of one realize call (no global switches: everything that changes a plan is here).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RealizeOptions {
    /// Do not cut at REDUCEs: reductions are recomputed inside their consumers' loops, and
    /// broadcast staging is skipped ("never write the big intermediate").
    pub fuse_reduce: bool,
    /// Chooses per-kernel opts and whether the layout pass runs.
    pub opt: SharedOptimizer,
    /// Compile kernels as plain scalar code: no vectorization, no FMA contraction, no split
    /// sums. The baseline that code-generation measurements compare against.
    pub scalar_codegen: bool,
    /// Switches that reproduce outgrown behaviour; all off in real use.
    pub experiments: Experiments,
}

impl Default for RealizeOptions {
    fn default() -> Self {
        RealizeOptions {
            fuse_reduce: false,
            opt: SharedOptimizer::new(DefaultOpt::default()),
            scalar_codegen: false,
            experiments: Experiments::default(),
        }
    }
}

impl RealizeOptions {
    /// Fully fused: `fuse_reduce` with [`FlashOpt`].
    pub fn fused() -> Self {
        RealizeOptions {
            fuse_reduce: true,
            opt: SharedOptimizer::new(FlashOpt::default()),
            ..Default::default()
        }
    }

    /// These options with another optimizer.
    pub fn with_opt(mut self, opt: impl Optimizer + 'static) -> Self {
        self.opt = SharedOptimizer::new(opt);
        self
    }

    /// These options with experiment switches set.
    pub fn with_experiments(mut self, experiments: Experiments) -> Self {
        self.experiments = experiments;
        self
    }
}

/// Switches that bring back behaviour the compiler has outgrown, so that tests and benchmarks
/// can show what each design decision buys. They are not production options: every default is
/// off, and, since they change plans, they are part of the plan-cache key like any option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Experiments {
    /// Rangeify simplifies RESHAPE indices without folding IDIV and MOD: `((i*N + j)//N) % N`
    /// then still mentions `j`, so a reduce's accumulator is placed inside loops it does not
    /// depend on (fully fused attention becomes O(N^3)).
    pub reshape_without_divmod_folding: bool,
    /// Stage expensive broadcasts even when `fuse_reduce` is set: fully fused attention then
    /// stores the N x N probabilities P before multiplying them by V.
    pub stage_broadcasts_when_fused: bool,
    /// Leave sums that wait for a maximum over their own axis as written (no
    /// [`online_reductions`](crate::online_reductions)): fully fused attention then makes a
    /// pass over the keys for the maximum, one for the normalizer and one per group of output
    /// columns, recomputing every q.k product in each.
    pub no_online_reductions: bool,
    /// Do not fuse elementwise consumers into tile GEMMs: a GEMM writes its whole output, and
    /// its bias, activation, residual or rounding cast runs as a kernel of its own that reads
    /// the output back (the plans before GEMM epilogues, for comparing the two).
    pub unfused_gemm_epilogues: bool,
    /// Give every kernel reading an online group over rows its own program, even where two
    /// independent kernels read the same group (a loss and its gradient): the rows are then
    /// read from memory once per kernel instead of once for both.
    pub separate_row_siblings: bool,
}

impl Experiments {
    /// The default optimizer's first register tile: 4x4 over the last two output axes of every
    /// reduce kernel, the reduce-contiguous layout (unfused attention copies V transposed
    /// instead of K) and loop nests only, for comparing layouts and tiles.
    pub fn tile_4x4_opt() -> DefaultOpt {
        DefaultOpt {
            tile: (4, 4),
            layout: Layout::ReduceContiguous,
            tile_ops: false,
            upcast_needs_reuse: false,
        }
    }
}
