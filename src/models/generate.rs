//! Generation: a prompt processed at once, then one token at a time against the KV cache,
//! each chosen by [`Sampling`] and handed to the caller as it is produced.

use super::{CausalLm, KvCache, Logits, ModelError, Segment};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::time::Instant;

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 for greedy (the most likely token, the first of equals); otherwise the logits are
    /// divided by it before the softmax.
    pub temperature: f32,
    /// Only the `k` most likely tokens are drawn from, when set.
    pub top_k: Option<usize>,
    /// Only the most likely tokens whose probabilities sum to at least `p` (nucleus), when set.
    pub top_p: Option<f32>,
    /// The seed of the draws: the same seed, prompt and model give the same tokens.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding.
    pub const GREEDY: Sampling = Sampling { temperature: 0.0, top_k: None, top_p: None, seed: 0 };

    /// The next token for `logits` (one row of the vocabulary).
    ///
    /// # Errors
    ///
    /// [`ModelError::Input`] for a negative or non-finite temperature, a top-k of 0 or a
    /// top-p outside `(0, 1]`, or logits with no finite entry.
    pub fn choose(&self, logits: &[f32], rng: &mut StdRng) -> Result<u32, ModelError> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(ModelError::Input(format!(
                "temperature {} must be finite and >= 0",
                self.temperature
            )));
        }
        if self.top_k == Some(0) || self.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(ModelError::Input("top_k must be at least 1 and top_p in (0, 1]".into()));
        }
        let best = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .fold(
                None,
                |b: Option<(usize, f32)>, (i, &l)| {
                    if b.is_none_or(|(_, bl)| l > bl) { Some((i, l)) } else { b }
                },
            )
            .ok_or_else(|| ModelError::Input("the logits have no finite entry".into()))?;
        if self.temperature == 0.0 {
            return Ok(best.0 as u32);
        }
        // The candidates, most likely first, and their probabilities at the temperature.
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| logits[i].is_finite()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        order.truncate(self.top_k.unwrap_or(usize::MAX));
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| (f64::from(logits[i] - best.1) / f64::from(self.temperature)).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut keep = order.len();
        if let Some(p) = self.top_p {
            let mut mass = 0.0;
            keep = weights
                .iter()
                .position(|w| {
                    mass += w / total;
                    mass >= f64::from(p)
                })
                .map_or(order.len(), |i| i + 1);
        }
        let kept: f64 = weights[..keep].iter().sum();
        let mut draw = rng.random_range(0.0..kept);
        for (i, w) in weights[..keep].iter().enumerate() {
            if draw < *w {
                return Ok(order[i] as u32);
            }
            draw -= w;
        }
        Ok(order[keep - 1] as u32)
    }
}

/// What [`CausalLm::generate`] does.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Most tokens generated.
    pub max_new_tokens: usize,
    /// How each is chosen.
    pub sampling: Sampling,
    /// Tokens that end the generation (included in the output); the configuration's
    /// end-of-sequence tokens are not added implicitly.
    pub stop_tokens: Vec<u32>,
}

impl GenerateOptions {
    /// Greedy decoding of up to `max_new_tokens` tokens, no stop token.
    pub fn greedy(max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions { max_new_tokens, sampling: Sampling::GREEDY, stop_tokens: Vec::new() }
    }
}

/// The tokens generated and how long each phase took.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The new tokens (not the prompt).
    pub tokens: Vec<u32>,
    /// Seconds to process the prompt and choose the first token (compiles included on a
    /// model's first run).
    pub first_token_seconds: f64,
    /// Seconds of the decode steps after the first token.
    pub decode_seconds: f64,
}

impl Generation {
    /// Milliseconds per token of the decode steps (0 with at most one token).
    pub fn decode_ms_per_token(&self) -> f64 {
        if self.tokens.len() > 1 { self.decode_seconds * 1e3 / (self.tokens.len() - 1) as f64 } else { 0.0 }
    }
}

impl CausalLm {
    /// Generates after `prompt`: the prompt in one forward pass, then one token per pass
    /// against a KV cache of the prompt's and the new tokens' length. Each token is handed
    /// to `on_token` as it is produced; returning `false` stops the generation there.
    ///
    /// # Errors
    ///
    /// [`ModelError::Input`] for an empty prompt or invalid sampling options; the errors of
    /// [`CausalLm::forward`] (a prompt too long for the model's positions).
    pub fn generate(
        &self,
        prompt: &[u32],
        options: &GenerateOptions,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, ModelError> {
        let mut out = self.generate_batch(&[prompt], options, |_, token| on_token(token))?;
        Ok(out.pop().expect("one generation per prompt"))
    }

    /// [`CausalLm::generate`] for several prompts at once (of any lengths): the prompts in one
    /// batched forward pass, then one pass per step for the sequences still going, every
    /// sequence against its own cache ([`CausalLm::forward_batch`]), so a step reads the
    /// weights once for all of them. Sequence `i` draws from its own generator seeded with
    /// `options.sampling.seed` and ends on its own (a stop token, `max_new_tokens`, or
    /// `on_token(i, token)` returning `false`), so its tokens are those
    /// [`CausalLm::generate`] gives for its prompt alone. The timings of each are the batch's
    /// up to its end.
    ///
    /// # Errors
    ///
    /// As [`CausalLm::generate`], for any prompt; [`ModelError::Input`] when `prompts` is
    /// empty.
    pub fn generate_batch(
        &self,
        prompts: &[&[u32]],
        options: &GenerateOptions,
        mut on_token: impl FnMut(usize, u32) -> bool,
    ) -> Result<Vec<Generation>, ModelError> {
        if prompts.is_empty() {
            return Err(ModelError::Input("no prompts given".into()));
        }
        let start = Instant::now();
        // One capacity for every cache: their attention kernels are one compile.
        let capacity = prompts.iter().map(|p| p.len()).max().unwrap_or(0) + options.max_new_tokens;
        let mut caches: Vec<KvCache> = prompts.iter().map(|_| self.new_cache(capacity)).collect();
        let mut rngs: Vec<StdRng> =
            prompts.iter().map(|_| StdRng::seed_from_u64(options.sampling.seed)).collect();
        let mut out: Vec<Generation> = prompts
            .iter()
            .map(|_| Generation { tokens: Vec::new(), first_token_seconds: 0.0, decode_seconds: 0.0 })
            .collect();
        let mut inputs: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
        let mut live: Vec<usize> =
            if options.max_new_tokens > 0 { (0..prompts.len()).collect() } else { Vec::new() };
        let vocab = self.config().vocab_size;
        while !live.is_empty() {
            let mut segments: Vec<Segment<'_>> = caches
                .iter_mut()
                .zip(&inputs)
                .enumerate()
                .filter(|(i, _)| live.contains(i))
                .map(|(_, (cache, tokens))| Segment { tokens, cache })
                .collect();
            let logits = self.forward_batch(&mut segments, Logits::Last)?;
            let mut rows = vec![0.0f32; live.len() * vocab];
            logits.realize_into(&mut rows)?;
            let now = start.elapsed().as_secs_f64();
            let mut going = Vec::with_capacity(live.len());
            for (row, &i) in rows.chunks_exact(vocab).zip(&live) {
                let token = options.sampling.choose(row, &mut rngs[i])?;
                let g = &mut out[i];
                if g.tokens.is_empty() {
                    g.first_token_seconds = now;
                }
                g.tokens.push(token);
                let more = g.tokens.len() < options.max_new_tokens;
                if on_token(i, token) && more && !options.stop_tokens.contains(&token) {
                    going.push(i);
                    inputs[i] = vec![token];
                } else {
                    g.decode_seconds = now - g.first_token_seconds;
                }
            }
            live = going;
        }
        Ok(out)
    }
}
