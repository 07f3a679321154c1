//! `bench sdpa --backward`: the forward with lse plus the FlashAttention-2 backward, timed
//! together per cell, against the f64 reference backward.

use super::*;

struct PreparedBackward {
    cell: Cell,
    config: SdpaConfig,
    bwd: SdpaBackward,
    compile_ms: f64,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    out: Vec<f32>,
    lse: Vec<f32>,
    grads: [Vec<f32>; 3],
    times: Vec<f64>,
}

impl PreparedBackward {
    /// One forward (with lse) and backward.
    fn step(&mut self) -> Result<(), String> {
        let extras = Extras { key_lengths: self.cell.key_lengths.as_deref(), ..Extras::default() };
        self.bwd
            .forward(&self.q, &self.k, &self.v, extras, &mut self.out, &mut self.lse)
            .map_err(|e| e.to_string())?;
        let saved = ForwardSaved { q: &self.q, k: &self.k, v: &self.v, o: &self.out, lse: &self.lse };
        let [dq, dk, dv] = &mut self.grads;
        self.bwd.run(saved, &self.d_o, extras, dq, dk, dv).map_err(|e| e.to_string())
    }

    /// The largest error of dq, dk and dv on batch item 0's first key/value group against the
    /// f64 reference backward (BHND: that group's q, dO and dq rows and its k, v, dk and dv
    /// rows are prefixes of the buffers, and no other head reaches its dk and dv).
    fn error(&self) -> f64 {
        let c = &self.config;
        let sub = SdpaConfig { batch: 1, heads: c.heads / c.kv_heads, kv_heads: 1, ..*c };
        let lens = self.cell.key_lengths.as_deref();
        let want = reference_backward_f64(
            &sub,
            &self.q[..sub.q_len()],
            &self.k[..sub.kv_len()],
            &self.v[..sub.kv_len()],
            &self.d_o[..sub.q_len()],
            Extras { key_lengths: lens.map(|l| &l[..1]), ..Extras::default() },
        );
        let n = [sub.q_len(), sub.kv_len(), sub.kv_len()];
        (0..3)
            .map(|g| uopc::kernels::reference::max_abs_err(&self.grads[g][..n[g]], &want[g]))
            .fold(0.0, f64::max)
    }
}

/// The backward bench: per cell, the forward with lse plus the backward, timed together;
/// GFLOP/s count the backward as 2.5 times the forward's useful FLOPs.
pub fn run_backward(cells: &[Cell], reps: usize, rounds: usize, json: Option<&std::path::Path>) -> ExitCode {
    let peak = crate::attention::measure_widest_peak();
    let mut prepared = Vec::new();
    for cell in cells {
        let config = config(cell);
        let mut rng = StdRng::seed_from_u64(
            0xb4c ^ cell.shape.iter().fold(0u64, |h, &x| h.wrapping_mul(31) ^ x as u64),
        );
        let mut fill = |n: usize, s: f32| (0..n).map(|_| rng.random_range(-s..s)).collect::<Vec<f32>>();
        let (q, k, v) = (fill(config.q_len(), 2.0), fill(config.kv_len(), 2.0), fill(config.kv_len(), 1.0));
        let d_o = fill(config.q_len(), 1.0);
        let start = Instant::now();
        let bwd = match SdpaBackward::compile(&config) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {:?}: {e}", cell.shape);
                return ExitCode::FAILURE;
            }
        };
        let compile_ms = start.elapsed().as_secs_f64() * 1e3;
        let lse = vec![0.0; bwd.lse_len()];
        let grads = [vec![0.0; config.q_len()], vec![0.0; config.kv_len()], vec![0.0; config.kv_len()]];
        let out = vec![0.0; config.q_len()];
        prepared.push(PreparedBackward {
            cell: cell.clone(),
            config,
            bwd,
            compile_ms,
            q,
            k,
            v,
            d_o,
            out,
            lse,
            grads,
            times: Vec::new(),
        });
    }
    let groups = groups_of(&prepared, |p| (p.cell.shape, p.cell.key_lengths.clone()));
    if let Err(code) =
        time_interleaved(&mut prepared, &groups, rounds, reps, |p| (&p.cell, &mut p.times), |p| p.step())
    {
        return code;
    }
    let mut rows = Vec::new();
    println!(
        "{:<28} {:>6} {:>9} {:>9} {:>8} {:>6} {:>9} {:>8} {:>10}  kernel",
        "B,H,HKV,NQ,NK,D",
        "causal",
        "median ms",
        "best ms",
        "GFLOP/s",
        "%peak",
        "max err",
        "compile",
        "temp bytes"
    );
    for p in prepared {
        let median = crate::stats::median(&p.times);
        let best = p.times.iter().copied().fold(f64::INFINITY, f64::min);
        let lens = p.cell.key_lengths.as_deref();
        let forward_flops = 4.0 * p.config.d as f64 * useful_pairs(&p.config, lens);
        let gflops = 3.5 * forward_flops / (median * 1e-3) / 1e9;
        let pct = peak.map_or(f64::NAN, |(_, g)| 100.0 * gflops / g);
        let err = p.error();
        let (f, b) = (p.bwd.forward_blocking(), p.bwd.blocking());
        let panels = match f.kv_panel_width {
            0 => String::new(),
            w => format!(" kv-panels {w}"),
        };
        let kernel = format!(
            "flash_tile_ops {}x{}x{}{panels} + backward {}x{} chunks {}",
            f.heads_per_task, f.queries, f.keys, b.queries, b.keys, b.chunks
        );
        let temp = p.bwd.temporary_bytes();
        let shape = p.cell.shape.map(|x| x.to_string()).join(",");
        let shape = if lens.is_some() { format!("{shape} len") } else { shape };
        println!(
            "{shape:<28} {:>6} {median:>9.3} {:>9.3} {gflops:>8.1} {pct:>6.1} {err:>9.1e} {:>6.1}ms {temp:>10}  {kernel}",
            p.cell.causal, best, p.compile_ms
        );
        let [batch, heads, kv_heads, n_q, n_k, d] = p.cell.shape;
        rows.push(Row {
            batch,
            heads,
            kv_heads,
            n_q,
            n_k,
            d,
            causal: p.cell.causal,
            key_lengths: p.cell.key_lengths.clone(),
            dtype: "f32",
            pass: "backward",
            kernel,
            median_ms: median,
            best_ms: best,
            gflops,
            percent_of_widest_peak: pct,
            max_abs_err: err,
            compile_ms: p.compile_ms,
            kv_gbs: None,
            percent_of_stream: None,
            temporary_bytes: Some(temp),
            causal_over_non_causal: None,
            speed_vs_f32_paired: None,
        });
    }
    finish(peak, None, 0, rows, json)
}
