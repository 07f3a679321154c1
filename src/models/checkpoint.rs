//! [`Checkpoint`]: the tensors of a directory's `.safetensors` files, memory-mapped, handed out
//! by name with their shapes checked, and the names nobody asked for reported.

use super::ModelError;
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use uopc_ir::DType;
use uopc_tensor::Tensor;

/// Where one tensor lies: its file, dtype, shape and bytes.
#[derive(Clone, Debug)]
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

/// The tensors of a checkpoint directory (every `*.safetensors` file in it, shards included),
/// memory-mapped: a tensor's bytes are read when it is taken.
#[derive(Debug)]
pub struct Checkpoint {
    maps: Vec<(PathBuf, Mmap)>,
    entries: BTreeMap<String, Entry>,
    taken: BTreeSet<String>,
}

impl Checkpoint {
    /// Maps every `.safetensors` file of `dir` and reads their headers.
    ///
    /// # Errors
    ///
    /// [`ModelError::Io`] when the directory or a file cannot be read,
    /// [`ModelError::Checkpoint`] when there is no `.safetensors` file, a file's header is
    /// malformed or truncated (naming the file), or two files hold one name.
    pub fn open(dir: &Path) -> Result<Checkpoint, ModelError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| ModelError::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::Checkpoint(format!("{}: no .safetensors file", dir.display())));
        }
        let mut maps = Vec::new();
        let mut entries = BTreeMap::new();
        for (index, path) in files.into_iter().enumerate() {
            let file = File::open(&path).map_err(|e| ModelError::io(&path, e))?;
            // SAFETY: the map is only read, and a checkpoint is not expected to change while a
            // model loads from it; should it be truncated meanwhile, the header was checked
            // against the length at mapping time and reads stay within that length.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
            let tensors = SafeTensors::deserialize(&map)
                .map_err(|e| ModelError::Checkpoint(format!("{}: {e}", path.display())))?;
            let base = map.as_ptr() as usize;
            for (name, view) in tensors.tensors() {
                let start = view.data().as_ptr() as usize - base;
                let entry = Entry {
                    file: index,
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    bytes: start..start + view.data().len(),
                };
                if entries.insert(name.clone(), entry).is_some() {
                    return Err(ModelError::Checkpoint(format!("tensor `{name}` is in two files")));
                }
            }
            maps.push((path, map));
        }
        Ok(Checkpoint { maps, entries, taken: BTreeSet::new() })
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The names it holds, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Tensor `name` as an f32 tensor of `shape` (f32 copied, bf16 and f16 widened exactly),
    /// marked as used.
    ///
    /// # Errors
    ///
    /// [`ModelError::Checkpoint`] naming the tensor when it is missing, has another shape
    /// (both shapes named), or a dtype other than F32, BF16 and F16.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let values = self.take_values(name, shape)?;
        Ok(Tensor::try_from_vec(values, shape)?)
    }

    /// Tensor `name` of `shape` as a tensor of `dtype` (F32, BF16 or F16): the stored values
    /// when the file holds that dtype, otherwise converted (widened exactly, or rounded to
    /// nearest even), marked as used.
    ///
    /// # Errors
    ///
    /// As [`Checkpoint::take`], and [`ModelError::Config`] for any other `dtype`.
    pub fn take_as(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor, ModelError> {
        let stored = self.entry(name, shape)?.dtype;
        let t = match (dtype, stored) {
            (DType::F32, _) => return self.take(name, shape),
            (DType::BF16, Dtype::BF16) => Tensor::try_from_vec(
                self.raw(name).chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]])).collect::<Vec<_>>(),
                shape,
            )?,
            (DType::F16, Dtype::F16) => Tensor::try_from_vec(
                self.raw(name).chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect::<Vec<_>>(),
                shape,
            )?,
            (DType::BF16 | DType::F16, _) => narrowed(&self.take_values(name, shape)?, shape, dtype)?,
            (other, _) => {
                return Err(ModelError::Config(format!(
                    "weights cannot be held in {other}; use F32, BF16 or F16"
                )));
            }
        };
        self.taken.insert(name.to_string());
        Ok(t)
    }

    /// The stored bytes of tensor `name`, which is in the checkpoint.
    fn raw(&self, name: &str) -> &[u8] {
        let e = &self.entries[name];
        &self.maps[e.file].1[e.bytes.clone()]
    }

    /// The entry of tensor `name`, checked to have `shape`.
    fn entry(&self, name: &str, shape: &[usize]) -> Result<&Entry, ModelError> {
        let entry = self.entries.get(name).ok_or_else(|| {
            ModelError::Checkpoint(format!("tensor `{name}` of shape {shape:?} is missing"))
        })?;
        if entry.shape != shape {
            return Err(ModelError::Checkpoint(format!(
                "tensor `{name}` has shape {:?}, expected {shape:?}",
                entry.shape
            )));
        }
        Ok(entry)
    }

    /// [`Checkpoint::take`]'s values, row-major, without making a tensor of them (for weights
    /// stacked with others into one).
    ///
    /// # Errors
    ///
    /// As [`Checkpoint::take`].
    pub fn take_values(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let entry = self.entry(name, shape)?;
        let bytes = &self.maps[entry.file].1[entry.bytes.clone()];
        let values: Vec<f32> = match entry.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<_>>(),
            Dtype::BF16 => {
                bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect::<Vec<_>>()
            }
            Dtype::F16 => {
                bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect::<Vec<_>>()
            }
            other => {
                return Err(ModelError::Checkpoint(format!(
                    "tensor `{name}` is {other:?}; weights must be F32, BF16 or F16"
                )));
            }
        };
        self.taken.insert(name.to_string());
        Ok(values)
    }

    /// The names no [`Checkpoint::take`] asked for, except those `ignored` says a model may
    /// leave (buffers a framework saves beside the weights).
    pub fn unused(&self, ignored: impl Fn(&str) -> bool) -> Vec<&str> {
        self.names().filter(|n| !self.taken.contains(*n) && !ignored(n)).collect()
    }

    /// The files mapped.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.maps.iter().map(|(p, _)| p.as_path())
    }
}

/// `values` rounded to `dtype` (BF16 or F16, to nearest even) as a tensor of `shape`.
///
/// # Errors
///
/// A shape error when `values` does not fill `shape`.
pub(crate) fn narrowed(values: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor, ModelError> {
    Ok(if dtype == DType::BF16 {
        Tensor::try_from_vec(values.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), shape)?
    } else {
        Tensor::try_from_vec(values.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(), shape)?
    })
}

/// Writes f32 tensors (name, shape, row-major values) as a safetensors file at `path`: what a
/// saved model or a generated checkpoint is.
///
/// # Errors
///
/// [`ModelError::Checkpoint`] naming the tensor whose values do not fill its shape, or the
/// file when it cannot be written.
pub fn write_f32_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<(), ModelError> {
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), b)
                .map_err(|e| ModelError::Checkpoint(format!("{name}: {e}")))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<_, ModelError>>()?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| ModelError::Checkpoint(format!("{}: {e}", path.display())))
}
