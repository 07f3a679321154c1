//! The thin seam between plans and the backend: compile a kernel, run it on host buffers.
//!
//! With the `jit` feature (the default) kernels are Cranelift-compiled; without it they run
//! on the IR's reference interpreter.

use crate::error::{BackendError, Result, TensorError};
use std::mem::MaybeUninit;
use uopc_ir::{HostBuffer, UOp};

/// A compiled kernel.
pub(crate) struct Exe {
    #[cfg(feature = "jit")]
    program: uopc_jit::Program,
    #[cfg(not(feature = "jit"))]
    program: UOp,
    name: String,
    estimates: (u64, u64),
    /// Element counts of the output slots when the program writes several (see
    /// [`uopc_ir::CustomKernel::output_parts`]); empty for one output.
    output_parts: Vec<usize>,
}

/// A buffer a kernel writes: initialized memory, or fresh memory for a slot the kernel writes
/// whole without reading it ([`Exe::writes_whole`]), which then needs no zeroing.
pub(crate) enum Written {
    /// Initialized memory.
    Init(HostBuffer),
    /// Elements not yet initialized.
    Fresh(Fresh),
}

/// Fresh memory of one of the float types a kernel's output may have.
pub(crate) enum Fresh {
    F32(Vec<MaybeUninit<f32>>),
    BF16(Vec<MaybeUninit<half::bf16>>),
    F16(Vec<MaybeUninit<half::f16>>),
}

/// `v`'s elements as initialized values.
///
/// # Safety
///
/// Every element of `v` is initialized.
unsafe fn assume_init<T>(v: Vec<MaybeUninit<T>>) -> Vec<T> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: the pointer, length and capacity are the vector's own, `T` has the size and
    // alignment of `MaybeUninit<T>`, and the caller guarantees the elements are initialized.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<T>(), v.len(), v.capacity()) }
}

impl Written {
    /// `len` fresh elements of `dtype`, or `None` for a dtype a fresh output cannot have (only
    /// the float types can).
    pub(crate) fn fresh(dtype: uopc_ir::DType, len: usize) -> Option<Written> {
        use uopc_ir::DType;
        Some(Written::Fresh(match dtype {
            DType::F32 => Fresh::F32(uopc_ir::memory::uninit_f32(len)),
            DType::BF16 => Fresh::BF16(uopc_ir::memory::uninit_16bit(len)),
            DType::F16 => Fresh::F16(uopc_ir::memory::uninit_16bit(len)),
            _ => return None,
        }))
    }

    /// The buffer after a successful run of a kernel writing it: fresh memory then holds the
    /// kernel's values, since the backend accepts it only for slots the program writes whole.
    pub(crate) fn into_init(self) -> HostBuffer {
        match self {
            Written::Init(b) => b,
            // SAFETY: the run succeeded, and the backend ran it with this memory only after
            // checking that the program stores every element of its slot (and reads none), so
            // every element is initialized.
            Written::Fresh(Fresh::F32(v)) => HostBuffer::F32(unsafe { assume_init(v) }),
            // SAFETY: as above.
            Written::Fresh(Fresh::BF16(v)) => HostBuffer::BF16(unsafe { assume_init(v) }),
            // SAFETY: as above.
            Written::Fresh(Fresh::F16(v)) => HostBuffer::F16(unsafe { assume_init(v) }),
        }
    }
}

fn backend_err(kernel: &str, source: BackendError) -> TensorError {
    TensorError::Backend { kernel: kernel.to_string(), source }
}

impl Exe {
    #[cfg(feature = "jit")]
    pub(crate) fn compile(program: &UOp, name: &str, scalar: bool) -> Result<Exe> {
        let options = if scalar { uopc_jit::JitOptions::scalar() } else { uopc_jit::JitOptions::default() };
        let program =
            uopc_jit::Program::compile_with(program, name, &options).map_err(|e| backend_err(name, e))?;
        let e = program.estimates();
        Ok(Exe { program, name: name.to_string(), estimates: (e.flops, e.bytes), output_parts: Vec::new() })
    }

    #[cfg(not(feature = "jit"))]
    pub(crate) fn compile(program: &UOp, name: &str, _scalar: bool) -> Result<Exe> {
        let lin = uopc_ir::verify(program)
            .map_err(|source| TensorError::Ir { kernel: name.to_string(), source })?;
        let bytes = lin.buffers.iter().map(|b| b.dtype().size() as u64 * buffer_len(b) as u64).sum();
        let flops = crate::cost::static_flops(program)
            .map_err(|source| TensorError::Ir { kernel: name.to_string(), source })?;
        Ok(Exe {
            program: program.clone(),
            name: name.to_string(),
            estimates: (flops, bytes),
            output_parts: Vec::new(),
        })
    }

    /// The kernel writes its output as consecutive parts of these lengths, one slot each.
    pub(crate) fn with_output_parts(mut self, parts: Vec<usize>) -> Exe {
        self.output_parts = parts;
        self
    }

    /// The loop program as nested loops.
    pub(crate) fn loop_ir(&self) -> String {
        #[cfg(feature = "jit")]
        return self.program.loop_ir().to_string();
        #[cfg(not(feature = "jit"))]
        return uopc_ir::print_program(&self.program).unwrap_or_else(|e| e.to_string());
    }

    /// The Cranelift IR, when compiled.
    pub(crate) fn clif(&self) -> Option<&str> {
        #[cfg(feature = "jit")]
        return Some(self.program.clif());
        #[cfg(not(feature = "jit"))]
        return None;
    }

    /// The machine code, when compiled.
    pub(crate) fn machine_code(&self) -> &[u8] {
        #[cfg(feature = "jit")]
        return self.program.machine_code();
        #[cfg(not(feature = "jit"))]
        return &[];
    }

    /// Static `(flops, bytes)` of one run.
    pub(crate) fn estimates(&self) -> (u64, u64) {
        self.estimates
    }

    /// Whether the program writes its output slot as one buffer (not in parts).
    pub(crate) fn writes_one_output(&self) -> bool {
        self.output_parts.len() <= 1
    }

    /// [`Exe::run`] with a caller's f32 memory as the (single) output.
    #[cfg(feature = "jit")]
    pub(crate) fn run_into_f32(&self, inputs: &[&HostBuffer], out: &mut [f32]) -> Result<()> {
        use uopc_jit::Arg;
        let mut args: Vec<Arg<'_>> = inputs.iter().map(|b| Arg::from(*b)).collect();
        args.push(Arg::WriteF32(out));
        self.program.run(&mut args).map_err(|e| backend_err(&self.name, e))
    }

    /// [`Exe::run`] with a caller's f32 memory as the (single) output; the interpreter runs
    /// on owned buffers, so this one copies in and out.
    #[cfg(not(feature = "jit"))]
    pub(crate) fn run_into_f32(&self, inputs: &[&HostBuffer], out: &mut [f32]) -> Result<()> {
        let mut buf = HostBuffer::F32(out.to_vec());
        let res = self.run(inputs, &mut buf);
        if let HostBuffer::F32(v) = &buf
            && v.len() == out.len()
        {
            out.copy_from_slice(v);
        }
        res
    }

    /// Whether the program writes every element of slot `slot` and reads none, so the buffer
    /// there need not be initialized before a run ([`Written::Fresh`]).
    pub(crate) fn writes_whole(&self, slot: usize) -> bool {
        #[cfg(feature = "jit")]
        return self.output_parts.len() <= 1 && self.program.writes_whole(slot);
        #[cfg(not(feature = "jit"))]
        return self.output_parts.len() <= 1 && uopc_ir::stores_every_element(&self.program, slot);
    }

    /// Runs with `inputs` in slots `0..n` and `outs` in the slots after them, one each (one
    /// output, or several for a kernel that joined kernels share).
    #[cfg(feature = "jit")]
    pub(crate) fn run_written(&self, inputs: &[&HostBuffer], outs: &mut [Written]) -> Result<()> {
        use uopc_jit::Arg;
        if let [Written::Init(out)] = outs {
            return self.run(inputs, out);
        }
        let mut args: Vec<Arg<'_>> = inputs.iter().map(|b| Arg::from(*b)).collect();
        args.extend(outs.iter_mut().map(|o| match o {
            Written::Init(b) => Arg::from(b),
            Written::Fresh(Fresh::F32(v)) => Arg::WriteF32Uninit(v.as_mut_slice()),
            Written::Fresh(Fresh::BF16(v)) => Arg::WriteBF16Uninit(v.as_mut_slice()),
            Written::Fresh(Fresh::F16(v)) => Arg::WriteF16Uninit(v.as_mut_slice()),
        }));
        self.program.run(&mut args).map_err(|e| backend_err(&self.name, e))
    }

    /// Runs with `inputs` in slots `0..n` and `outs` in the slots after them, one each; the
    /// interpreter takes initialized buffers, so fresh ones are zeroed first.
    #[cfg(not(feature = "jit"))]
    pub(crate) fn run_written(&self, inputs: &[&HostBuffer], outs: &mut [Written]) -> Result<()> {
        for o in outs.iter_mut() {
            if let Written::Fresh(f) = o {
                let zeros = match f {
                    Fresh::F32(v) => HostBuffer::F32(vec![0.0; v.len()]),
                    Fresh::BF16(v) => HostBuffer::zeros(uopc_ir::DType::BF16, v.len()),
                    Fresh::F16(v) => HostBuffer::zeros(uopc_ir::DType::F16, v.len()),
                };
                *o = Written::Init(zeros);
            }
        }
        if let [Written::Init(out)] = outs {
            return self.run(inputs, out);
        }
        let mut bufs: Vec<HostBuffer> = inputs.iter().map(|b| (*b).clone()).collect();
        let n = bufs.len();
        bufs.extend(outs.iter_mut().map(|o| match o {
            Written::Init(b) => std::mem::replace(b, HostBuffer::F32(Vec::new())),
            Written::Fresh(_) => unreachable!("zeroed above"),
        }));
        let res = uopc_ir::interp::run(&self.program, &mut bufs, uopc_ir::interp::Precision::Native);
        for (o, b) in outs.iter_mut().zip(bufs.drain(n..)) {
            *o = Written::Init(b);
        }
        res.map_err(|e| backend_err(&self.name, e))
    }

    /// Runs with `inputs` in slots `0..n` and `out` in the last slot.
    #[cfg(feature = "jit")]
    pub(crate) fn run(&self, inputs: &[&HostBuffer], out: &mut HostBuffer) -> Result<()> {
        use uopc_jit::Arg;
        let mut args: Vec<Arg<'_>> = inputs.iter().map(|b| Arg::from(*b)).collect();
        match (self.output_parts.len(), out) {
            (0 | 1, out) => args.push(Arg::from(out)),
            (_, HostBuffer::F32(v)) => {
                let mut rest: &mut [f32] = v.as_mut_slice();
                for &len in &self.output_parts {
                    let len = len.min(rest.len());
                    let (part, tail) = std::mem::take(&mut rest).split_at_mut(len);
                    args.push(Arg::WriteF32(part));
                    rest = tail;
                }
            }
            (_, _) => {
                return Err(TensorError::Unsupported(format!(
                    "kernel {}: several outputs must be f32",
                    self.name
                )));
            }
        }
        self.program.run(&mut args).map_err(|e| backend_err(&self.name, e))
    }

    /// Runs with `inputs` in slots `0..n` and `out` in the last slot.
    #[cfg(not(feature = "jit"))]
    pub(crate) fn run(&self, inputs: &[&HostBuffer], out: &mut HostBuffer) -> Result<()> {
        let mut bufs: Vec<HostBuffer> = inputs.iter().map(|b| (*b).clone()).collect();
        let n = bufs.len();
        if self.output_parts.len() > 1 {
            let whole = out.to_f64_vec();
            let mut at = 0;
            for &len in &self.output_parts {
                bufs.push(HostBuffer::F32(whole[at..at + len].iter().map(|&x| x as f32).collect()));
                at += len;
            }
        } else {
            bufs.push(std::mem::replace(out, HostBuffer::F32(Vec::new())));
        }
        let res = uopc_ir::interp::run(&self.program, &mut bufs, uopc_ir::interp::Precision::Native);
        *out = if self.output_parts.len() > 1 {
            HostBuffer::F32(bufs.drain(n..).flat_map(|b| b.to_f64_vec()).map(|x| x as f32).collect())
        } else {
            bufs.pop().expect("output pushed above")
        };
        res.map_err(|e| backend_err(&self.name, e))
    }
}

#[cfg(not(feature = "jit"))]
fn buffer_len(b: &UOp) -> usize {
    match b.op() {
        uopc_ir::Op::Buffer { len, .. } => *len,
        _ => 0,
    }
}
