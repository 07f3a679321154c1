//! The integration tests that share no process-wide state, in one binary (one link instead of
//! one per file): each module is one kernel family. Tests that count the attention cache's
//! compiles keep binaries of their own beside this one.

#[path = "../support/mod.rs"]
mod support;

mod attention_backward;
mod flash_tiled;
mod masked_attention;
mod online_attention;
mod sdpa_backward;
mod sdpa_flex_tensor;
mod sdpa_half_backward;
mod sdpa_tensor;
mod sdpa_tensor_views;
