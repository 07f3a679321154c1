//! The integration tests of the tile kernels, in one binary (one link instead of one per file):
//! each module is one tile operation or its bounds and conversions.

mod common;

mod attention;
mod bf16;
mod bf16_rounded;
mod bounds;
mod convert;
mod f16;
mod f16_rounded;
mod f32_bf16;
mod gemm;
mod half_a;
mod machine;
mod max_sum_exp;
mod panels;
mod softmax;
mod softmax_grad;
mod softmax_rounded;
