//! uopc's front end: the lazy [`Tensor`], the kernelizer ([`make_plan`], [`Plan`]), rangeify
//! ([`lower`]) with its opts, and [`realize`].
//!
//! A `Tensor` only builds a hash-consed UOp graph. Realizing it canonicalizes the graph (data
//! leaves become numbered parameters), looks the canonical graph up in a bounded plan cache,
//! and otherwise cuts it into kernels at materialization points, lowers each kernel to an
//! explicit loop program and compiles it. Every stage returns a value that can be printed and
//! asserted on.
//!
//! # Global state
//!
//! Two things are process wide, on purpose: the plan cache (bounded to 128 plans and, for the
//! temporaries its plans keep between runs, to [`plan_cache_limit`] bytes; see
//! [`set_plan_cache_limit`], [`clear_plan_cache`], [`plan_cache_stats`]) and the debug level.
//! Everything that changes a plan is in [`RealizeOptions`], which is the cache key.
//!
//! # Debug output
//!
//! The `UOPC_DEBUG` environment variable (read once per process) or [`set_debug_level`] makes
//! realize print to stderr what it did: `1` a line per realize, `2` a line per kernel with
//! its time, GFLOP/s and GB/s, `3` each kernel re-run at once (page-fault diagnosis), `4` the
//! plan and each kernel's loop IR on a plan-cache miss, `5` the Cranelift IR, `6` the machine
//! code. See [`debug`].

#![warn(missing_docs)]

mod activation_rows;
pub mod attention;
pub mod autograd;
mod cache;
mod captured;
mod cost;
pub mod debug;
mod epilogue;
mod error;
mod exec;
mod gemm_grid;
mod kernelize;
mod lowerings;
pub mod masked;
mod online;
mod online_rows;
mod online_tiles;
mod opt;
mod options;
mod passes;
mod plan;
mod rangeify;
mod realize;
mod report;
mod tensor;
mod tilemap;
mod util;
mod view;

pub use autograd::{gradient, vjp};
pub use cache::{
    DEFAULT_PLAN_CACHE_LIMIT, PlanCacheStats, clear_plan_cache, make_plan, plan_cache_limit,
    plan_cache_stats, set_plan_cache_limit,
};
pub use captured::Captured;
pub use cost::static_flops;
pub use debug::{DEBUG_ENV, debug_level, set_debug_level};
pub use error::{Result, TensorError};
/// The ndarray version this crate converts to and from, so callers need not pin it themselves.
pub use ndarray;
pub use online::online_reductions;
pub use opt::{
    DefaultOpt, FixedOpts, FlashOpt, Layout, NoOpt, Optimizer, OptimizerKey, Opts, SharedOptimizer,
};
pub use options::{Experiments, RealizeOptions};
pub use passes::{
    canonicalize, layout_pass, layout_pass_output, materialize_points, stage_broadcast_compute,
};
pub use plan::{ArgSource, Kernel, OutSpec, Plan, input_products};
pub use rangeify::{Ctx, lower};
pub use realize::realize;
pub use report::{KernelTiming, RealizeReport};
pub use tensor::{
    CustomVjp, CustomVjpWanted, Element, GradientRule, MAX_ELEMENTS, Scalar, StridedView, Tensor,
};
