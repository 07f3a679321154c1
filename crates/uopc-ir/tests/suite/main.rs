//! The integration tests of the IR, in one binary (one link instead of one per file): each
//! module is one area (builders and the verifier, expansion, the interpreter, runtime scalars,
//! 16-bit types).

mod derivative;
mod expand;
mod half;
mod interp;
mod ir;
mod vars;
