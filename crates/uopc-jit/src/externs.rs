//! Host functions generated code may call, each with its symbol, address and signature.

use crate::JitError;
use cranelift_codegen::ir::{AbiParam, FuncRef, Function, Signature, types};
use cranelift_jit::JITBuilder;
use cranelift_module::{FuncId, Linkage, Module};
use uopc_tile::ops::TileEntry;

/// A host function the generated code may call (never per element on the f32 fast paths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Extern {
    /// `f64::exp2`.
    Exp2F64,
    /// `f32::log2`.
    Log2F32,
    /// `f64::log2`.
    Log2F64,
    /// A tile op's micro-kernel entry, whose symbol, address and parameters `uopc_tile` owns.
    Tile(TileEntry),
}

extern "C" fn uopc_exp2_f64(x: f64) -> f64 {
    x.exp2()
}
extern "C" fn uopc_log2_f32(x: f32) -> f32 {
    x.log2()
}
extern "C" fn uopc_log2_f64(x: f64) -> f64 {
    x.log2()
}

/// The math functions, before the tile entries in [`Extern::ALL`].
const MATH: [Extern; 3] = [Extern::Exp2F64, Extern::Log2F32, Extern::Log2F64];

/// How many externs there are.
const COUNT: usize = MATH.len() + TileEntry::ALL.len();

impl Extern {
    /// Every extern, in the order each function declares them: the math functions, then every
    /// tile entry in [`TileEntry::ALL`]'s order.
    pub const ALL: [Extern; COUNT] = {
        let mut all = [Extern::Exp2F64; COUNT];
        let mut i = 0;
        while i < COUNT {
            all[i] = if i < MATH.len() { MATH[i] } else { Extern::Tile(TileEntry::ALL[i - MATH.len()]) };
            i += 1;
        }
        all
    };

    /// Its position in [`Extern::ALL`].
    fn index(self) -> usize {
        match self {
            Extern::Exp2F64 => 0,
            Extern::Log2F32 => 1,
            Extern::Log2F64 => 2,
            Extern::Tile(t) => MATH.len() + TileEntry::ALL.iter().position(|&e| e == t).unwrap_or(0),
        }
    }

    /// The symbol it is registered and declared under.
    pub fn symbol(self) -> &'static str {
        match self {
            Extern::Exp2F64 => "uopc_exp2_f64",
            Extern::Log2F32 => "uopc_log2_f32",
            Extern::Log2F64 => "uopc_log2_f64",
            Extern::Tile(t) => t.symbol(),
        }
    }

    /// Where the function is in this process.
    pub fn address(self) -> *const u8 {
        match self {
            Extern::Exp2F64 => uopc_exp2_f64 as *const u8,
            Extern::Log2F32 => uopc_log2_f32 as *const u8,
            Extern::Log2F64 => uopc_log2_f64 as *const u8,
            Extern::Tile(t) => t.address(),
        }
    }

    /// Adds its parameters and returns to `sig` (a signature with the module's calling
    /// convention).
    pub fn signature(self, sig: &mut Signature) {
        let unary = |sig: &mut Signature, t| {
            sig.params.push(AbiParam::new(t));
            sig.returns.push(AbiParam::new(t));
        };
        match self {
            Extern::Exp2F64 | Extern::Log2F64 => unary(sig, types::F64),
            Extern::Log2F32 => unary(sig, types::F32),
            // Operand addresses and integer fields, each a 64-bit register; a status back.
            Extern::Tile(t) => {
                sig.params.extend((0..t.params()).map(|_| AbiParam::new(types::I64)));
                sig.returns.push(AbiParam::new(types::I32));
            }
        }
    }

    /// Registers every extern's address with a JIT about to be built.
    pub fn register_all(jb: &mut JITBuilder) {
        for e in Extern::ALL {
            jb.symbol(e.symbol(), e.address());
        }
    }
}

/// Every extern declared in one module, by variant.
pub(crate) struct DeclaredExterns([FuncId; Extern::ALL.len()]);

impl DeclaredExterns {
    /// Declares every extern as an import of `module`.
    pub fn declare(module: &mut impl Module) -> Result<Self, JitError> {
        let mut ids = Vec::with_capacity(Extern::ALL.len());
        for e in Extern::ALL {
            let mut sig = module.make_signature();
            e.signature(&mut sig);
            ids.push(module.declare_function(e.symbol(), Linkage::Import, &sig)?);
        }
        Ok(DeclaredExterns(ids.try_into().expect("one id per extern")))
    }

    /// References to every extern from inside `func`, declared in [`Extern::ALL`] order.
    pub fn in_function(&self, module: &mut impl Module, func: &mut Function) -> Externs {
        Externs(self.0.map(|id| module.declare_func_in_func(id, func)))
    }
}

/// Every extern as a callee of the function being built.
#[derive(Clone, Copy)]
pub(crate) struct Externs([FuncRef; Extern::ALL.len()]);

impl Externs {
    /// The callee for `e`.
    pub fn get(&self, e: Extern) -> FuncRef {
        self.0[e.index()]
    }
}
