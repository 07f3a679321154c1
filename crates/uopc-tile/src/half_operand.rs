//! The 16-bit operand types the widening GEMMs and packers take (f16, bf16): what each needs
//! to widen on the vector ISAs, and exactly one value at a time.

use half::{bf16, f16};

/// A 16-bit operand of the GEMMs and packers that widen it: f16, or bf16.
pub(crate) trait HalfOperand: crate::blocked::Element {
    /// Whether the few-row kernels read it as f16 (`true`) or as bf16.
    const F16: bool;

    /// Whether the blocked driver's packing can widen it here: f16 needs F16C; bf16 widens
    /// with shifts every vector ISA has.
    fn vector_widening() -> bool;

    /// `dst[i] = src[i]` widened exactly.
    fn widen_slice(src: &[Self], dst: &mut [f32]);
}

impl HalfOperand for f16 {
    const F16: bool = true;

    fn vector_widening() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    fn widen_slice(src: &[f16], dst: &mut [f32]) {
        crate::convert::f16_to_f32_slice(src, dst).expect("equal lengths");
    }
}

impl HalfOperand for bf16 {
    const F16: bool = false;

    fn vector_widening() -> bool {
        true
    }

    fn widen_slice(src: &[bf16], dst: &mut [f32]) {
        crate::convert::bf16_to_f32_slice(src, dst).expect("equal lengths");
    }
}
