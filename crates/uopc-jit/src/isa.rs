//! The host's code generators, built once per process.

use cranelift_codegen::CodegenError;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable, SetError};
use std::sync::{Arc, LazyLock};

/// Why no code generator could be built for this host.
#[derive(Debug, thiserror::Error)]
pub enum IsaError {
    /// Cranelift refused a setting.
    #[error("setting {name}: {source}")]
    Setting {
        /// The setting's name.
        name: &'static str,
        /// Cranelift's reason.
        #[source]
        source: SetError,
    },
    /// Cranelift has no back end for this host.
    #[error("unsupported host: {0}")]
    Host(&'static str),
    /// Building the ISA from its settings failed.
    #[error(transparent)]
    Build(#[from] CodegenError),
}

/// The host ISA at `opt_level=speed` and at `opt_level=none`, both without PIC and with
/// libcalls resolved by symbol (the JIT registers every callee explicitly).
pub(crate) struct HostIsas {
    pub speed: OwnedTargetIsa,
    pub none: OwnedTargetIsa,
}

fn build(opt: &'static str) -> Result<OwnedTargetIsa, IsaError> {
    let mut fb = settings::builder();
    for (name, value) in [("opt_level", opt), ("use_colocated_libcalls", "false"), ("is_pic", "false")] {
        fb.set(name, value).map_err(|source| IsaError::Setting { name, source })?;
    }
    let ib = cranelift_native::builder().map_err(IsaError::Host)?;
    Ok(ib.finish(settings::Flags::new(fb))?)
}

static ISAS: LazyLock<Result<HostIsas, Arc<IsaError>>> =
    LazyLock::new(|| Ok(HostIsas { speed: build("speed")?, none: build("none")? }).map_err(Arc::new));

/// The host's ISAs, or why there are none (the same error every time).
pub(crate) fn host_isas() -> Result<&'static HostIsas, Arc<IsaError>> {
    ISAS.as_ref().map_err(Arc::clone)
}

/// Whether the CPU has fused multiply-add (without it Cranelift would call `fmaf`).
pub(crate) fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}
