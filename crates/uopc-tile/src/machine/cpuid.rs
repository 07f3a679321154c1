//! What CPUID says about the CPU: vendor, brand string, family and model, and the data caches.
//! The one place of the crate that reads CPUID for the machine model.

use super::{CacheLevel, Vendor};

/// The identity and caches CPUID reports (fallbacks filled in where a leaf is missing).
pub(super) struct CpuIdentity {
    pub vendor: Vendor,
    pub model_name: String,
    pub family: u32,
    pub model: u32,
    pub caches: Vec<CacheLevel>,
}

/// Caches assumed when CPUID describes none: 32 KiB L1d, 1 MiB L2, 32 MiB L3, 64-byte lines.
pub(super) fn fallback_caches() -> Vec<CacheLevel> {
    vec![
        CacheLevel { level: 1, size_bytes: 32 << 10, line_bytes: 64, ways: 8, shared_by_threads: 1 },
        CacheLevel { level: 2, size_bytes: 1 << 20, line_bytes: 64, ways: 16, shared_by_threads: 1 },
        CacheLevel { level: 3, size_bytes: 32 << 20, line_bytes: 64, ways: 16, shared_by_threads: 16 },
    ]
}

#[cfg(target_arch = "x86_64")]
pub(super) fn read() -> CpuIdentity {
    use std::arch::x86_64::__cpuid_count;
    let leaf0 = __cpuid_count(0, 0);
    let vendor_bytes: Vec<u8> =
        [leaf0.ebx, leaf0.edx, leaf0.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
    let vendor = match &vendor_bytes[..] {
        b"GenuineIntel" => Vendor::Intel,
        b"AuthenticAMD" => Vendor::Amd,
        other => Vendor::Other(String::from_utf8_lossy(other).into_owned()),
    };
    let leaf1 = __cpuid_count(1, 0);
    let base_family = (leaf1.eax >> 8) & 0xf;
    let family = if base_family == 0xf { base_family + ((leaf1.eax >> 20) & 0xff) } else { base_family };
    let model = if base_family == 0x6 || base_family == 0xf {
        ((leaf1.eax >> 4) & 0xf) | (((leaf1.eax >> 16) & 0xf) << 4)
    } else {
        (leaf1.eax >> 4) & 0xf
    };
    let max_ext = __cpuid_count(0x8000_0000, 0).eax;
    let model_name = if max_ext >= 0x8000_0004 {
        let bytes: Vec<u8> = (0x8000_0002u32..=0x8000_0004)
            .flat_map(|leaf| {
                let r = __cpuid_count(leaf, 0);
                [r.eax, r.ebx, r.ecx, r.edx].into_iter().flat_map(u32::to_le_bytes)
            })
            .collect();
        String::from_utf8_lossy(&bytes).trim_matches(char::from(0)).trim().to_string()
    } else {
        String::from("unknown")
    };
    // Leaf 4 on Intel; on AMD the same layout at 0x8000001D when topology extensions exist.
    let cache_leaf = match vendor {
        Vendor::Amd if max_ext >= 0x8000_001d && __cpuid_count(0x8000_0001, 0).ecx & (1 << 22) != 0 => {
            Some(0x8000_001d)
        }
        Vendor::Intel if leaf0.eax >= 4 => Some(4),
        _ => None,
    };
    let mut caches = Vec::new();
    if let Some(leaf) = cache_leaf {
        for sub in 0..16 {
            let r = __cpuid_count(leaf, sub);
            let kind = r.eax & 0x1f;
            if kind == 0 {
                break;
            }
            // 1 = data, 3 = unified; instruction caches do not hold operands.
            if kind != 1 && kind != 3 {
                continue;
            }
            let ways = ((r.ebx >> 22) & 0x3ff) as usize + 1;
            let partitions = ((r.ebx >> 12) & 0x3ff) as usize + 1;
            let line = (r.ebx & 0xfff) as usize + 1;
            let sets = r.ecx as usize + 1;
            caches.push(CacheLevel {
                level: ((r.eax >> 5) & 0x7) as u8,
                size_bytes: ways * partitions * line * sets,
                line_bytes: line,
                ways,
                shared_by_threads: ((r.eax >> 14) & 0xfff) as usize + 1,
            });
        }
    }
    if caches.iter().all(|c| c.level != 1) || caches.iter().all(|c| c.level != 2) {
        caches = fallback_caches();
    }
    caches.sort_by_key(|c| c.level);
    CpuIdentity { vendor, model_name, family, model, caches }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn read() -> CpuIdentity {
    CpuIdentity {
        vendor: Vendor::Other(String::from(std::env::consts::ARCH)),
        model_name: String::from("unknown"),
        family: 0,
        model: 0,
        caches: fallback_caches(),
    }
}
