//! The generator's own guarantees: determinism and well-formedness.

use uopc_testgen::{Mode, Options, Profile, Rng, generate, magnitude_twin};

#[test]
fn every_generated_program_verifies() {
    for seed in 0..2000u64 {
        for profile in [Profile::Exact, Profile::Smooth] {
            let case = generate(&mut Rng::new(seed), profile, Mode::Value, Options::default());
            if let Err(e) = uopc_ir::verify(&case.program) {
                panic!("seed {seed} {profile:?}: {e}\n{}", uopc_ir::print_graph(&case.program));
            }
            assert_eq!(case.inputs.len(), case.written.len());
        }
        let twin = magnitude_twin(&Rng::new(seed), Options::default());
        uopc_ir::verify(&twin).unwrap_or_else(|e| panic!("seed {seed} magnitude twin: {e}"));
    }
}

#[test]
fn generation_is_deterministic() {
    for seed in [0u64, 1, 42, 9999] {
        let a = generate(&mut Rng::new(seed), Profile::Exact, Mode::Value, Options::default());
        let b = generate(&mut Rng::new(seed), Profile::Exact, Mode::Value, Options::default());
        assert_eq!(uopc_ir::print_program(&a.program).unwrap(), uopc_ir::print_program(&b.program).unwrap());
        assert_eq!(format!("{:?}", a.inputs), format!("{:?}", b.inputs));
    }
}

#[test]
fn byte_sources_generate_valid_programs() {
    let mut bytes = Vec::new();
    for k in 0..500u32 {
        bytes.push((k.wrapping_mul(2_654_435_761) >> 13) as u8);
        let case = generate(&mut Rng::from_bytes(&bytes), Profile::Exact, Mode::Value, Options::default());
        uopc_ir::verify(&case.program).unwrap_or_else(|e| panic!("{} bytes: {e}", bytes.len()));
    }
}

#[test]
fn variables_get_one_admitted_value_per_slot() {
    let (mut with_vars, mut at_lo, mut at_hi) = (0, 0, 0);
    for seed in 0..500u64 {
        let case = generate(&mut Rng::new(seed), Profile::Exact, Mode::Value, Options::default());
        // verify numbers the variables 0..n; the case holds one value per slot, in bounds.
        let lin = uopc_ir::verify(&case.program).unwrap();
        assert_eq!(lin.vars.len(), case.vars.len(), "seed {seed}");
        for (v, &value) in lin.vars.iter().zip(&case.vars) {
            let uopc_ir::Op::Var { lo, hi, .. } = *v.op() else { unreachable!() };
            assert!((lo..=hi).contains(&value), "seed {seed}: {value} outside {lo}..={hi}");
            at_lo += (value == lo) as usize;
            at_hi += (value == hi) as usize;
        }
        with_vars += !case.vars.is_empty() as usize;
        let plain = Options { variables: false, ..Options::default() };
        assert!(generate(&mut Rng::new(seed), Profile::Exact, Mode::Value, plain).vars.is_empty());
    }
    // Both bounds of the proofs are exercised, in a good share of the programs.
    assert!(with_vars > 50 && at_lo > 10 && at_hi > 10, "{with_vars} programs, {at_lo} at lo, {at_hi} at hi");
}

#[test]
fn some_programs_read_and_write_16_bit_buffers() {
    use uopc_ir::{DType, HostBuffer};
    // (loads, stores) of each 16-bit dtype over the seeds, for both profiles.
    let mut seen = [[0usize; 2]; 2];
    for seed in 0..400u64 {
        for profile in [Profile::Exact, Profile::Smooth] {
            let case = generate(&mut Rng::new(seed), profile, Mode::Value, Options::default());
            for (b, written) in case.inputs.iter().zip(&case.written) {
                let k = match b {
                    HostBuffer::BF16(_) => 0,
                    HostBuffer::F16(_) => 1,
                    _ => continue,
                };
                assert!(matches!(b.dtype(), DType::BF16 | DType::F16));
                seen[k][*written as usize] += 1;
            }
        }
    }
    assert!(seen.iter().flatten().all(|&n| n >= 10), "16-bit buffers (read, written): {seen:?}");
}
