//! `Display` for tensors: shape and dtype, then the elements when the tensor is backed by data,
//! nested by axis and summarized as numpy does once a tensor is large.

use super::Tensor;
use crate::util::numel;
use std::fmt;
use uopc_ir::HostBuffer;

/// Tensors with more elements than this print only the first and last [`EDGE_ITEMS`] entries
/// of each long axis (numpy's `threshold`).
const SUMMARY_THRESHOLD: usize = 1000;
/// Entries kept at each end of a summarized axis (numpy's `edgeitems`).
const EDGE_ITEMS: usize = 3;

/// Writes one element, honouring the formatter's precision for floats.
fn element(f: &mut fmt::Formatter<'_>, host: &HostBuffer, i: usize) -> fmt::Result {
    let float = |f: &mut fmt::Formatter<'_>, x: f64| match f.precision() {
        Some(p) => write!(f, "{x:.p$}"),
        None => write!(f, "{x:?}"),
    };
    match host {
        HostBuffer::Bool(v) => write!(f, "{}", v[i]),
        HostBuffer::I32(v) => write!(f, "{}", v[i]),
        HostBuffer::I64(v) => write!(f, "{}", v[i]),
        HostBuffer::F32(v) => match f.precision() {
            Some(_) => float(f, v[i] as f64),
            None => write!(f, "{:?}", v[i]),
        },
        HostBuffer::F64(v) => float(f, v[i]),
        HostBuffer::BF16(v) => match f.precision() {
            Some(_) => float(f, v[i].to_f64()),
            None => write!(f, "{:?}", v[i].to_f32()),
        },
        HostBuffer::F16(v) => match f.precision() {
            Some(_) => float(f, v[i].to_f64()),
            None => write!(f, "{:?}", v[i].to_f32()),
        },
    }
}

/// The elements of axis `axis` and below, starting at flat `offset` of a row-major `shape`.
fn axis(
    f: &mut fmt::Formatter<'_>,
    host: &HostBuffer,
    shape: &[usize],
    axis_k: usize,
    offset: usize,
    summarize: bool,
) -> fmt::Result {
    if axis_k == shape.len() {
        return element(f, host, offset);
    }
    let n = shape[axis_k];
    let stride = numel(&shape[axis_k + 1..]);
    // Between rows of an outer axis: a newline per axis below it, aligned under the bracket.
    let sep = if axis_k + 1 == shape.len() {
        ", ".to_string()
    } else {
        format!(",{}{}", "\n".repeat(shape.len() - axis_k - 1), " ".repeat(axis_k + 1))
    };
    let shown: Vec<Option<usize>> = if summarize && n > 2 * EDGE_ITEMS {
        (0..EDGE_ITEMS).map(Some).chain([None]).chain((n - EDGE_ITEMS..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    };
    f.write_str("[")?;
    for (k, i) in shown.iter().enumerate() {
        if k > 0 {
            f.write_str(&sep)?;
        }
        match i {
            Some(i) => axis(f, host, shape, axis_k + 1, offset + i * stride, summarize)?,
            None => f.write_str("...")?,
        }
    }
    f.write_str("]")
}

/// `Tensor [2, 3] f32` and, when the tensor is backed by data, its elements on the following
/// lines (`[[1.0, 2.0, 3.0],\n [4.0, 5.0, 6.0]]`); a lazy tensor says so instead of computing.
/// Long axes of tensors over 1000 elements show their first and last 3 entries around `...`.
/// A precision (`{:.2}`) applies to float elements.
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor {:?} {}", self.shape(), self.dtype())?;
        let Some(host) = self.host_data() else {
            return write!(f, " (lazy {}: realize it to see the values)", self.uop.op().name());
        };
        f.write_str("\n")?;
        axis(f, host, self.shape(), 0, 0, self.numel() > SUMMARY_THRESHOLD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_tensors_print_every_element_nested_by_axis() {
        let t = Tensor::from_vec((0..6).map(|x| x as f32).collect::<Vec<_>>(), &[2, 3]);
        assert_eq!(t.to_string(), "Tensor [2, 3] f32\n[[0.0, 1.0, 2.0],\n [3.0, 4.0, 5.0]]");
        assert_eq!(format!("{:.2}", Tensor::scalar(0.5)), "Tensor [] f32\n0.50");
        let cube = Tensor::from_vec(vec![1.0f64; 8], &[2, 2, 2]);
        assert_eq!(
            cube.to_string(),
            "Tensor [2, 2, 2] f64\n[[[1.0, 1.0],\n  [1.0, 1.0]],\n\n [[1.0, 1.0],\n  [1.0, 1.0]]]"
        );
    }

    #[test]
    fn large_tensors_are_summarized_and_lazy_ones_are_not_computed() {
        let t = Tensor::from_vec((0..2000).map(|x| x as f32).collect::<Vec<_>>(), &[2, 1000]);
        let s = t.to_string();
        assert_eq!(
            s,
            "Tensor [2, 1000] f32\n[[0.0, 1.0, 2.0, ..., 997.0, 998.0, 999.0],\n \
             [1000.0, 1001.0, 1002.0, ..., 1997.0, 1998.0, 1999.0]]"
        );
        let lazy = &t + 1.0;
        assert!(!lazy.is_realized());
        assert_eq!(lazy.to_string(), "Tensor [2, 1000] f32 (lazy ADD: realize it to see the values)");
    }
}
