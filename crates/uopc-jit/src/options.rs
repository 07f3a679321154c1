//! Options of one compile.

/// Cranelift optimization level for a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptLevel {
    /// Cranelift's `none`: keeps the emitted order; fastest to compile.
    None,
    /// Cranelift's `speed`: e-graph optimizations (GVN, LICM, constant folding).
    Speed,
    /// Chosen per kernel: `none` for GEMM-like kernels ([`uopc_ir::analysis::gemm_like`]:
    /// register tiles, no transcendental math), `speed` for everything else. The e-graph
    /// places every pure op at its first use, which in a register tile's loop is the back
    /// edge: all loads of the unrolled steps would be issued first and the accumulators
    /// spill, so register tiles keep their emitted order; kernels with exp2 and other scalar
    /// work need GVN and LICM more.
    Auto,
}

/// Options of [`crate::Program::compile_with`].
#[derive(Clone, Debug)]
pub struct JitOptions {
    /// Cranelift optimization level.
    pub opt_level: OptLevel,
    /// Run Cranelift's IR verifier (doubles compile time; on in debug builds).
    pub verify_clif: bool,
    /// Contract a float MUL feeding an ADD into one fused multiply-add (like
    /// `-ffp-contract=fast`; only where the CPU has FMA).
    pub contract_fma: bool,
    /// Vectorize innermost f32 loops over contiguous memory into F32X4 (their reductions
    /// are reassociated into lanes, whatever `reassociate` says).
    pub vectorize: bool,
    /// Reassociate float sums in reduction loops into independent partial sums (like
    /// `-fassociative-math`): results differ from in-order summation by rounding only.
    pub reassociate: bool,
    /// Lower tile ops to calls into the `uopc-tile` micro-kernels. When false, tile ops are
    /// first rewritten into their reference loops ([`uopc_ir::expand_tile_ops`]: f64
    /// accumulation, the interpreter's results bit for bit under strict options), and the
    /// program runs on the JIT's own code alone.
    pub tile_calls: bool,
    /// Reduce steps per trip of a register tile's loop at `opt_level=none` (at `speed` the
    /// e-graph reorders the steps, so there it is always one). Two let the accumulators
    /// alternate between two register sets with no copies at the back edge; more shorten the
    /// loop overhead but lengthen the code the register allocator has to fit into the
    /// vector registers.
    pub tile_steps: usize,
}

impl Default for JitOptions {
    fn default() -> Self {
        JitOptions {
            opt_level: OptLevel::Auto,
            verify_clif: cfg!(debug_assertions),
            contract_fma: true,
            reassociate: true,
            vectorize: true,
            tile_calls: true,
            tile_steps: 2,
        }
    }
}

impl JitOptions {
    /// Plain scalar code: no vectorization, FMA contraction, split sums or micro-kernel calls
    /// (the baseline the code generator is measured against).
    pub fn scalar() -> Self {
        JitOptions {
            contract_fma: false,
            reassociate: false,
            vectorize: false,
            tile_calls: false,
            ..JitOptions::default()
        }
    }

    /// The optimization level a kernel compiles at: [`OptLevel::Auto`] resolved by whether it
    /// is GEMM-like (only when vectorizing: register tiles are vector code).
    pub(crate) fn level_for(&self, gemm_like: bool) -> OptLevel {
        match self.opt_level {
            OptLevel::Auto if self.vectorize && gemm_like => OptLevel::None,
            OptLevel::Auto => OptLevel::Speed,
            level => level,
        }
    }
}
