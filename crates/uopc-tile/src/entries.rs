//! Where each [`TileEntry`] is in this process: apart from [`crate::ops`], which the
//! micro-kernels' modules may read, since the table names every one of them.

use crate::ops::TileEntry;

impl TileEntry {
    /// The entry's address in this process, for a JIT to register under [`TileEntry::symbol`].
    pub fn address(self) -> *const u8 {
        match self {
            TileEntry::Gemm => crate::uopc_tile_gemm_f32 as *const u8,
            TileEntry::GemmBf16 => crate::uopc_tile_gemm_bf16 as *const u8,
            TileEntry::GemmF16 => crate::uopc_tile_gemm_f16 as *const u8,
            TileEntry::GemmF32F16 => crate::uopc_tile_gemm_f32_f16 as *const u8,
            TileEntry::GemmF32Bf16 => crate::uopc_tile_gemm_f32_bf16 as *const u8,
            TileEntry::GemmF16F32 => crate::uopc_tile_gemm_f16_f32 as *const u8,
            TileEntry::GemmBf16F32 => crate::uopc_tile_gemm_bf16_f32 as *const u8,
            TileEntry::GemmBf16Rounded => crate::uopc_tile_gemm_bf16_rounded as *const u8,
            TileEntry::GemmF16Rounded => crate::uopc_tile_gemm_f16_rounded as *const u8,
            TileEntry::SoftmaxUpdate => crate::uopc_tile_softmax_update_f32 as *const u8,
            TileEntry::SoftmaxUpdateRounded => crate::uopc_tile_softmax_update_rounded as *const u8,
            TileEntry::SoftmaxUpdateRoundedInPlace => {
                crate::uopc_tile_softmax_update_rounded_in_place as *const u8
            }
            TileEntry::SoftmaxRecompute => crate::uopc_tile_softmax_recompute_f32 as *const u8,
            TileEntry::SoftmaxGrad => crate::uopc_tile_softmax_grad_f32 as *const u8,
            TileEntry::MaxSumExp => crate::uopc_tile_max_sum_exp_f32 as *const u8,
            TileEntry::Convert => crate::convert::uopc_tile_convert_block as *const u8,
            TileEntry::ExpRows => crate::uopc_tile_exp_rows_f32 as *const u8,
            TileEntry::Activation => crate::uopc_tile_activation_f32 as *const u8,
            TileEntry::ActivationGrad => crate::uopc_tile_activation_grad_f32 as *const u8,
            TileEntry::Softcap => crate::uopc_tile_softcap_f32 as *const u8,
            TileEntry::ScoreRamp => crate::uopc_tile_score_ramp_f32 as *const u8,
        }
    }
}
