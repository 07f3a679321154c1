//! Running a [`Program`]: arguments checked against its buffers, THREAD chunks over rayon.

use crate::args::{Arg, BufRef};
use crate::{JitError, Program};
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Buffer pointers shared by the chunks of one run.
struct SharedPointers(Vec<*mut u8>);
// SAFETY: the pointers are only dereferenced by the kernel, under the conditions stated in
// `Program::run`: chunks that run at once write disjoint memory.
unsafe impl Sync for SharedPointers {}
// SAFETY: as above.
unsafe impl Send for SharedPointers {}

impl SharedPointers {
    /// The pointer array the kernel receives as `bufs`.
    fn as_ptr(&self) -> *const *mut u8 {
        self.0.as_ptr()
    }
}

impl Program {
    /// Runs the program on f32 buffers: `inputs` fill the read-only slots and `outputs` the
    /// written ones, each in slot order.
    ///
    /// # Errors
    ///
    /// As [`Program::run`], and for a wrong number of inputs or outputs.
    pub fn run_f32(&self, inputs: &[&[f32]], outputs: &mut [&mut [f32]]) -> Result<(), JitError> {
        self.run_f32_with_vars(inputs, outputs, &[])
    }

    /// [`Program::run_f32`] with the variables' values, as [`Program::run_with_vars`] takes them.
    ///
    /// # Errors
    ///
    /// As [`Program::run_with_vars`], and for a wrong number of inputs or outputs.
    pub fn run_f32_with_vars(
        &self,
        inputs: &[&[f32]],
        outputs: &mut [&mut [f32]],
        vars: &[i64],
    ) -> Result<(), JitError> {
        let specs = self.buffers();
        let n_in = specs.iter().filter(|s| !s.written).count();
        let n_out = specs.len() - n_in;
        if inputs.len() != n_in || outputs.len() != n_out {
            return Err(JitError::Argument(format!(
                "{}: expects {n_in} inputs and {n_out} outputs, got {} and {}",
                self.name,
                inputs.len(),
                outputs.len()
            )));
        }
        let mut ins = inputs.iter();
        let mut outs = outputs.iter_mut();
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(specs.len());
        for s in specs {
            if s.written {
                args.push(Arg::WriteF32(outs.next().expect("counted above")));
            } else {
                args.push(Arg::Read(BufRef::F32(ins.next().expect("counted above"))));
            }
        }
        self.run_with_vars(&mut args, vars)
    }

    /// Runs a program without variables: one argument per BUFFER slot, in slot order, of the
    /// exact dtype and length the program declares; buffers the program writes must be passed
    /// as writable.
    ///
    /// ```rust
    /// use uopc_ir::{AxisType, DType, buffer, range, sink};
    /// use uopc_jit::{Arg, BufRef, Program};
    ///
    /// let (a, out) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 4));
    /// let i = range(4, 0, AxisType::Loop);
    /// let prg = Program::compile(&sink(&[out.index(&i).store(a.index(&i).load() + 1.0f32).end(&[i])]), "inc")?;
    /// let input = [1.0f32, 2.0, 3.0, 4.0];
    /// let mut result = [0.0f32; 4];
    /// prg.run(&mut [Arg::Read(BufRef::F32(&input)), Arg::WriteF32(&mut result)])?;
    /// assert_eq!(result, [2.0, 3.0, 4.0, 5.0]);
    ///
    /// // A buffer of the wrong length is an error naming the slot, never an out-of-bounds run.
    /// let mut short = [0.0f32; 3];
    /// let err = prg.run(&mut [Arg::Read(BufRef::F32(&input)), Arg::WriteF32(&mut short)]).unwrap_err();
    /// assert!(err.to_string().contains('1'), "{err}");
    /// # Ok::<(), uopc_jit::JitError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`JitError::Argument`](crate::JitError::Argument) for a wrong number of arguments, a
    /// wrong dtype or length, or a read-only argument for a written buffer, each naming the
    /// slot; for a program with variables ([`Program::vars`]), run it with
    /// [`Program::run_with_vars`].
    pub fn run(&self, args: &mut [Arg<'_>]) -> Result<(), JitError> {
        self.run_with_vars(args, &[])
    }

    /// Runs a program with variables ([`uopc_ir::var`]): `args` as for [`Program::run`], and
    /// `vars[k]` the value of variable slot `k`, one per slot of [`Program::vars`].
    ///
    /// Every value is checked against its declared bounds before the call, so a value the
    /// compiler's bounds proofs did not cover never reaches the machine code. The same compiled
    /// program runs with any values inside the bounds: nothing is recompiled.
    ///
    /// ```rust
    /// use uopc_ir::{AxisType, DType, buffer, range, sink, var};
    /// use uopc_jit::{Arg, Program};
    ///
    /// // out[i] = a[i] + 1 for the first L elements of 8, L in 1..=8 given at each run.
    /// let (a, out) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 8));
    /// let i = range(var(0, 1, 8), 0, AxisType::Loop);
    /// let prg = Program::compile(&sink(&[out.index(&i).store(a.index(&i).load() + 1.0f32).end(&[i])]), "prefix")?;
    /// assert_eq!((prg.vars()[0].lo, prg.vars()[0].hi), (1, 8));
    /// let input = [1.0f32; 8];
    /// let mut result = [0.0f32; 8];
    /// prg.run_with_vars(&mut [Arg::from(&input[..]), Arg::from(&mut result[..])], &[3])?;
    /// assert_eq!(result, [2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    ///
    /// // 9 is beyond the declared bounds: an error naming the variable, and nothing runs.
    /// let err = prg.run_with_vars(&mut [Arg::from(&input[..]), Arg::from(&mut result[..])], &[9]).unwrap_err();
    /// assert!(err.to_string().contains("variable 0"), "{err}");
    /// # Ok::<(), uopc_jit::JitError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Program::run`]; also [`JitError::Argument`](crate::JitError::Argument) when `vars`
    /// does not hold one value per variable slot, or a value lies outside its slot's bounds
    /// (naming the slot and its bounds).
    pub fn run_with_vars(&self, args: &mut [Arg<'_>], vars: &[i64]) -> Result<(), JitError> {
        let ptrs = SharedPointers(self.checked_pointers(args)?);
        self.check_vars(vars)?;
        let extent = match &self.thread_extent {
            Some(t) => Some(t.eval(vars).ok_or_else(|| {
                JitError::Internal(format!("{}: the THREAD trip count cannot be evaluated", self.name))
            })?),
            None => None,
        };
        let entry = self.entry;
        let call = |lo: usize, hi: usize| {
            // SAFETY: every pointer is valid for its slot's declared dtype and length (checked
            // by `checked_pointers`), every variable's value lies inside the bounds the
            // verifier assumed (checked by `check_vars`; `vars` holds one per slot), and the
            // verifier proved every index and tile operand of the compiled program inside its
            // buffer's declared length for all such values, so the kernel touches only that
            // memory. Written buffers are exclusive borrows: nothing else reads or writes them
            // during the call. `lo..hi` lies within the THREAD range's trip count for these
            // values, and chunks run at once only when THREAD iterations were proven to write
            // disjoint memory (`spread` implies `parallel`).
            unsafe { entry(ptrs.as_ptr(), lo as i64, hi as i64, vars.as_ptr()) }
        };
        match extent {
            Some(n) if self.spread && n > 1 => run_chunks(n, &call),
            Some(n) => call(0, n),
            None => call(0, 0),
        }
        crate::linger::after_run();
        Ok(())
    }

    /// One value per variable slot, each inside its declared bounds.
    fn check_vars(&self, vars: &[i64]) -> Result<(), JitError> {
        let specs = self.vars();
        if vars.len() != specs.len() {
            let hint = if vars.is_empty() { " (pass them with run_with_vars)" } else { "" };
            return Err(JitError::Argument(format!(
                "{}: expects {} variable value(s), got {}{hint}",
                self.name,
                specs.len(),
                vars.len()
            )));
        }
        for (s, &v) in specs.iter().zip(vars) {
            if !s.admits(v) {
                return Err(JitError::Argument(format!(
                    "{}: variable {} must be in {}..={}, got {v}",
                    self.name, s.slot, s.lo, s.hi
                )));
            }
        }
        Ok(())
    }

    /// The pointer of every argument, after checking each against its slot's spec.
    fn checked_pointers(&self, args: &[Arg<'_>]) -> Result<Vec<*mut u8>, JitError> {
        let specs = self.buffers();
        if args.len() != specs.len() {
            return Err(JitError::Argument(format!(
                "{}: expects {} buffers, got {}",
                self.name,
                specs.len(),
                args.len()
            )));
        }
        let mut ptrs: Vec<*mut u8> = Vec::with_capacity(args.len());
        for (s, a) in specs.iter().zip(args) {
            let m = a.describe();
            let who = format!("{}: buffer {}", self.name, s.slot);
            if m.dtype != s.dtype {
                return Err(JitError::Argument(format!("{who} must be {}, got {}", s.dtype, m.dtype)));
            }
            if m.len != s.len {
                return Err(JitError::Argument(format!("{who} must have {} elements, got {}", s.len, m.len)));
            }
            if s.written && !m.writable {
                return Err(JitError::Argument(format!(
                    "{who} is written by the program but was passed read-only"
                )));
            }
            if m.uninit && !self.writes_whole(s.slot) {
                return Err(JitError::Argument(format!(
                    "{who} was passed uninitialized, but the program does not write all of it without reading it"
                )));
            }
            ptrs.push(m.ptr);
        }
        Ok(ptrs)
    }
}

/// Runs `call(lo, hi)` over chunks of `0..n` on the rayon pool.
///
/// Many more chunks than threads, handed out one at a time from the last: when iterations
/// grow in cost along the range (causal attention's query blocks see more keys the further
/// down they are), the longest start first and the short ones fill in at the end
/// (longest-processing-time-first scheduling); for equal costs the order does not matter.
fn run_chunks(n: usize, call: &(impl Fn(usize, usize) + Sync)) {
    let threads = rayon::current_num_threads().max(1);
    let chunks = (threads * 16).min(n);
    let next = AtomicUsize::new(0);
    (0..threads.min(chunks)).into_par_iter().for_each(|_| {
        loop {
            let taken = next.fetch_add(1, Ordering::Relaxed);
            if taken >= chunks {
                break;
            }
            let c = chunks - 1 - taken;
            call(n * c / chunks, n * (c + 1) / chunks);
        }
    });
}
