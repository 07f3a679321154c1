//! Developer chores for uopc. `cargo xtask bench attention --help` lists the options.

mod attention;
mod backward;
mod reference;
mod svg;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

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
}

#[derive(Subcommand)]
enum Bench {
    /// Time unfused, fused and online attention against an f64 reference.
    Attention(AttentionArgs),
    /// Measure this machine's F32X4 FMA peak with JIT-compiled FMA chains.
    Peak,
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
    #[arg(long, value_delimiter = ',', default_value = "unfused,fused,online")]
    pub variants: Vec<attention::Variant>,
    /// Timed repetitions per form and N, after one warm-up [default: 5]
    #[arg(long)]
    pub reps: Option<usize>,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.task {
        Task::Bench { what: Bench::Attention(mut args) } => {
            if args.quick {
                args.n = vec![64, 128];
                args.reps.get_or_insert(3);
            }
            if let Some(t) = args.threads {
                if t == 0 {
                    eprintln!("error: --threads must be at least 1");
                    return ExitCode::from(2);
                }
                // rayon sizes its global pool from this variable when the pool is first used,
                // which is after this point.
                // SAFETY: no other thread exists yet, so nothing reads the environment concurrently.
                unsafe { std::env::set_var("RAYON_NUM_THREADS", t.to_string()) };
            }
            attention::run(&args)
        }
        Task::Bench { what: Bench::Backward { n, d, reps } } => {
            if n.is_empty() || n.contains(&0) || d == 0 {
                eprintln!("error: --n and --d must be positive");
                return ExitCode::from(2);
            }
            backward::run(&n, d, reps)
        }
        Task::Bench { what: Bench::Peak } => match attention::measure_peak() {
            Some(p) => {
                println!(
                    "F32X4 FMA peak: {p:.1} GFLOP/s on all cores (128-bit vectors: Cranelift's widest on x86-64)"
                );
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("error: could not compile or run the FMA loop on this machine");
                ExitCode::FAILURE
            }
        },
    }
}
