//! `cargo xtask bench generate`: prompt processing and decode of a checkpoint with
//! `uopc::models`, cold (the first run of the process, compiles included) and warm, and the
//! decode's share of the memory-bandwidth bound (the weights and the cached keys and values a
//! step reads, over the streaming read measured in the same run). Without
//! `--model`, GPT-2 small (124M) and a Llama of SmolLM-135M's configuration, randomly
//! initialized and written as safetensors checkpoints on first use under `target/bench-models`.

use crate::stats::median;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use uopc::DType;
use uopc::models::{Activations, CausalLm, GenerateOptions, write_f32_safetensors};

/// A random checkpoint the bench writes: its directory name, config.json, and tensors.
struct Spec {
    name: &'static str,
    config: serde_json::Value,
    tensors: Vec<(String, Vec<usize>)>,
}

fn smollm_135m() -> Spec {
    let (v, d, f, layers, h, kv, hd) = (49152, 576, 1536, 30, 9, 3, 64);
    let mut tensors =
        vec![("model.embed_tokens.weight".to_string(), vec![v, d]), ("model.norm.weight".into(), vec![d])];
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        for (n, shape) in [
            ("input_layernorm.weight", vec![d]),
            ("post_attention_layernorm.weight", vec![d]),
            ("self_attn.q_proj.weight", vec![h * hd, d]),
            ("self_attn.k_proj.weight", vec![kv * hd, d]),
            ("self_attn.v_proj.weight", vec![kv * hd, d]),
            ("self_attn.o_proj.weight", vec![d, h * hd]),
            ("mlp.gate_proj.weight", vec![f, d]),
            ("mlp.up_proj.weight", vec![f, d]),
            ("mlp.down_proj.weight", vec![d, f]),
        ] {
            tensors.push((format!("{p}.{n}"), shape));
        }
    }
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": v, "hidden_size": d,
        "intermediate_size": f, "num_hidden_layers": layers, "num_attention_heads": h,
        "num_key_value_heads": kv, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu", "bos_token_id": 1,
        "eos_token_id": 2
    });
    Spec { name: "smollm-135m-random", config, tensors }
}

fn gpt2_small() -> Spec {
    let (v, d, layers, positions) = (50257, 768, 12, 1024);
    let mut tensors = vec![
        ("transformer.wte.weight".to_string(), vec![v, d]),
        ("transformer.wpe.weight".into(), vec![positions, d]),
        ("transformer.ln_f.weight".into(), vec![d]),
        ("transformer.ln_f.bias".into(), vec![d]),
    ];
    for i in 0..layers {
        let p = format!("transformer.h.{i}");
        for (n, shape) in [
            ("ln_1.weight", vec![d]),
            ("ln_1.bias", vec![d]),
            ("ln_2.weight", vec![d]),
            ("ln_2.bias", vec![d]),
            ("attn.c_attn.weight", vec![d, 3 * d]),
            ("attn.c_attn.bias", vec![3 * d]),
            ("attn.c_proj.weight", vec![d, d]),
            ("attn.c_proj.bias", vec![d]),
            ("mlp.c_fc.weight", vec![d, 4 * d]),
            ("mlp.c_fc.bias", vec![4 * d]),
            ("mlp.c_proj.weight", vec![4 * d, d]),
            ("mlp.c_proj.bias", vec![d]),
        ] {
            tensors.push((format!("{p}.{n}"), shape));
        }
    }
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": v, "n_embd": d,
        "n_layer": layers, "n_head": 12, "n_positions": positions, "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new", "bos_token_id": 50256, "eos_token_id": 50256
    });
    Spec { name: "gpt2-124m-random", config, tensors }
}

/// Writes `spec` under `root` unless it is there: norms 1 (LayerNorm biases 0), other weights
/// N(0, 0.02) as transformers initializes them, seeded.
fn ensure(spec: &Spec, root: &Path) -> std::io::Result<PathBuf> {
    let dir = root.join(spec.name);
    if dir.join("model.safetensors").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let mut rng = StdRng::seed_from_u64(0);
    let data: Vec<(String, Vec<usize>, Vec<f32>)> = spec
        .tensors
        .iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let norm = name.contains("norm") || name.contains("ln_");
            let values: Vec<f32> = (0..n)
                .map(|_| match (norm, name.ends_with("bias")) {
                    (true, false) => 1.0,
                    (_, true) => 0.0,
                    _ => (rng.random::<f32>() + rng.random::<f32>() + rng.random::<f32>() - 1.5) * 0.04,
                })
                .collect();
            (name.clone(), shape.clone(), values)
        })
        .collect();
    write_f32_safetensors(&dir.join("model.safetensors"), &data)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&spec.config).expect("json"))?;
    Ok(dir)
}

/// The checkpoints to run: those given, or the two default ones (written on first use).
pub fn models(given: Vec<PathBuf>) -> std::io::Result<Vec<PathBuf>> {
    if !given.is_empty() {
        return Ok(given);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-models");
    [smollm_135m(), gpt2_small()].iter().map(|s| ensure(s, &root)).collect()
}

/// What `bench generate` runs on each model.
pub struct Runs {
    /// The dtype the weight matrices are held in.
    pub dtype: DType,
    /// How activations meet 16-bit weights; `None` for the model's own choice.
    pub activations: Option<Activations>,
    /// Sequences generated together, each with its own prompt.
    pub batch: usize,
    /// Tokens per prompt (seeded ids).
    pub prompt_tokens: usize,
    /// Tokens generated per sequence, greedily, with no stop token.
    pub new_tokens: usize,
    /// Runs per model; the first is cold (the process's first run, compiles included).
    pub reps: usize,
}

/// Runs each model as `runs` says; prints a line per model and writes `json` when given.
pub fn run(models: &[PathBuf], runs: &Runs, json: Option<&Path>) -> ExitCode {
    let &Runs { dtype, activations, batch, prompt_tokens, new_tokens, reps } = runs;
    let mut rows = Vec::new();
    println!(
        "{:<24} {:>6} {:>6} {:>6} {:>8} {:>6} {:>16} {:>15} {:>14} {:>14} {:>12} {:>12}",
        "model",
        "dtype",
        "acts",
        "batch",
        "prompt",
        "new",
        "first token ms",
        "prompt tok/s",
        "decode ms/step",
        "load s",
        "stream GB/s",
        "of bw bound"
    );
    for dir in models {
        let start = std::time::Instant::now();
        let model = match CausalLm::load_as(dir, dtype) {
            Ok(m) => match activations {
                Some(a) => m.with_activations(a),
                None => m,
            },
            Err(e) => {
                eprintln!("error: {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        };
        let load = start.elapsed().as_secs_f64();
        let prompts = random_sequences(model.config().vocab_size, batch, prompt_tokens, 1);
        let prompt_refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let options = GenerateOptions::greedy(new_tokens);
        let (mut first, mut prompt_rate, mut decode) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            match model.generate_batch(&prompt_refs, &options, |_, _| true) {
                Ok(g) => {
                    // Every sequence runs to the end, so each one's timings are the batch's.
                    first.push(g[0].first_token_seconds * 1e3);
                    prompt_rate.push((batch * prompt_tokens) as f64 / g[0].first_token_seconds);
                    decode.push(g[0].decode_ms_per_token());
                }
                Err(e) => {
                    eprintln!("error: {}: {e}", dir.display());
                    return ExitCode::FAILURE;
                }
            }
        }
        let warm = |v: &[f64]| median(if v.len() > 1 { &v[1..] } else { v });
        // The bytes one decode step must read at the middle of the generation: every weight
        // once (in its dtype), and the keys and values cached so far (in the cache's dtype).
        let c = model.config();
        let weights: usize = model.leaves().iter().map(|l| l.dtype().size() * l.numel()).sum();
        let cached = prompt_tokens + new_tokens / 2;
        let cache_element = model.new_cache(1).dtype().size();
        let cache_bytes = batch * cache_element * 2 * c.layers * cached * c.kv_heads * c.head_dim;
        let stream_gbs = uopc::masked_attention::streaming_read_gbs(256, rayon::current_num_threads(), 5);
        let bound_ms = (weights + cache_bytes) as f64 / (stream_gbs * 1e9) * 1e3;
        let acts = format!("{:?}", model.activations()).to_lowercase();
        let name = dir.file_name().map_or(String::new(), |n| n.to_string_lossy().to_string());
        println!(
            "{name:<24} {:>6} {acts:>6} {batch:>6} {prompt_tokens:>8} {new_tokens:>6} {:>16.1} {:>15.1} {:>14.2} {load:>14.2} {stream_gbs:>12.1} {:>11.0}%",
            dtype.to_string(),
            first[0],
            warm(&prompt_rate),
            warm(&decode),
            100.0 * bound_ms / warm(&decode)
        );
        rows.push(serde_json::json!({
            "model": name, "dtype": dtype.to_string(), "batch": batch, "prompt_tokens": prompt_tokens,
            "activations": acts, "cache_dtype": model.new_cache(1).dtype().to_string(),
            "new_tokens": new_tokens, "first_token_ms": first[0], "first_token_ms_runs": first,
            "prompt_tokens_per_s": warm(&prompt_rate), "prompt_tokens_per_s_runs": prompt_rate,
            "decode_ms_per_token": warm(&decode), "decode_ms_per_token_runs": decode, "load_s": load,
            "decode_bytes_per_token": weights + cache_bytes, "streaming_read_gbs": stream_gbs,
            "bandwidth_bound_ms_per_token": bound_ms, "decode_share_of_bandwidth_bound": bound_ms / warm(&decode),
        }));
    }
    crate::write_results(json, &rows)
}

/// `count` sequences of `len` token ids below `vocab`, seeded.
pub fn random_sequences(vocab: usize, count: usize, len: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count).map(|_| (0..len).map(|_| (rng.random::<u64>() % vocab as u64) as u32).collect()).collect()
}
