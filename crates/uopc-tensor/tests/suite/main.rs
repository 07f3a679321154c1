//! The integration tests that share no process-wide state, in one binary (one link instead of
//! one per file): each module is one area of the API. Tests that clear or bound the plan
//! cache, count its hits or the rewrite rules a fresh plan fires, or read the environment once
//! per process keep binaries of their own beside this one.

#[path = "../common/mod.rs"]
mod common;

mod activation_rows;
mod attention;
mod autograd;
mod captured;
mod create;
mod custom;
mod debug;
mod edges;
mod empty;
mod epilogue;
mod gather;
mod half;
mod index;
mod integers;
mod masked;
mod matmul;
mod matmul_vectors;
mod nn_ops;
mod ops;
mod random_graphs;
mod realize_into;
mod scalars;
