//! Where the forward program of a tensor graph's attention node reads q, k and v and writes its
//! output: each as element strides over a buffer that may be larger than the tensor, so heads
//! sliced from a fused QKV projection's output are read where they lie, and the output can be
//! written in the `(batch, row, head, d)` order an output projection reads.

use super::{SdpaConfig, SdpaError};

/// One operand of attention in its buffer: element `(b, h, i, e)` (batch item, head, row,
/// head dimension) lies at `offset + b * strides[0] + h * strides[1] + i * strides[2] + e`;
/// the buffer holds `len` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct OperandView {
    pub(crate) offset: usize,
    pub(crate) strides: [usize; 3],
    pub(crate) len: usize,
}

impl OperandView {
    /// The densely packed operand of `heads` heads of `rows` rows in `config`'s layout.
    fn dense(config: &SdpaConfig, heads: usize, rows: usize) -> OperandView {
        let len = [config.batch, heads, rows, config.d].iter().product();
        OperandView { offset: 0, strides: config.layout.strides(heads, rows, config.d), len }
    }

    /// The index one past the last element the operand of `[batch, heads, rows]` reaches, or
    /// `None` when it overflows.
    fn end(&self, sizes: [usize; 3], d: usize) -> Option<usize> {
        let mut last = self.offset;
        for (n, s) in sizes.iter().zip(self.strides) {
            last = last.checked_add(n.checked_sub(1)?.checked_mul(s)?)?;
        }
        last.checked_add(d)
    }
}

/// The four operands of one forward program ([`OperandView`] each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Views {
    pub(crate) q: OperandView,
    pub(crate) k: OperandView,
    pub(crate) v: OperandView,
    pub(crate) out: OperandView,
}

impl Views {
    /// q, k, v and the output densely packed in `config`'s layout, each in its own buffer.
    pub(crate) fn dense(config: &SdpaConfig) -> Views {
        let (q, kv) = (
            OperandView::dense(config, config.heads, config.n_q),
            OperandView::dense(config, config.kv_heads, config.n_k),
        );
        Views { q, k: kv, v: kv, out: q }
    }

    /// Whether the views fit `config`: every element of q, k and v inside its buffer, k and v
    /// at the same strides (their blocks share one index), and the output densely packed
    /// (`(batch, head, row)` or `(batch, row, head)` order), so rows of different tasks never
    /// share memory.
    pub(crate) fn check(&self, config: &SdpaConfig) -> Result<(), SdpaError> {
        let c = config;
        let fits = |arg: &'static str, view: &OperandView, heads: usize, rows: usize| match view
            .end([c.batch, heads, rows], c.d)
        {
            Some(end) if end <= view.len => Ok(()),
            _ => Err(SdpaError::Shape {
                arg,
                msg: format!("view {view:?} reaches past its buffer of {} elements", view.len),
            }),
        };
        fits("q", &self.q, c.heads, c.n_q)?;
        fits("k", &self.k, c.kv_heads, c.n_k)?;
        fits("v", &self.v, c.kv_heads, c.n_k)?;
        if self.k.strides != self.v.strides {
            return Err(SdpaError::Shape {
                arg: "v",
                msg: format!("strides {:?} differ from k's {:?}", self.v.strides, self.k.strides),
            });
        }
        let (h, n, d) = (c.heads, c.n_q, c.d);
        let dense = [[h * n * d, n * d, d], [n * h * d, d, h * d]];
        if self.out.offset != 0 || self.out.len != c.q_len() || !dense.contains(&self.out.strides) {
            return Err(SdpaError::Shape { arg: "output", msg: format!("view {:?} is not dense", self.out) });
        }
        Ok(())
    }
}
