//! [`ModelError`]: why a model could not be loaded or run.

use std::path::Path;
use uopc_kernels::sdpa::SdpaError;
use uopc_tensor::TensorError;

/// Why a model could not be loaded or run; each message names the file, field or tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// `config.json` is malformed or asks for something not supported.
    #[error("model config: {0}")]
    Config(String),
    /// A weight is missing, extra, of the wrong shape or dtype, or a file is malformed.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The KV cache or the positions cannot hold the tokens.
    #[error("kv cache: {0}")]
    Cache(String),
    /// The tokens or options given are not valid.
    #[error("model input: {0}")]
    Input(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The attention kernel refused its arguments.
    #[error(transparent)]
    Attention(#[from] SdpaError),
}

impl ModelError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> ModelError {
        ModelError::Io { path: path.display().to_string(), source }
    }
}
