//! [`KvCache`]: each layer's keys and values of the tokens seen so far, and attention of new
//! queries against them by the runtime-length kernel (compiled once per query count and
//! capacity, never again as the cache grows).

use super::{ModelConfig, ModelError};
use uopc_kernels::sdpa::{Extras, Layout, SdpaConfig, compiled};

/// The keys and values of one sequence, per layer, `(capacity, kv_heads, head_dim)` each
/// (the layout a fused QKV projection's rows give, appended in place).
#[derive(Clone, Debug)]
pub struct KvCache {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
    row: usize,
}

impl KvCache {
    /// An empty cache for `capacity` tokens of a model of `config`.
    pub fn new(config: &ModelConfig, capacity: usize) -> KvCache {
        let row = config.kv_heads * config.head_dim;
        let layer = || vec![0.0f32; capacity * row];
        KvCache {
            keys: (0..config.layers).map(|_| layer()).collect(),
            values: (0..config.layers).map(|_| layer()).collect(),
            len: 0,
            capacity,
            row,
        }
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every token (the memory is kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// `Ok` when `tokens` more fit.
    pub(crate) fn check_room(&self, tokens: usize) -> Result<(), ModelError> {
        if self.len + tokens > self.capacity {
            return Err(ModelError::Cache(format!(
                "{tokens} new token(s) after {} cached exceed the cache's capacity of {}",
                self.len, self.capacity
            )));
        }
        Ok(())
    }

    /// Causal attention of `tokens` new rows of layer `layer`, from `qkv` (`tokens` rows of
    /// q, k and v side by side, rotated already): their keys and values are written after
    /// the cached ones, then each query attends to every cached key and the new ones up to
    /// its own. Returns the output rows `(tokens, heads * head_dim)`. The tokens count as
    /// cached once [`KvCache::advance`] says so (after the last layer).
    pub(crate) fn attend(
        &mut self,
        config: &ModelConfig,
        layer: usize,
        qkv: &[f32],
        tokens: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let (h, d, row) = (config.heads, config.head_dim, self.row);
        let width = h * d + 2 * row;
        let start = self.len * row;
        let mut q = vec![0.0f32; tokens * h * d];
        for (t, src) in qkv.chunks_exact(width).enumerate() {
            q[t * h * d..(t + 1) * h * d].copy_from_slice(&src[..h * d]);
            self.keys[layer][start + t * row..][..row].copy_from_slice(&src[h * d..h * d + row]);
            self.values[layer][start + t * row..][..row].copy_from_slice(&src[h * d + row..]);
        }
        let sdpa_config = SdpaConfig {
            kv_heads: config.kv_heads,
            causal: true,
            layout: Layout::Bnhd,
            runtime_kv_length: true,
            ..SdpaConfig::new(1, h, tokens, self.capacity, d)
        };
        let sdpa = compiled(&sdpa_config)?;
        let mut out = vec![0.0f32; tokens * h * d];
        let extras = Extras { kv_length: Some(self.len + tokens), ..Extras::default() };
        sdpa.run(&q, &self.keys[layer], &self.values[layer], extras, &mut out)?;
        Ok(out)
    }

    /// Counts `tokens` more as cached.
    pub(crate) fn advance(&mut self, tokens: usize) {
        self.len += tokens;
    }
}
