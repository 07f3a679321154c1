//! Resource release, in its own test binary so no concurrent test disturbs the RSS reading.

use uopc_ir::*;
use uopc_jit::Program;

#[test]
fn compiled_code_is_freed_on_drop() {
    fn rss_kb() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4)
    }
    let n = 64;
    let (a, b, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n), buffer(2, DType::F32, n));
    let i = range(n, 0, AxisType::Thread);
    let p = sink(&[out.index(&i).store(a.index(&i).load() * 2.0f32 + b.index(&i).load()).end(&[i])]);
    for _ in 0..50 {
        drop(Program::compile(&p, "warm").unwrap());
    }
    let Some(before) = rss_kb() else { return };
    for _ in 0..1500 {
        drop(Program::compile(&p, "churn").unwrap());
    }
    let after = rss_kb().unwrap();
    // Leaking each module's code pages would cost at least 4 KiB per program (6 MB here).
    assert!(after < before + 3000, "RSS grew from {before} kB to {after} kB");
}
