//! Host functions generated code may call, each with its symbol, address and signature.

use crate::JitError;
use cranelift_codegen::ir::{AbiParam, FuncRef, Function, Signature, types};
use cranelift_jit::JITBuilder;
use cranelift_module::{FuncId, Linkage, Module};

/// A host function the generated code may call (never per element on the f32 fast paths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Extern {
    /// `f64::exp2`.
    Exp2F64,
    /// `f32::log2`.
    Log2F32,
    /// `f64::log2`.
    Log2F64,
    /// [`uopc_tile::uopc_tile_gemm_f32`].
    TileGemm,
    /// [`uopc_tile::uopc_tile_softmax_update_f32`].
    TileSoftmax,
    /// [`uopc_tile::uopc_tile_softmax_recompute_f32`].
    TileSoftmaxRecompute,
    /// [`uopc_tile::uopc_tile_softmax_grad_f32`].
    TileSoftmaxGrad,
    /// [`uopc_tile::uopc_tile_gemm_bf16`] (the flat form of `uopc_tile_gemm_bf16_desc`, so
    /// the descriptor's fields pass in registers as for the f32 GEMM).
    TileGemmBf16,
    /// [`uopc_tile::uopc_tile_gemm_f16`] (flat, like the bf16 one).
    TileGemmF16,
    /// [`uopc_tile::uopc_tile_softmax_update_rounded`].
    TileSoftmaxRounded,
    /// [`uopc_tile::uopc_tile_gemm_f32_f16`] (flat: f32 A, f16 B).
    TileGemmF32F16,
    /// [`uopc_tile::uopc_tile_gemm_f32_bf16`] (flat: f32 A, bf16 B).
    TileGemmF32Bf16,
    /// [`uopc_tile::uopc_tile_max_sum_exp_f32`].
    TileMaxSumExp,
    /// [`uopc_tile::uopc_tile_softmax_update_rounded_in_place`].
    TileSoftmaxRoundedInPlace,
    /// [`uopc_tile::convert::uopc_tile_convert_block`].
    TileConvert,
    /// [`uopc_tile::uopc_tile_exp_rows_f32`].
    TileExpRows,
    /// [`uopc_tile::uopc_tile_gemm_f16_f32`] (flat: f16 A, f32 B, panels allowed).
    TileGemmF16F32,
    /// [`uopc_tile::uopc_tile_gemm_bf16_f32`] (flat: bf16 A, f32 B, panels allowed).
    TileGemmBf16F32,
}

extern "C" fn uopc_exp2_f64(x: f64) -> f64 {
    x.exp2()
}
extern "C" fn uopc_log2_f32(x: f32) -> f32 {
    x.log2()
}
extern "C" fn uopc_log2_f64(x: f64) -> f64 {
    x.log2()
}

impl Extern {
    /// Every extern, in the order each function declares them.
    pub const ALL: [Extern; 18] = [
        Extern::Exp2F64,
        Extern::Log2F32,
        Extern::Log2F64,
        Extern::TileGemm,
        Extern::TileSoftmax,
        Extern::TileSoftmaxRecompute,
        Extern::TileSoftmaxGrad,
        Extern::TileGemmBf16,
        Extern::TileGemmF16,
        Extern::TileSoftmaxRounded,
        Extern::TileGemmF32F16,
        Extern::TileGemmF32Bf16,
        Extern::TileMaxSumExp,
        Extern::TileSoftmaxRoundedInPlace,
        Extern::TileConvert,
        Extern::TileExpRows,
        Extern::TileGemmF16F32,
        Extern::TileGemmBf16F32,
    ];

    /// The symbol it is registered and declared under.
    pub fn symbol(self) -> &'static str {
        match self {
            Extern::Exp2F64 => "uopc_exp2_f64",
            Extern::Log2F32 => "uopc_log2_f32",
            Extern::Log2F64 => "uopc_log2_f64",
            Extern::TileGemm => "uopc_tile_gemm_f32",
            Extern::TileSoftmax => "uopc_tile_softmax_update_f32",
            Extern::TileSoftmaxRecompute => "uopc_tile_softmax_recompute_f32",
            Extern::TileSoftmaxGrad => "uopc_tile_softmax_grad_f32",
            Extern::TileGemmBf16 => "uopc_tile_gemm_bf16",
            Extern::TileGemmF16 => "uopc_tile_gemm_f16",
            Extern::TileGemmF32F16 => "uopc_tile_gemm_f32_f16",
            Extern::TileGemmF32Bf16 => "uopc_tile_gemm_f32_bf16",
            Extern::TileSoftmaxRounded => "uopc_tile_softmax_update_rounded",
            Extern::TileMaxSumExp => "uopc_tile_max_sum_exp_f32",
            Extern::TileSoftmaxRoundedInPlace => "uopc_tile_softmax_update_rounded_in_place",
            Extern::TileConvert => "uopc_tile_convert_block",
            Extern::TileExpRows => "uopc_tile_exp_rows_f32",
            Extern::TileGemmF16F32 => "uopc_tile_gemm_f16_f32",
            Extern::TileGemmBf16F32 => "uopc_tile_gemm_bf16_f32",
        }
    }

    /// Where the function is in this process.
    pub fn address(self) -> *const u8 {
        match self {
            Extern::Exp2F64 => uopc_exp2_f64 as *const u8,
            Extern::Log2F32 => uopc_log2_f32 as *const u8,
            Extern::Log2F64 => uopc_log2_f64 as *const u8,
            Extern::TileGemm => uopc_tile::uopc_tile_gemm_f32 as *const u8,
            Extern::TileSoftmax => uopc_tile::uopc_tile_softmax_update_f32 as *const u8,
            Extern::TileSoftmaxRecompute => uopc_tile::uopc_tile_softmax_recompute_f32 as *const u8,
            Extern::TileSoftmaxGrad => uopc_tile::uopc_tile_softmax_grad_f32 as *const u8,
            Extern::TileGemmBf16 => uopc_tile::uopc_tile_gemm_bf16 as *const u8,
            Extern::TileGemmF16 => uopc_tile::uopc_tile_gemm_f16 as *const u8,
            Extern::TileGemmF32F16 => uopc_tile::uopc_tile_gemm_f32_f16 as *const u8,
            Extern::TileGemmF32Bf16 => uopc_tile::uopc_tile_gemm_f32_bf16 as *const u8,
            Extern::TileSoftmaxRounded => uopc_tile::uopc_tile_softmax_update_rounded as *const u8,
            Extern::TileMaxSumExp => uopc_tile::uopc_tile_max_sum_exp_f32 as *const u8,
            Extern::TileSoftmaxRoundedInPlace => {
                uopc_tile::uopc_tile_softmax_update_rounded_in_place as *const u8
            }
            Extern::TileConvert => uopc_tile::convert::uopc_tile_convert_block as *const u8,
            Extern::TileExpRows => uopc_tile::uopc_tile_exp_rows_f32 as *const u8,
            Extern::TileGemmF16F32 => uopc_tile::uopc_tile_gemm_f16_f32 as *const u8,
            Extern::TileGemmBf16F32 => uopc_tile::uopc_tile_gemm_bf16_f32 as *const u8,
        }
    }

    /// Adds its parameters and returns to `sig` (a signature with the module's calling
    /// convention).
    pub fn signature(self, sig: &mut Signature) {
        let unary = |sig: &mut Signature, t| {
            sig.params.push(AbiParam::new(t));
            sig.returns.push(AbiParam::new(t));
        };
        let ints = |sig: &mut Signature, n: usize| {
            sig.params.extend((0..n).map(|_| AbiParam::new(types::I64)));
            sig.returns.push(AbiParam::new(types::I32));
        };
        match self {
            Extern::Exp2F64 | Extern::Log2F64 => unary(sig, types::F64),
            Extern::Log2F32 => unary(sig, types::F32),
            // (a, b, c, m, n, k, lda, ldb, ldc, flags) -> status
            Extern::TileGemm
            | Extern::TileGemmBf16
            | Extern::TileGemmF16
            | Extern::TileGemmF32F16
            | Extern::TileGemmF32Bf16
            | Extern::TileGemmF16F32
            | Extern::TileGemmBf16F32 => ints(sig, 10),
            // (s, row_max, row_sum, o, rows, cols, lds, ldo, d, scale) -> status
            Extern::TileSoftmax => ints(sig, 10),
            // (s, row_max, row_sum, o, p, rows, cols, lds, ldo, d, ldp, scale, is_f16) -> status
            Extern::TileSoftmaxRounded => ints(sig, 13),
            // (s, row_max, row_sum, o, rows, cols, lds, ldo, d, scale, is_f16) -> status
            Extern::TileSoftmaxRoundedInPlace => ints(sig, 11),
            // (src, dst, rows, cols, lds, ldd, code) -> status
            Extern::TileConvert => ints(sig, 7),
            // (s, lse, rows, cols, ld) -> status
            Extern::TileSoftmaxRecompute => ints(sig, 5),
            // (p, dp, delta, rows, cols, ld) -> status
            Extern::TileSoftmaxGrad => ints(sig, 6),
            // (x, row_max, row_sum, rows, cols, ld, scale) -> status
            Extern::TileMaxSumExp => ints(sig, 7),
            // (x, shift, y, rows, cols, ldx, ldy, scale) -> status
            Extern::TileExpRows => ints(sig, 8),
        }
    }

    /// Registers every extern's address with a JIT about to be built.
    pub fn register_all(jb: &mut JITBuilder) {
        for e in Extern::ALL {
            jb.symbol(e.symbol(), e.address());
        }
    }
}

/// Every extern declared in one module, by variant.
pub(crate) struct DeclaredExterns([FuncId; Extern::ALL.len()]);

impl DeclaredExterns {
    /// Declares every extern as an import of `module`.
    pub fn declare(module: &mut impl Module) -> Result<Self, JitError> {
        let mut ids = Vec::with_capacity(Extern::ALL.len());
        for e in Extern::ALL {
            let mut sig = module.make_signature();
            e.signature(&mut sig);
            ids.push(module.declare_function(e.symbol(), Linkage::Import, &sig)?);
        }
        Ok(DeclaredExterns(ids.try_into().expect("one id per extern")))
    }

    /// References to every extern from inside `func`, declared in [`Extern::ALL`] order.
    pub fn in_function(&self, module: &mut impl Module, func: &mut Function) -> Externs {
        Externs(self.0.map(|id| module.declare_func_in_func(id, func)))
    }
}

/// Every extern as a callee of the function being built.
#[derive(Clone, Copy)]
pub(crate) struct Externs([FuncRef; Extern::ALL.len()]);

impl Externs {
    /// The callee for `e`.
    pub fn get(&self, e: Extern) -> FuncRef {
        self.0[e as usize]
    }
}
