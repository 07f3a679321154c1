//! What one realize did and how long it took: data for the debug output and for callers that
//! time their own work; nothing here prints.

/// Timing of one kernel run.
#[derive(Clone, Debug)]
pub struct KernelTiming {
    /// The kernel's name.
    pub name: String,
    /// Wall seconds of the run.
    pub seconds: f64,
    /// Static FLOPs of one run.
    pub flops: u64,
    /// Static bytes of one run.
    pub bytes: u64,
    /// At debug level 3 and above: wall seconds of an immediate second run on the same memory.
    pub again_seconds: Option<f64>,
    /// The kernel calls tile ops (the micro-kernels) rather than running loops only.
    pub tile_ops: bool,
    /// The kernel is a tile GEMM with its consumer's elementwise ops fused onto each output
    /// block ([`Kernel::has_epilogue`](crate::Kernel::has_epilogue)).
    pub epilogue: bool,
    /// What the kernel runs on, as printed plans label it ([`Kernel::kind_label`](crate::Kernel::kind_label)).
    pub kind: &'static str,
}

/// What one realize did and how long it took.
#[derive(Clone, Debug, Default)]
pub struct RealizeReport {
    /// Per kernel, in execution order.
    pub kernels: Vec<KernelTiming>,
    /// Seconds spent cutting and lowering (0 on a plan-cache hit).
    pub schedule_seconds: f64,
    /// Seconds spent compiling (0 on a plan-cache hit).
    pub compile_seconds: f64,
    /// Whether the plan came from the cache.
    pub cache_hit: bool,
    /// Wall seconds of the whole realize call.
    pub total_seconds: f64,
    /// For [`Tensor::realize_into`](crate::Tensor::realize_into): whether the last kernel
    /// wrote the caller's buffer itself (false: the result was computed into the plan's
    /// buffer and copied, or there was nothing to compute).
    pub wrote_caller_buffer: bool,
}

impl RealizeReport {
    /// Seconds spent inside kernels.
    pub fn run_seconds(&self) -> f64 {
        self.kernels.iter().map(|k| k.seconds).sum()
    }
}
