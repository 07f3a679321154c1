//! A tensor as a strided view of the tensor its movement ops start from: what a hand-written
//! kernel needs to read the elements where they lie instead of a materialized copy.

use super::Tensor;

/// Where the elements of a view lie in the tensor it views ([`Tensor::strided_view`]): the
/// element at multi-index `i` is element `offset + sum_k i[k] * strides[k]` of `base`, counted
/// row-major.
#[derive(Clone, Debug)]
pub struct StridedView {
    /// The tensor the movement ops start from (not itself a movement op).
    pub base: Tensor,
    /// Where element `(0, .., 0)` lies in `base`.
    pub offset: usize,
    /// The step in `base`'s elements per step along each axis of the view (0 along a
    /// broadcast axis).
    pub strides: Vec<usize>,
}

impl Tensor {
    /// This tensor as a strided view of the tensor its reshapes, permutes, slices and
    /// broadcasts start from; `None` when a reshape mixes axes that are not evenly strided
    /// (the view then needs a copy) or the tensor is empty. A tensor that is no movement op
    /// is its own view (offset 0, row-major strides).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// // Heads of a fused QKV projection's output: (rows, 3 * heads * d) -> k as (heads, rows, d).
    /// let qkv = Tensor::from_vec(vec![0.0f32; 5 * 24], &[5, 3 * 2 * 4]);
    /// let k = qkv.try_slice(1, 8, 16)?.try_reshape(&[5, 2, 4])?.try_permute(&[1, 0, 2])?;
    /// let view = k.strided_view().expect("evenly strided");
    /// assert_eq!((view.offset, view.strides), (8, vec![4, 24, 1]));
    /// assert_eq!(view.base.shape(), [5, 24]);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn strided_view(&self) -> Option<StridedView> {
        if self.numel() == 0 {
            return None;
        }
        let (chain, base) = crate::view::movement_chain(&self.uop);
        let mut shape = base.shape().to_vec();
        let mut strides = row_major(&shape);
        let mut offset = 0;
        for m in chain.iter().rev() {
            match m.op() {
                uopc_ir::Op::Reshape(to) => {
                    strides = reshaped(&shape, &strides, to)?;
                    shape.clone_from(to);
                }
                uopc_ir::Op::Permute(p) => {
                    (shape, strides) =
                        (p.iter().map(|&a| shape[a]).collect(), p.iter().map(|&a| strides[a]).collect());
                }
                uopc_ir::Op::Shrink(bounds) => {
                    offset += bounds.iter().zip(&strides).map(|(&(lo, _), s)| lo * s).sum::<usize>();
                    shape = bounds.iter().map(|&(lo, hi)| hi - lo).collect();
                }
                uopc_ir::Op::Expand(to) => {
                    for (k, &n) in to.iter().enumerate() {
                        if shape[k] != n {
                            strides[k] = 0;
                        }
                    }
                    shape.clone_from(to);
                }
                _ => return None,
            }
        }
        Some(StridedView { base: Tensor { uop: base }, offset, strides })
    }
}

/// Row-major strides of `shape`.
fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    strides
}

/// The strides of `shape` (at `strides`) reshaped to `to` without moving elements: each run of
/// axes that `to` merges or splits must be evenly strided (a run of the source whose every axis
/// steps over the next one whole); `None` otherwise. Axes of size 1 take stride 0.
fn reshaped(shape: &[usize], strides: &[usize], to: &[usize]) -> Option<Vec<usize>> {
    let from: Vec<(usize, usize)> =
        shape.iter().zip(strides).filter(|&(&n, _)| n != 1).map(|(&n, &s)| (n, s)).collect();
    let mut out = vec![0; to.len()];
    let (mut i, mut j) = (0, 0);
    while j < to.len() {
        if to[j] == 1 {
            j += 1;
            continue;
        }
        let (j0, i0) = (j, i);
        let (mut want, mut have) = (to[j], from.get(i)?.0);
        while want != have {
            if want < have {
                j += 1;
                want *= to.get(j)?;
            } else {
                i += 1;
                have *= from.get(i)?.0;
            }
        }
        // The source axes i0..=i must form one evenly strided run.
        if (i0..i).any(|a| from[a].1 != from[a + 1].1 * from[a + 1].0) {
            return None;
        }
        out[j] = from[i].1;
        for a in (j0..j).rev() {
            out[a] = if to[a] == 1 { 0 } else { out[a + 1] * to[a + 1] };
        }
        i += 1;
        j += 1;
    }
    (i == from.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshapes_split_and_merge_evenly_strided_runs_only() {
        // A contiguous (2, 3, 4) viewed as (6, 4) and as (2, 12), then back.
        assert_eq!(reshaped(&[2, 3, 4], &[12, 4, 1], &[6, 4]), Some(vec![4, 1]));
        assert_eq!(reshaped(&[2, 3, 4], &[12, 4, 1], &[2, 12]), Some(vec![12, 1]));
        assert_eq!(reshaped(&[6, 4], &[4, 1], &[2, 3, 4]), Some(vec![12, 4, 1]));
        // Size-1 axes anywhere.
        assert_eq!(reshaped(&[2, 1, 4], &[4, 99, 1], &[1, 2, 4, 1]), Some(vec![0, 4, 1, 0]));
        // A permuted (3, 2) (strides 1, 3) cannot merge into 6 in place; it can split rows.
        assert_eq!(reshaped(&[3, 2], &[1, 3], &[6]), None);
        assert_eq!(reshaped(&[4, 2], &[1, 4], &[2, 2, 2]), Some(vec![2, 1, 4]));
        // A slice's rows keep their pitch when split into heads.
        assert_eq!(reshaped(&[5, 8], &[24, 1], &[5, 2, 4]), Some(vec![24, 4, 1]));
    }

    #[test]
    fn views_through_every_movement_op() {
        let base = Tensor::from_vec((0..24).map(|i| i as f32).collect(), &[4, 6]);
        let v = base.try_permute(&[1, 0]).unwrap().try_slice(0, 2, 5).unwrap();
        let view = v.strided_view().unwrap();
        assert_eq!((view.offset, view.strides), (2, vec![1, 6]));
        let b = base.try_slice(1, 0, 1).unwrap().try_expand(&[4, 3]).unwrap();
        assert_eq!(b.strided_view().unwrap().strides, vec![6, 0]);
        // Elementwise results are bases of their own.
        let sum = &base + &base;
        assert_eq!(sum.strided_view().unwrap().strides, vec![6, 1]);
        // A transposed matrix flattened needs a copy.
        assert!(base.try_permute(&[1, 0]).unwrap().try_reshape(&[24]).unwrap().strided_view().is_none());
    }
}
