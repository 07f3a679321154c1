//! The machine model: what it reads off this CPU, what it chooses for models of the CPUs the
//! crate targets, and that each choice the hardware here can run gives right results.

use half::bf16;
use uopc_tile::machine::{Choices, GemmBlocking, IsaCap, Machine, require_or_skip};
use uopc_tile::{Bf16Path, GemmShape, Isa, gemm, gemm_bf16};

fn preset(name: &str) -> Machine {
    Machine::preset(name).unwrap_or_else(|| panic!("preset {name}"))
}

#[test]
fn every_preset_chooses_what_its_cpu_class_needs() {
    let want = [
        // (preset, f32 ISA, bf16 path, accumulators needed)
        ("avx512-2port", Isa::Avx512, Bf16Path::Avx512Widen, 8),
        ("avx512-amx", Isa::Avx512, Bf16Path::Amx, 8),
        ("avx512-1port", Isa::Avx512, Bf16Path::Avx512Bf16, 4),
        ("avx2", Isa::Avx2Fma, Bf16Path::Avx2Fma, 8),
        ("portable", Isa::Portable, Bf16Path::Portable, 4),
    ];
    assert_eq!(want.len(), Machine::PRESETS.len());
    for (name, isa, bf16_path, accumulators) in want {
        let m = preset(name);
        let c = Choices::for_machine(&m);
        assert_eq!((c.f32_isa, c.bf16, c.accumulators_needed), (isa, bf16_path, accumulators), "{name}");
        // The register tile is the kernel's, and holds at least the accumulators the ports need.
        assert_eq!((c.gemm.mr, c.gemm.nr), uopc_tile::register_tile(isa), "{name}");
        if isa != Isa::Portable {
            let vectors = c.gemm.mr * c.gemm.nr / (m.vector_bits() as usize / 32);
            assert!(vectors as u32 >= accumulators, "{name}: {vectors} accumulators");
            assert!(
                vectors as u32 + 2 <= m.vector_registers(),
                "{name}: the tile must leave room for A and B"
            );
        }
        println!("{m}");
    }
}

#[test]
fn blocking_fits_each_cache_level_of_the_model() {
    for name in Machine::PRESETS {
        let m = preset(name);
        let g = Choices::for_machine(&m).gemm;
        let (l1, l2) = (m.cache(1).unwrap(), m.cache(2).unwrap().size_bytes);
        // The A strip and the B panel streaming past it share L1 but one way (or the slab is
        // at its floor); the B block takes half of L2.
        let l1_usable = l1.size_bytes / l1.ways * (l1.ways - 1);
        assert!((g.mr + g.nr) * g.kc * 4 <= l1_usable || g.kc == 64, "{name}: {g:?}");
        assert!(g.nc * g.kc * 4 <= l2 / 2, "{name}: {g:?}");
        // The panel gets the larger share of L1, in proportion to what a k step reads of it.
        assert!(g.nr * g.kc * 4 >= l1_usable / 2 || g.kc == 512, "{name}: {g:?}");
        assert!(
            g.kc.is_multiple_of(8) && g.mc.is_multiple_of(g.mr) && g.nc.is_multiple_of(g.nr),
            "{name}: {g:?}"
        );
        assert!(g.kc >= 64 && g.mc >= g.mr && g.nc >= g.nr, "{name}: {g:?}");
    }
    // A bigger L1 gives a deeper k slab; a bigger L2 a bigger B block.
    let small = Choices::for_machine(&preset("avx512-1port")).gemm;
    let big = Choices::for_machine(&preset("avx512-2port")).gemm;
    assert!(big.kc > small.kc && big.nc * big.kc > small.nc * small.kc, "{small:?} {big:?}");
}

#[test]
fn the_isa_cap_removes_everything_above_it() {
    let full = preset("avx512-amx").features;
    assert_eq!(IsaCap::parse("AVX2"), Some(IsaCap::Avx2));
    assert_eq!(IsaCap::parse("amx"), Some(IsaCap::Native));
    assert_eq!(IsaCap::parse("sse9"), None);
    assert_eq!(IsaCap::Native.apply(full), full);
    let no_amx = IsaCap::Avx512.apply(full);
    assert!(!no_amx.amx_bf16 && no_amx.avx512f && no_amx.avx512bf16);
    let avx2 = IsaCap::Avx2.apply(full);
    assert!(!avx2.avx512f && !avx2.avx512bf16 && avx2.avx2 && avx2.fma);
    assert_eq!(IsaCap::Portable.apply(full), Default::default());
    // Capped models choose below the cap.
    let mut m = preset("avx512-amx");
    m.features = avx2;
    assert_eq!((m.isa(), m.choices().bf16), (Isa::Avx2Fma, Bf16Path::Avx2Fma));
}

#[test]
fn this_machine_is_described_and_its_choices_can_run() {
    let m = Machine::get();
    println!("{m}");
    assert!(m.cache(1).is_some() && m.cache(2).is_some(), "{m:?}");
    assert!(m.cores >= 1 && m.throughput.stream_read_gbps > 0.0);
    assert!((1..=2).contains(&m.throughput.fma_ports));
    let c = m.choices();
    assert!(c.f32_isa.available(), "{c:?}");
    assert_eq!(Isa::detect(), c.f32_isa);
    assert!(c.bf16.available(), "{c:?}");
    // The blocking the GEMM driver reads (cached per register tile) is the model's.
    for isa in Isa::ALL {
        let (mr, nr) = uopc_tile::register_tile(isa);
        assert_eq!(GemmBlocking::of_this_machine(mr, nr), GemmBlocking::for_tile(m, mr, nr), "{isa}");
    }
    let text = m.to_string();
    for part in ["machine:", "isa:", "caches:", "probes", "choices:"] {
        assert!(text.contains(part), "{text}");
    }
}

/// Small integers, exact in bf16, so every path and the f64 reference agree exactly.
fn exact_operands(m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..m * k).map(|x| ((x * 5 + 1) % 7) as f32 - 3.0).collect();
    let b = (0..k * n).map(|x| ((x * 3 + 2) % 5) as f32 - 2.0).collect();
    (a, b)
}

#[test]
fn each_presets_choices_give_exact_results_where_the_hardware_has_them() {
    let (m, n, k) = (67, 93, 300);
    let (a, b) = exact_operands(m, n, k);
    let want: Vec<f32> = (0..m * n)
        .map(|x| {
            (0..k).map(|p| f64::from(a[(x / n) * k + p]) * f64::from(b[p * n + x % n])).sum::<f64>() as f32
        })
        .collect();
    let (a16, b16): (Vec<bf16>, Vec<bf16>) =
        (a.iter().map(|&v| bf16::from_f32(v)).collect(), b.iter().map(|&v| bf16::from_f32(v)).collect());
    let shape = GemmShape::dense(m, n, k, false, false, false);
    for name in Machine::PRESETS {
        let c = Choices::for_machine(&preset(name));
        if require_or_skip(c.f32_isa.name(), c.f32_isa.available()) {
            let mut got = vec![0f32; m * n];
            gemm(c.f32_isa, &shape, &a, &b, &mut got).unwrap();
            assert_eq!(got, want, "{name}: f32 on {}", c.f32_isa);
        }
        if require_or_skip(c.bf16.name(), c.bf16.available()) {
            let mut got = vec![0f32; m * n];
            gemm_bf16(c.bf16, &shape, &a16, &b16, &mut got).unwrap();
            assert_eq!(got, want, "{name}: bf16 on {}", c.bf16);
        }
    }
}
