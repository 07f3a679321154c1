//! The facade's integration tests, in one binary (one link instead of one per file): each
//! module is one end-to-end workload. The kernel snapshot test keeps a binary of its own: its
//! printed node numbers count every node the process created.

#[path = "../common/mod.rs"]
mod common;

mod errors;
mod gpt;
mod models;
mod online_rows;
mod online_rows_exp;
mod online_softmax;
mod train;
