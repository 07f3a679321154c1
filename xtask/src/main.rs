//! Developer chores for uopc. `cargo xtask bench attention --help` lists the options.

mod attention;
mod backward;
mod block;
mod circles;
mod derived;
mod flex;
mod generate;
mod masked;
mod matmul;
mod mca;
mod mlp;
mod peak;
mod record;
mod reductions;
mod reference;
mod sdpa;
mod stats;
mod svg;
mod train;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

pub use record::{machine_record, write_results};

/// uopc developer tasks.
#[derive(Parser)]
#[command(name = "xtask", about = "uopc developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Measure compiled programs.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
    /// Predict the GEMM micro-kernels' inner loops with llvm-mca on CPU models not at hand
    /// (sapphirerapids for AVX-512, znver3 for AVX2): cycles per iteration against the FMA bound.
    Mca {
        /// Write the predictions here as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Print the machine model uopc detected here and the path each tile op chose.
    Machine,
    /// Fail on an import circle between the files of one crate (CI runs it).
    Circles,
}

#[derive(Subcommand)]
enum Bench {
    /// Time unfused, fused and online attention against an f64 reference.
    Attention(AttentionArgs),
    /// Measure this machine's FMA peaks: F32X4 from JIT-compiled FMA chains (what Cranelift
    /// code can reach), and the 256- and 512-bit peaks of the tile micro-kernels; then the bf16
    /// peaks (AMX tiles, AVX512_BF16) on 1 and 2 threads and the 1024^3 bf16 tile GEMM on 2.
    Peak {
        /// Write every figure here as JSON (`amx_bf16_peak_gflops`, `amx_gemm_1024_gflops`, ...).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The GPT-2-small transformer block of `uopc::gpt` through the Tensor API: forward, and
    /// forward plus backward (every parameter's gradient and the input's).
    Block {
        /// Batch items.
        #[arg(long, default_value_t = 4)]
        batch: usize,
        /// Tokens per item.
        #[arg(long, default_value_t = 512)]
        tokens: usize,
        /// Timed realizes per pass and round.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Interleaved rounds over both passes.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Threads (a rayon pool of this size around the whole bench).
        #[arg(long)]
        threads: Option<usize>,
        /// Also time both passes with GEMM epilogues unfused
        /// (`Experiments::unfused_gemm_epilogues`), interleaved with the fused passes in every
        /// round: extra rows `forward_unfused_epilogues` and `forward_backward_unfused_epilogues`.
        #[arg(long)]
        compare_unfused_epilogues: bool,
        /// Write `{"results": [{pass, batch, n, d_model, heads, median_ms, best_ms, kernels}]}` here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// One training step of a two-layer MLP (forward, mean-squared loss, every weight's
    /// gradient) with each activation (relu, gelu_tanh, exact gelu, silu), interleaved.
    Mlp {
        /// Rows per step.
        #[arg(long, default_value_t = 1024)]
        batch: usize,
        /// Input features.
        #[arg(long, default_value_t = 64)]
        inputs: usize,
        /// Hidden units.
        #[arg(long, default_value_t = 512)]
        hidden: usize,
        /// Outputs.
        #[arg(long, default_value_t = 16)]
        outputs: usize,
        /// Timed realizes per activation and round.
        #[arg(long, default_value_t = 10)]
        reps: usize,
        /// Interleaved rounds over the activations.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Threads (a rayon pool of this size around the whole bench).
        #[arg(long)]
        threads: Option<usize>,
        /// Write `{"machine", "shape", "results": [{activation, median_ms, ...}]}` here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// `Tensor::matmul` through the whole Tensor path, in the orientations of a linear layer
    /// (`ab`), its input gradient (`a-bt`) and its weight gradient (`at-b`).
    Matmul {
        /// `M,K,N` (repeatable) [default: 128,768,3072 2048,768,3072 2048,3072,768].
        #[arg(long = "shape", value_parser = matmul::parse_shape)]
        shapes: Vec<[usize; 3]>,
        /// Orientations (comma separated).
        #[arg(long, value_enum, value_delimiter = ',', default_value = "ab,a-bt,at-b")]
        forms: Vec<matmul::Form>,
        /// Element types of the operands and product (comma separated; each one a cell).
        #[arg(long = "dtype", value_enum, value_delimiter = ',', default_value = "f32")]
        dtypes: Vec<matmul::Dtype>,
        /// Timed realizes per cell and round.
        #[arg(long, default_value_t = 10)]
        reps: usize,
        /// Interleaved rounds over all cells.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Threads (a rayon pool of this size around the whole bench).
        #[arg(long)]
        threads: Option<usize>,
        /// Also time every cell with its GEMM epilogue (a 16-bit product's rounding cast)
        /// unfused (`Experiments::unfused_gemm_epilogues`), interleaved with the fused cells.
        #[arg(long)]
        compare_unfused_epilogues: bool,
        /// Write `{"results": [{m, k, n, form, median_ms, best_ms, gflops, ...}]}` here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Attention as a fused Tensor expression (the derived online softmax on tile ops) against
    /// the attention API's kernel, on batched multi-head and causal shapes.
    Derived {
        /// Timed runs per form and round.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Interleaved rounds.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Threads (a rayon pool of this size around the whole bench).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Max-subtracted sums over long rows (logsumexp, cross-entropy, its gradient): fused with
    /// online sums, fused as written and unfused, against the streaming read bandwidth.
    Reductions {
        /// Rows of the logits.
        #[arg(long, default_value_t = 256)]
        rows: usize,
        /// Columns (classes) of the logits.
        #[arg(long, default_value_t = 32000)]
        cols: usize,
        /// Timed realizes per cell and round.
        #[arg(long, default_value_t = 10)]
        reps: usize,
        /// Interleaved rounds over all cells.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Threads (a rayon pool of this size around the whole bench).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Causal attention (WHERE mask and ragged key loop) against non-causal, batched multi-head.
    Masked {
        /// Key (and query) lengths N (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "1024,2048")]
        n: Vec<usize>,
        /// Head dimension D.
        #[arg(long, default_value_t = 64)]
        d: usize,
        /// Batch items.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Heads.
        #[arg(long, default_value_t = 1)]
        heads: usize,
        /// Query length when it differs from the key length.
        #[arg(long)]
        nq: Option<usize>,
        /// Timed repetitions (interleaved across the three forms).
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// Flash-decoding (one query, a long key cache) against streaming bandwidth.
    Decode {
        /// Key lengths (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "65536")]
        nk: Vec<usize>,
        /// Head dimension D.
        #[arg(long, default_value_t = 64)]
        d: usize,
        /// Heads (16 x 65536 keys x 64 reads 512 MB of K and V: past every cache).
        #[arg(long, default_value_t = 16)]
        heads: usize,
        /// Key chunks per head processed by different threads.
        #[arg(long, default_value_t = 64)]
        chunks: usize,
        /// Timed repetitions.
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// Prompt and greedy decode with `uopc::models`: first token (cold), prompt tokens/s, decode
    /// ms/token (warm medians). Without --model, GPT-2 small and a SmolLM-135M-shaped Llama,
    /// random weights, written under target/bench-models on first use.
    Generate {
        /// A checkpoint directory (repeatable).
        #[arg(long = "model")]
        models: Vec<PathBuf>,
        /// Prompt tokens.
        #[arg(long, default_value_t = 512)]
        prompt_tokens: usize,
        /// New tokens.
        #[arg(long, default_value_t = 128)]
        new_tokens: usize,
        /// Sequences generated together (`CausalLm::generate_batch`), each with its own prompt.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// The dtype the weight matrices are held in (the sums stay f32; the cache is bf16 with bf16 activations).
        #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
        dtype: String,
        /// How activations meet 16-bit weights (`models::Activations`): bf16 rounds a long
        /// product's activations where the machine multiplies bf16 itself; default the
        /// model's own (bf16 with bf16 weights, else f32).
        #[arg(long, value_parser = ["f32", "bf16"])]
        activations: Option<String>,
        /// Runs per model (the first is cold).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Threads (a rayon pool of this size around the whole bench).
        #[arg(long)]
        threads: Option<usize>,
        /// Write `{"machine", "results": [{model, dtype, batch, prompt_tokens, new_tokens,
        /// prompt_tokens_per_s, decode_ms_per_token, first_token_ms, ...}]}` here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Training steps with `uopc::models` (the batch's loss, its gradients, an AdamW step):
    /// cold, then warm medians in tokens/s. Without --model, `bench generate`'s checkpoints.
    Train {
        /// A checkpoint directory (repeatable).
        #[arg(long = "model")]
        models: Vec<PathBuf>,
        /// Sequences per step.
        #[arg(long, default_value_t = 4)]
        batch: usize,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 128)]
        tokens: usize,
        /// Steps per model (the first is cold).
        #[arg(long, default_value_t = 6)]
        steps: usize,
        /// Threads (a rayon pool of this size around the whole bench).
        #[arg(long)]
        threads: Option<usize>,
        /// Write `{"machine", "results": [{model, batch, tokens, step_ms, tokens_per_s, ..}]}` here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Attention with score and mask functions compiled in (`Sdpa::compile_flex`): causal,
    /// sliding window, document, ALiBi, softcap, sinks and prefix-LM, forward and forward +
    /// backward (with the float captures' gradients), each beside the plain causal kernels of
    /// its shape; the share of key blocks computed and the error on a
    /// sample of rows. Without --n/--d/--heads the cells (1,8,8,2048,64) and (1,32,8,4096,128).
    Flex {
        /// A case (repeatable): causal, sliding_window, document, alibi, softcap, sinks,
        /// prefix_lm; default all.
        #[arg(long = "case")]
        cases: Vec<String>,
        /// Sequence length (queries = keys; repeatable).
        #[arg(long = "n")]
        ns: Vec<usize>,
        /// Head dimension (repeatable).
        #[arg(long = "d")]
        ds: Vec<usize>,
        /// Query heads (repeatable; paired with --kv-heads in order).
        #[arg(long = "heads")]
        heads: Vec<usize>,
        /// Key/value heads (repeatable; default each --heads).
        #[arg(long = "kv-heads")]
        kv_heads: Vec<usize>,
        /// Batch items.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Keys of the sliding window.
        #[arg(long, default_value_t = 256)]
        window: i64,
        /// A pass (repeatable): forward, forward_backward; default both.
        #[arg(long = "pass")]
        passes: Vec<String>,
        /// Timed runs per cell and round.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Interleaved rounds.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Threads (a rayon pool of this size around the whole bench).
        #[arg(long)]
        threads: Option<usize>,
        /// Write `{"machine", "results": [{case, batch, heads, kv_heads, n, d, pass, median_ms,
        /// max_abs_err, blocks_computed, ...}]}` here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The one attention entry point (`uopc::kernels::sdpa`) on model shapes: useful GFLOP/s,
    /// share of the widest FMA peak, error against f64; without --shape a default matrix.
    Sdpa(SdpaArgs),
    /// Time the attention backward pass: autograd of the unfused graph against recompute.
    Backward {
        /// Sequence lengths N (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "256,512,1024")]
        n: Vec<usize>,
        /// Head dimension D.
        #[arg(long, default_value_t = 64)]
        d: usize,
        /// Timed repetitions after one warm-up.
        #[arg(long, default_value_t = 3)]
        reps: usize,
    },
}

/// Options of `bench sdpa`.
#[derive(Args, Debug, Clone)]
pub struct SdpaArgs {
    /// A cell `B,H,HKV,NQ,NK,D` (repeatable).
    #[arg(long = "shape", value_parser = sdpa::parse_shape)]
    shapes: Vec<[usize; 6]>,
    /// The given shapes are causal.
    #[arg(long)]
    causal: bool,
    /// Key lengths of the given shapes, one per batch item.
    #[arg(long, value_delimiter = ',')]
    key_lengths: Option<Vec<i32>>,
    /// Timed runs per cell per round.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Rounds over all cells (interleaved, so load changes hit every cell alike).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Threads of the pool the kernels run on (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Write `{"results": [...]}` here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Decode steps of a growing KV cache (capacity 4096) run through one cached compile;
    /// default 1000 with the default matrix, none with --shape.
    #[arg(long)]
    decode_steps: Option<usize>,
    /// Time the forward (with lse) plus the FlashAttention-2 backward instead (rows with
    /// `pass: "backward"`); without --shape the default backward matrix.
    #[arg(long)]
    backward: bool,
    /// Element type of q, k, v and the output: f32, bf16 or f16 (repeatable: each cell
    /// runs in each, interleaved in the same rounds); default f32. --backward times f32 only (the
    /// 16-bit backward is the f32 one on widened inputs).
    #[arg(long = "dtype", value_parser = sdpa::parse_dtype)]
    dtypes: Vec<uopc::kernels::sdpa::SdpaDType>,
    /// Also run each cell whose K and V are packed once per run with every task packing
    /// its own blocks instead (its own row, interleaved in the same rounds).
    #[arg(long)]
    compare_per_task_packing: bool,
    /// Also time each causal cell without the mask (where that cell is not already in the
    /// run), run by run alternating with it, and print causal / non-causal time; a causal
    /// cell and its unmasked form in one run (as in the default matrix) always get that line.
    #[arg(long)]
    causal_ratio: bool,
}

/// Options of `bench attention`.
#[derive(Args, Debug, Clone)]
pub struct AttentionArgs {
    /// Sequence lengths N (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048")]
    pub n: Vec<usize>,
    /// Head dimension D.
    #[arg(long, default_value_t = 64)]
    pub d: usize,
    /// Forms to measure (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "unfused,fused,online,flash_tile_ops")]
    pub variants: Vec<attention::Variant>,
    /// Timed repetitions per form and N, after one warm-up [default: 5]
    #[arg(long)]
    pub reps: Option<usize>,
    /// Rounds the repetitions are spread over: each round times every form and size and
    /// measures the FMA peaks again, and the best of all rounds is reported, so a burst of
    /// other work on a shared machine spoils only some samples of each figure.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Small sizes (N = 64,128) and 3 repetitions: a smoke run that finishes in seconds.
    #[arg(long)]
    pub quick: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a log-log plot of best time against N to this SVG file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Size of the thread pool kernels run on [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Compile every kernel as plain scalar code (no vectorization, FMA contraction, split
    /// sums or tile GEMMs): the baseline the code generator is measured against.
    #[arg(long)]
    pub scalar: bool,
    /// Also print each kernel of the Tensor forms: best time, GFLOP/s and % of peak.
    #[arg(long)]
    pub kernels: bool,
    /// Query block x key block of `flash_tiled` and `flash_tile_ops`, like `4x32` [default:
    /// 4x32 for flash_tiled, 256x128 for flash_tile_ops and flash_tile_ops_causal].
    #[arg(long, value_parser = stats::parse_tile)]
    pub flash_tile: Option<(usize, usize)>,
}

/// `go` on a rayon pool of `threads` threads, or on the global pool without a count. The
/// kernels run on whichever pool calls them, so a pool of the asked size around a whole bench
/// sets the thread count of every kernel and peak it measures.
/// `bench generate`: its options checked, its models written if needed, then timed.
fn bench_generate(what: Bench) -> ExitCode {
    let Bench::Generate { models, prompt_tokens, new_tokens, batch, dtype, activations, reps, threads, json } =
        what
    else {
        unreachable!("called with bench generate's options")
    };
    let dtype = match dtype.as_str() {
        "bf16" => uopc::DType::BF16,
        "f16" => uopc::DType::F16,
        _ => uopc::DType::F32,
    };
    if prompt_tokens == 0 || new_tokens == 0 || reps == 0 || batch == 0 || threads == Some(0) {
        eprintln!("error: --prompt-tokens, --new-tokens, --reps, --batch and --threads must be at least 1");
        return ExitCode::from(2);
    }
    let models = match generate::models(models) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: cannot write the random checkpoints: {e}");
            return ExitCode::FAILURE;
        }
    };
    let activations = activations.map(|a| match a.as_str() {
        "bf16" => uopc::models::Activations::Bf16,
        _ => uopc::models::Activations::F32,
    });
    let runs = generate::Runs { dtype, activations, batch, prompt_tokens, new_tokens, reps };
    with_threads(threads, || generate::run(&models, &runs, json.as_deref()))
}

/// `bench flex`: its options checked, its cells timed.
fn bench_flex(what: Bench) -> ExitCode {
    let Bench::Flex { cases, ns, ds, heads, kv_heads, batch, window, passes, reps, rounds, threads, json } =
        what
    else {
        unreachable!("called with bench flex's options")
    };
    let backward = match flex::passes(&passes) {
        Ok(b) => b,
        Err(bad) => {
            eprintln!("error: --pass {bad}: not forward or forward_backward");
            return ExitCode::from(2);
        }
    };
    let Some(cells) = flex::cells(cases, ns, ds, heads, kv_heads, batch) else { return ExitCode::from(2) };
    let cells: Vec<flex::FlexCell> = backward
        .iter()
        .flat_map(|&backward| cells.iter().map(move |c| flex::FlexCell { backward, ..c.clone() }))
        .collect();
    if reps == 0 || rounds == 0 || threads == Some(0) || window < 1 {
        eprintln!("error: --reps, --rounds, --threads and --window must be at least 1");
        return ExitCode::from(2);
    }
    with_threads(threads, || flex::run(&cells, window, reps, rounds, json.as_deref()))
}

fn with_threads(threads: Option<usize>, go: impl FnOnce() -> ExitCode + Send) -> ExitCode {
    match threads {
        Some(t) => match rayon::ThreadPoolBuilder::new().num_threads(t).build() {
            Ok(pool) => pool.install(go),
            Err(e) => {
                eprintln!("error: cannot start {t} threads: {e}");
                ExitCode::FAILURE
            }
        },
        None => go(),
    }
}

/// `bench sdpa`: checks the options, builds the cells and runs the forward or backward bench.
fn bench_sdpa(args: SdpaArgs) -> ExitCode {
    let SdpaArgs {
        shapes,
        causal,
        key_lengths,
        reps,
        rounds,
        threads,
        json,
        decode_steps,
        backward,
        mut dtypes,
        compare_per_task_packing,
        causal_ratio,
    } = args;
    if dtypes.is_empty() {
        dtypes.push(uopc::kernels::sdpa::SdpaDType::F32);
    }
    dtypes.dedup();
    if backward && dtypes.iter().any(|&d| d != uopc::kernels::sdpa::SdpaDType::F32) {
        eprintln!(
            "error: --backward times f32 only (the 16-bit backward runs the f32 one on widened inputs)"
        );
        return ExitCode::from(2);
    }
    let decode_steps = decode_steps.unwrap_or(if shapes.is_empty() && !backward { 1000 } else { 0 });
    if decode_steps > sdpa::DECODE_CAPACITY {
        eprintln!("error: --decode-steps is at most {}", sdpa::DECODE_CAPACITY);
        return ExitCode::from(2);
    }
    if reps == 0 || rounds == 0 || threads == Some(0) {
        eprintln!("error: --reps, --rounds and --threads must be at least 1");
        return ExitCode::from(2);
    }
    let mut cells = if shapes.is_empty() && backward {
        sdpa::default_backward_cells()
    } else if shapes.is_empty() {
        sdpa::default_cells()
    } else {
        shapes
            .into_iter()
            .map(|shape| sdpa::Cell { shape, causal, key_lengths: key_lengths.clone() })
            .collect()
    };
    if causal_ratio {
        cells = sdpa::with_unmasked_forms(cells);
    }
    for c in &cells {
        let [b, h, hkv, _, n_k, _] = c.shape;
        if c.shape.contains(&0) || h % hkv != 0 {
            eprintln!("error: {:?}: sizes must be positive and H a multiple of HKV", c.shape);
            return ExitCode::from(2);
        }
        if let Some(l) = &c.key_lengths
            && (l.len() != b || l.iter().any(|&x| x < 0 || x as usize > n_k))
        {
            eprintln!("error: --key-lengths needs {b} lengths in 0..={n_k}");
            return ExitCode::from(2);
        }
    }
    let go = || {
        if backward {
            sdpa::run_backward(&cells, reps, rounds, json.as_deref())
        } else {
            sdpa::run(&cells, &dtypes, reps, rounds, decode_steps, compare_per_task_packing, json.as_deref())
        }
    };
    with_threads(threads, go)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.task {
        Task::Bench { what: Bench::Attention(mut args) } => {
            if args.quick {
                args.n = vec![64, 128];
                args.reps.get_or_insert(3);
            }
            match args.threads {
                Some(0) => {
                    eprintln!("error: --threads must be at least 1");
                    ExitCode::from(2)
                }
                threads => with_threads(threads, || attention::run(&args)),
            }
        }
        Task::Bench { what: Bench::Sdpa(args) } => bench_sdpa(args),
        Task::Bench { what: Bench::Backward { n, d, reps } } => {
            if n.is_empty() || n.contains(&0) || d == 0 {
                eprintln!("error: --n and --d must be positive");
                return ExitCode::from(2);
            }
            backward::run(&n, d, reps)
        }
        Task::Bench { what: Bench::Masked { n, d, batch, heads, nq, reps } } => {
            if n.is_empty() || n.contains(&0) || d == 0 || batch == 0 || heads == 0 || nq == Some(0) {
                eprintln!("error: sizes must be positive");
                return ExitCode::from(2);
            }
            masked::run_masked(&masked::MaskedArgs { n, d, batch, heads, nq, reps })
        }
        Task::Bench { what: Bench::Decode { nk, d, heads, chunks, reps } } => {
            if nk.is_empty() || nk.contains(&0) || d == 0 || heads == 0 || chunks == 0 {
                eprintln!("error: sizes must be positive");
                return ExitCode::from(2);
            }
            masked::run_decode(&nk, d, heads, chunks, reps)
        }
        Task::Bench { what: Bench::Derived { reps, rounds, threads } } => {
            if reps == 0 || rounds == 0 || threads == Some(0) {
                eprintln!("error: --reps, --rounds and --threads must be at least 1");
                return ExitCode::from(2);
            }
            with_threads(threads, || derived::run(reps, rounds))
        }
        Task::Bench { what: Bench::Reductions { rows, cols, reps, rounds, threads } } => {
            if rows == 0 || cols == 0 || reps == 0 || rounds == 0 || threads == Some(0) {
                eprintln!("error: --rows, --cols, --reps, --rounds and --threads must be at least 1");
                return ExitCode::from(2);
            }
            with_threads(threads, || reductions::run(rows, cols, reps, rounds))
        }
        Task::Bench {
            what: Bench::Block { batch, tokens, reps, rounds, threads, compare_unfused_epilogues, json },
        } => {
            if batch == 0 || tokens == 0 || reps == 0 || rounds == 0 || threads == Some(0) {
                eprintln!("error: --batch, --tokens, --reps, --rounds and --threads must be at least 1");
                return ExitCode::from(2);
            }
            let go = || block::run(batch, tokens, reps, rounds, compare_unfused_epilogues, json.as_deref());
            with_threads(threads, go)
        }
        Task::Bench {
            what:
                Bench::Matmul { shapes, forms, dtypes, reps, rounds, threads, compare_unfused_epilogues, json },
        } => {
            if reps == 0 || rounds == 0 || threads == Some(0) || forms.is_empty() || dtypes.is_empty() {
                eprintln!(
                    "error: --reps, --rounds and --threads must be at least 1, and --forms and --dtype not empty"
                );
                return ExitCode::from(2);
            }
            let shapes = if shapes.is_empty() { matmul::default_shapes() } else { shapes };
            let go = || {
                matmul::run(
                    &shapes,
                    &forms,
                    &dtypes,
                    reps,
                    rounds,
                    compare_unfused_epilogues,
                    json.as_deref(),
                )
            };
            with_threads(threads, go)
        }
        Task::Bench { what: Bench::Mlp { batch, inputs, hidden, outputs, reps, rounds, threads, json } } => {
            if [batch, inputs, hidden, outputs, reps, rounds].contains(&0) || threads == Some(0) {
                eprintln!("error: every size, --reps, --rounds and --threads must be at least 1");
                return ExitCode::from(2);
            }
            let shape = mlp::MlpShape { batch, inputs, hidden, outputs };
            with_threads(threads, || mlp::run(shape, reps, rounds, json.as_deref()))
        }
        Task::Bench { what: Bench::Peak { json } } => peak::run(json.as_deref()),
        Task::Bench { what: flex @ Bench::Flex { .. } } => bench_flex(flex),
        Task::Bench { what: generate @ Bench::Generate { .. } } => bench_generate(generate),
        Task::Bench { what: Bench::Train { models, batch, tokens, steps, threads, json } } => {
            if [batch, steps].contains(&0) || tokens < 2 || threads == Some(0) {
                eprintln!("error: --batch, --steps and --threads must be at least 1, --tokens at least 2");
                return ExitCode::from(2);
            }
            let steps = train::Steps { batch, tokens, steps };
            with_threads(threads, || train::run(models, &steps, json.as_deref()))
        }
        Task::Mca { json } => mca::run(json.as_deref()),
        Task::Circles => {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or(std::path::Path::new("."));
            circles::run(root)
        }
        Task::Machine => record::print_machine(),
    }
}
