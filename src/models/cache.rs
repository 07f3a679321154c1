//! [`KvCache`]: each layer's keys and values of the tokens seen so far, and attention of new
//! queries against them by the runtime-length kernel (compiled once per query count and
//! capacity, never again as the cache grows).

use super::{ModelConfig, ModelError};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use uopc_ir::{DType, idx};
use uopc_kernels::sdpa::{
    AttentionMods, CaptureValues, Extras, Layout, Sdpa, SdpaConfig, SdpaDType, SdpaElement, SdpaError,
    compiled,
};

/// The keys and values of one sequence, per layer, `(capacity, kv_heads, head_dim)` each
/// (the layout a fused QKV projection's rows give, appended in place), in f32, bf16 or f16
/// ([`KvCache::dtype`]).
#[derive(Clone, Debug)]
pub struct KvCache {
    keys: Vec<Rows>,
    values: Vec<Rows>,
    len: usize,
    capacity: usize,
    row: usize,
}

/// One layer's keys or values.
#[derive(Clone, Debug)]
enum Rows {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl KvCache {
    /// An empty f32 cache for `capacity` tokens of a model of `config`.
    pub fn new(config: &ModelConfig, capacity: usize) -> KvCache {
        Self::empty(config, capacity, DType::F32)
    }

    /// An empty cache for `capacity` tokens of a model of `config` whose keys and values are
    /// held in `dtype`: F32, or BF16 or F16 (rounded to nearest even as they are written;
    /// queries are rounded likewise and attention runs the 16-bit kernel, reading half the
    /// bytes, with f32 sums).
    ///
    /// # Errors
    ///
    /// [`ModelError::Input`] naming `dtype` when it is not F32, BF16 or F16.
    pub fn with_dtype(config: &ModelConfig, capacity: usize, dtype: DType) -> Result<KvCache, ModelError> {
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(ModelError::Input(format!("a cache holds f32, bf16 or f16, not {dtype}")));
        }
        Ok(Self::empty(config, capacity, dtype))
    }

    /// [`KvCache::with_dtype`] of a dtype it takes (any other is held as F32).
    pub(crate) fn empty(config: &ModelConfig, capacity: usize, dtype: DType) -> KvCache {
        let row = config.kv_heads * config.head_dim;
        let layer = || match dtype {
            DType::BF16 => Rows::Bf16(vec![bf16::ZERO; capacity * row]),
            DType::F16 => Rows::F16(vec![f16::ZERO; capacity * row]),
            _ => Rows::F32(vec![0.0f32; capacity * row]),
        };
        KvCache {
            keys: (0..config.layers).map(|_| layer()).collect(),
            values: (0..config.layers).map(|_| layer()).collect(),
            len: 0,
            capacity,
            row,
        }
    }

    /// The dtype its keys and values are held in.
    pub fn dtype(&self) -> DType {
        match self.keys.first() {
            Some(Rows::Bf16(_)) => DType::BF16,
            Some(Rows::F16(_)) => DType::F16,
            _ => DType::F32,
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
        let (keys, values) = (&mut self.keys[layer], &mut self.values[layer]);
        for (t, src) in qkv.chunks_exact(width).enumerate() {
            q[t * h * d..(t + 1) * h * d].copy_from_slice(&src[..h * d]);
            keys.write(start + t * row, &src[h * d..h * d + row]);
            values.write(start + t * row, &src[h * d + row..]);
        }
        let sdpa_config = SdpaConfig {
            kv_heads: config.kv_heads,
            causal: true,
            layout: Layout::Bnhd,
            runtime_kv_length: true,
            ..SdpaConfig::new(1, h, tokens, self.capacity, d)
        };
        // With a sliding window the kernel reads the absolute position of the first new
        // token, so one compile serves every step.
        let first = [self.len as i32];
        let captures = [CaptureValues::I32(&first)];
        let extras = Extras {
            kv_length: Some(self.len + tokens),
            captures: if config.sliding_window.is_some() { &captures } else { &[] },
            ..Extras::default()
        };
        let kernel = |c: SdpaConfig| -> Result<Arc<Sdpa>, SdpaError> {
            match config.sliding_window {
                Some(window) => windowed(&c, window),
                None => compiled(&c),
            }
        };
        let mut out = vec![0.0f32; tokens * h * d];
        match (&*keys, &*values) {
            (Rows::F32(k), Rows::F32(v)) => kernel(sdpa_config)?.run(&q, k, v, extras, &mut out)?,
            (Rows::Bf16(k), Rows::Bf16(v)) => attend_16(kernel, sdpa_config, &q, [k, v], extras, &mut out)?,
            (Rows::F16(k), Rows::F16(v)) => attend_16(kernel, sdpa_config, &q, [k, v], extras, &mut out)?,
            _ => unreachable!("a cache's keys and values share a dtype"),
        }
        Ok(out)
    }

    /// Counts `tokens` more as cached.
    pub(crate) fn advance(&mut self, tokens: usize) {
        self.len += tokens;
    }
}

impl Rows {
    /// `src` written from element `at` on, rounded to the held dtype.
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Rows::F32(rows) => rows[at..at + src.len()].copy_from_slice(src),
            Rows::Bf16(rows) => rows[at..at + src.len()].convert_from_f32_slice(src),
            Rows::F16(rows) => rows[at..at + src.len()].convert_from_f32_slice(src),
        }
    }
}

/// `out = attention(q, k, v)` over 16-bit keys and values, by `kernel`'s attention of `config`
/// in their dtype: q rounded to their type, the output widened back.
fn attend_16<T: SdpaElement + Copy + Default>(
    kernel: impl Fn(SdpaConfig) -> Result<Arc<Sdpa>, SdpaError>,
    config: SdpaConfig,
    q: &[f32],
    [k, v]: [&[T]; 2],
    extras: Extras<'_>,
    out: &mut [f32],
) -> Result<(), SdpaError>
where
    [T]: HalfFloatSliceExt,
{
    let mut q16 = vec![T::default(); q.len()];
    q16.convert_from_f32_slice(q);
    let mut wide = vec![T::default(); out.len()];
    kernel(SdpaConfig { dtype: T::DTYPE, ..config })?.run(&q16, k, v, extras, &mut wide)?;
    wide.convert_to_f32_slice(out);
    Ok(())
}

/// The causal attention of `config` (as [`KvCache::attend`] builds it: causal, BNHD, a
/// runtime KV length) under a sliding window of `window` keys, compiled once per process for
/// each shape: the mask function `first + q - kv < window`, where `first` (captured, I32
/// `[1]`) is the absolute position of the first query row.
fn windowed(config: &SdpaConfig, window: usize) -> Result<Arc<Sdpa>, SdpaError> {
    /// What tells apart the configurations `attend` builds, with the window.
    type Key = ([usize; 7], SdpaDType);
    static KERNELS: Mutex<Option<HashMap<Key, Arc<Sdpa>>>> = Mutex::new(None);
    let c = config;
    let key = ([c.batch, c.heads, c.kv_heads, c.n_q, c.n_k, c.d, window], c.dtype);
    let known = KERNELS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|k| k.get(&key).cloned());
    if let Some(kernel) = known {
        return Ok(kernel);
    }
    let mut mods = AttentionMods::new();
    let first = mods.capture("first_position", &[1], DType::I32);
    let mods = mods.mask(move |x| {
        let at = x.load(first, &[idx(0)]).cast(DType::INDEX);
        (at + &x.q - &x.kv).lt(window as i64)
    });
    let kernel = Arc::new(Sdpa::compile_flex(config, &mods)?);
    let mut kept = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    Ok(kept.get_or_insert_with(HashMap::new).entry(key).or_insert(kernel).clone())
}
