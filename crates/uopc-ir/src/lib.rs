//! The UOp IR of uopc: one hash-consed graph type for tensor-level graphs and loop programs.
//!
//! A loop program is a SINK of effects built from RANGE, ALLOC/BUFFER views, INDEX, LOAD, STORE,
//! AFTER and END; [`verify`] checks it, [`linearize`] orders it into nested loops, and
//! [`print_program`] shows it. [`simplify`] canonicalizes index arithmetic using value bounds,
//! with named rule tables run by the [`rewrite`] engine; [`alu`] defines the ALU ops' values.
//! [`prepare`] runs those stages once for a backend and answers the [`analysis`] questions its
//! translation asks.

pub mod alu;
pub mod analysis;
mod builder;
mod derivative;
mod dtype;
mod error;
mod estimate;
mod expand;
mod formula;
mod guard;
mod host;
mod ids;
pub mod interp;
mod linearize;
mod ops;
mod prepare;
mod print;
pub mod rewrite;
mod simplify;
mod split_loops;
mod uop;
mod verify;
mod view;

pub use analysis::{BufferSpec, VarSpec};
pub use builder::{
    IntoIndex, ProgramBuilder, UOpOrConst, alloc, boolc, buffer, const_of, f32c, idx, range, sink, tile, var,
};
pub use derivative::derivative;
pub use dtype::DType;
pub use error::{IrError, IrErrorKind};
pub use estimate::{Estimates, estimate};
pub use expand::expand_tile_ops;
pub use formula::IndexFormula;
pub use guard::{guard_end, guard_exact_end, linear_in};
pub use host::HostBuffer;
pub use ids::{AllocSlot, BufferSlot, RangeId, VarSlot};
pub use linearize::{Linear, Stmt, linearize, linearize_with, open_ranges, open_ranges_with};
pub use prepare::{PrepareError, PrepareOptions, PreparedKernel, ThreadInfo, prepare};
pub use print::{print_graph, print_linear, print_program};
pub use rewrite::{
    Pass, Pattern, Revisit, RewriteStats, Rule, RuleTable, rewrite_counts, rewrite_trace, set_rewrite_trace,
    take_rewrite_counts,
};
pub use simplify::{
    SimplifyOptions, int_div, int_mod, simplify, simplify_memo, simplify_program, simplify_with,
    split_linear, stores_every_element, stores_every_element_linear, tables as simplify_tables,
};
pub use split_loops::split_loops_at_divisors;
pub use uop::{
    AxisType, BinaryOp, ConstValue, CustomKernel, DataRef, GemmShape, Half, Op, ReduceOp, TileOp,
    TileOperand, UOp, UnaryOp, block_extent,
};
/// Large buffers asked onto huge pages (the micro-kernels' allocation helpers).
pub use uopc_tile::memory;
pub use verify::{verify, verify_simplified, view_base};
pub use view::{
    AfterView, EndView, GemmView, IndexView, OnlineSources, RangeView, ReduceView, StoreView, WhereView,
};
