//! Stores computed from a register tile's vectors (`plan_packed_stores`): four stores to
//! consecutive elements whose values differ only in the tile's lanes, contiguous loads and
//! shared scalars become one F32X4 computation and store. Checked against the interpreter, and
//! for the shape of the code: packed where memory order allows it, scalar where a lane reads
//! what another lane wrote. Packing is decided while lowering to Cranelift (the loop IR keeps
//! scalar stores), so the shape checks read the CLIF.

use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{JitOptions, OptLevel, Program};

/// `C[i, j*8 + c] = C[i, j*8 + c + shift] * alpha + sum_k A[i, k] * B[k, j*8 + c]`, the sum in
/// a 1 x 8 register tile (two F32X4). `shift = 0` reads the element it writes; `shift = -1`
/// reads the element the previous column just wrote, so the eight updates are a chain.
fn scaled_gemm(m: usize, n: usize, k: usize, shift: i64) -> UOp {
    let (a, b) = (buffer(0, DType::F32, m * k), buffer(1, DType::F32, k * n));
    // one spare element in front, so column 0 may read at -1
    let c = buffer(2, DType::F32, m * n + 1);
    let alpha = buffer(3, DType::F32, 1);
    let i = range(m, 0, AxisType::Thread);
    let j = range(n / 8, 1, AxisType::Loop);
    let kk = range(k, 2, AxisType::Reduce);
    let accs: Vec<UOp> = (0..8).map(|s| alloc(s, DType::F32, 1).after(&[i.clone(), j.clone()])).collect();
    let mut updates = Vec::new();
    for (col, acc) in accs.iter().enumerate() {
        let init = acc.index(0).store(0.0f32);
        let at = acc.after(&[init, kk.clone()]).index(0);
        let x = a.index(&i * k + &kk).load() * b.index(&kk * n + &j * 8 + col as i64).load();
        updates.push(at.store(at.load() + x));
    }
    let done = sink(&updates).end(&[kk]);
    let tile_done = std::slice::from_ref(&done);
    let ct = c.after(tile_done);
    let scale = alpha.index(0).load();
    let stores: Vec<UOp> = accs
        .iter()
        .enumerate()
        .map(|(col, acc)| {
            let at = &i * n + &j * 8 + (col as i64 + 1);
            let old = ct.index(&at + shift).load();
            ct.index(at).store(old * &scale + acc.after(tile_done).index(0).load())
        })
        .collect();
    sink(&[sink(&stores).end(&[j]).end(&[i])])
}

fn inputs(m: usize, n: usize, k: usize) -> Vec<HostBuffer> {
    let a: Vec<f32> = (0..m * k).map(|x| ((x * 37) % 11) as f32 * 0.25 - 1.0).collect();
    let b: Vec<f32> = (0..k * n).map(|x| ((x * 13) % 7) as f32 * 0.5 - 1.5).collect();
    let c: Vec<f32> = (0..m * n + 1).map(|x| ((x * 5) % 9) as f32 - 4.0).collect();
    vec![HostBuffer::F32(a), HostBuffer::F32(b), HostBuffer::F32(c), HostBuffer::F32(vec![0.5])]
}

/// JIT at `opt_level` against the interpreter; returns the CLIF.
fn check(program: &UOp, m: usize, n: usize, k: usize, opt_level: OptLevel) -> String {
    let opts = JitOptions { opt_level, ..JitOptions::default() };
    let prg = Program::compile_with(program, "scaled_gemm", &opts).unwrap();
    let bufs = inputs(m, n, k);
    let (a, b, alpha) = match (&bufs[0], &bufs[1], &bufs[3]) {
        (HostBuffer::F32(a), HostBuffer::F32(b), HostBuffer::F32(s)) => (a.clone(), b.clone(), s.clone()),
        _ => unreachable!("f32 inputs"),
    };
    let HostBuffer::F32(c) = &bufs[2] else { unreachable!("f32 output") };
    let mut c = c.clone();
    prg.run_f32(&[&a, &b, &alpha], &mut [&mut c]).unwrap();
    let mut want = bufs;
    interp::run(program, &mut want, Precision::Native).unwrap();
    let HostBuffer::F32(want) = &want[2] else { unreachable!("f32 output") };
    // The JIT contracts products into FMAs and the interpreter rounds them apart: |values| stay
    // below 2^7 here, so the difference stays below a few f32 ulps of 2^7 per term.
    for (x, (got, want)) in c.iter().zip(want).enumerate() {
        assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "element {x}: {got} vs {want}");
    }
    prg.clif().to_string()
}

fn vector_stores(clif: &str) -> usize {
    clif.lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("store notrap v") || l.starts_with("store.f32x4 ")
        })
        .count()
}

#[test]
fn updates_from_a_tile_pack_into_vector_fmas_and_stores() {
    let (m, n, k) = (5, 24, 9);
    for level in [OptLevel::None, OptLevel::Speed] {
        let clif = check(&scaled_gemm(m, n, k, 0), m, n, k, level);
        assert_eq!(vector_stores(&clif), 2, "two F32X4 of the tile, each one store:\n{clif}");
        assert!(!clif.contains("fma.f32 "), "no scalar FMAs:\n{clif}");
    }
}

#[test]
fn a_lane_reading_what_another_lane_wrote_stays_scalar() {
    // Column c reads the element column c - 1 just stored: computing the four lanes at once
    // would read the old values. The planner must leave these stores alone.
    let (m, n, k) = (3, 16, 5);
    for level in [OptLevel::None, OptLevel::Speed] {
        let clif = check(&scaled_gemm(m, n, k, -1), m, n, k, level);
        assert_eq!(vector_stores(&clif), 0, "{clif}");
    }
}
