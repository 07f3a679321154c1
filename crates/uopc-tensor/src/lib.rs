//! uopc's front end: the lazy [`Tensor`], the kernelizer ([`make_plan`], [`Plan`]), rangeify
//! ([`lower`]) with its opts, and [`realize`].
//!
//! A `Tensor` only builds a hash-consed UOp graph. Realizing it canonicalizes the graph (data
//! leaves become numbered parameters), looks the canonical graph up in a bounded plan cache,
//! and otherwise cuts it into kernels at materialization points, lowers each kernel to an
//! explicit loop program and compiles it. Every stage returns a value that can be printed and
//! asserted on.

pub mod attention;
pub mod autograd;
mod cost;
pub mod debug;
mod error;
mod exec;
mod kernelize;
pub mod masked;
mod opt;
mod rangeify;
mod realize;
mod tensor;
mod tilemap;

pub use autograd::{gradient, vjp};
pub use cost::static_flops;
pub use debug::{debug_level, set_debug_level};
pub use error::{Result, TensorError};
pub use kernelize::{
    BufRef, Kernel, OutSpec, Plan, PlanCacheStats, canonicalize, layout_pass, make_plan, materialize_points,
    plan_cache_stats, stage_broadcast_compute,
};
pub use opt::{DefaultOpt, FixedOpts, FlashOpt, Layout, NoOpt, Optimizer, Opts};
pub use rangeify::{Ctx, lower};
pub use realize::{KernelTiming, RealizeOptions, RealizeReport, realize};
pub use tensor::{Element, Tensor};
