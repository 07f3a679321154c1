//! [`Tokenizer`]: text in and out for a checkpoint that has a `tokenizer.json`, through the
//! Hugging Face `tokenizers` crate (the `tokenizers` feature), and [`CausalLm::generate_text`].

use super::{CausalLm, GenerateOptions, Generation, ModelError};
use std::path::Path;

/// A checkpoint's tokenizer: its `tokenizer.json`, read by the `tokenizers` crate.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab_size", &self.inner.get_vocab_size(true)).finish()
    }
}

impl Tokenizer {
    /// The tokenizer of checkpoint directory `dir` (its `tokenizer.json`).
    ///
    /// # Errors
    ///
    /// [`ModelError::Io`] when the file is missing or cannot be read, [`ModelError::Config`]
    /// when it is not a tokenizer the crate understands.
    pub fn load(dir: &Path) -> Result<Tokenizer, ModelError> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let inner = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer { inner })
    }

    /// The token ids of `text`, with the special tokens the tokenizer adds around an input
    /// (a beginning-of-sequence token, for Llama's), as `transformers`' tokenizer call gives
    /// them.
    ///
    /// # Errors
    ///
    /// [`ModelError::Input`] when the tokenizer cannot encode `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let encoding =
            self.inner.encode(text, true).map_err(|e| ModelError::Input(format!("cannot encode: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `tokens`, special tokens left out.
    ///
    /// # Errors
    ///
    /// [`ModelError::Input`] for a token outside the vocabulary.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, ModelError> {
        self.inner
            .decode(tokens, true)
            .map_err(|e| ModelError::Input(format!("cannot decode {tokens:?}: {e}")))
    }
}

impl CausalLm {
    /// [`CausalLm::generate`] from text to text: `prompt` encoded by `tokenizer`, and each new
    /// token's text handed to `on_text` as soon as it is whole (a token that ends inside a
    /// multi-byte character or a word piece waits for the ones that complete it). Returns the
    /// generation and its whole text.
    ///
    /// # Errors
    ///
    /// As [`CausalLm::generate`]; [`ModelError::Input`] when the prompt encodes to no tokens
    /// or a token cannot be decoded.
    pub fn generate_text(
        &self,
        tokenizer: &Tokenizer,
        prompt: &str,
        options: &GenerateOptions,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<(Generation, String), ModelError> {
        let ids = tokenizer.encode(prompt)?;
        let mut stream = tokenizer.inner.decode_stream(true);
        let mut text = String::new();
        let mut failure = None;
        let generation = self.generate(&ids, options, |token| match stream.step(token) {
            Ok(Some(piece)) => {
                text.push_str(&piece);
                on_text(&piece)
            }
            Ok(None) => true,
            Err(e) => {
                failure = Some(ModelError::Input(format!("cannot decode token {token}: {e}")));
                false
            }
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok((generation, text)),
        }
    }
}
