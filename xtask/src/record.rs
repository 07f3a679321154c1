//! What every bench's JSON record holds: the machine it ran on, and the writer of the record.

use std::process::ExitCode;

/// Writes `{"machine": machine_record(), "results": rows}` to `path` when given (rows of any
/// serializable type); failure to write is the bench's exit status.
pub fn write_results(path: Option<&std::path::Path>, rows: &impl serde::Serialize) -> ExitCode {
    let Some(path) = path else { return ExitCode::SUCCESS };
    let record = serde_json::json!({ "machine": machine_record(), "results": rows });
    let text = serde_json::to_string_pretty(&record).expect("rows serialize to JSON");
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("error: cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The machine model a bench ran on, for its JSON record: the model's text (CPU name, ISA,
/// caches, probes, choices) and its key figures as fields.
pub fn machine_record() -> serde_json::Value {
    let m = uopc::machine::Machine::get();
    let c = m.choices();
    serde_json::json!({
        "model_name": m.model_name,
        "family": m.family,
        "model": m.model,
        "isa": m.isa().name(),
        "fma_ports": m.throughput.fma_ports,
        "bf16_dot_over_fma": m.throughput.bf16_dot_over_fma,
        "caches_bytes": m.caches.iter().map(|c| (format!("L{}", c.level), c.size_bytes)).collect::<std::collections::BTreeMap<_, _>>(),
        "bf16_path": c.bf16.name(),
        "gemm_blocking": [c.gemm.mr, c.gemm.nr, c.gemm.kc, c.gemm.mc, c.gemm.nc],
        "text": m.to_string(),
    })
}

/// `cargo xtask machine`: the machine model, then which ISA paths this machine runs and which
/// it skips.
pub fn print_machine() -> ExitCode {
    println!("{}", uopc::machine::Machine::get());
    let list = |names: Vec<(&'static str, bool)>, ran: bool| -> String {
        let v: Vec<&str> = names.iter().filter(|(_, ok)| *ok == ran).map(|(n, _)| *n).collect();
        if v.is_empty() { String::from("none") } else { v.join(" ") }
    };
    let isas: Vec<_> = uopc_tile::Isa::ALL.iter().map(|i| (i.name(), i.available())).collect();
    let bf16: Vec<_> = uopc_tile::Bf16Path::ALL.iter().map(|p| (p.name(), p.available())).collect();
    println!("ISA paths run here: f32/f16 {}; bf16 {}", list(isas.clone(), true), list(bf16.clone(), true));
    println!("ISA paths skipped here: f32/f16 {}; bf16 {}", list(isas, false), list(bf16, false));
    ExitCode::SUCCESS
}
