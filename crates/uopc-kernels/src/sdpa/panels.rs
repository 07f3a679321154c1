//! K and V packed once per run into the panels the tile GEMMs read in place
//! ([`uopc_tile::pack_panels`]), instead of once per task and key block.
//!
//! Every query block of a key/value head reads all of that head's keys and values; each task
//! packing them again for its own GEMMs repeats the same copy as many times as the head has
//! query blocks. With [`Blocking::kv_panel_width`](super::Blocking::kv_panel_width) set, the run
//! packs them once, in parallel over the heads, and the kernel's GEMMs read the panels.

use super::SdpaConfig;
use rayon::prelude::*;
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use uopc_tile::{Isa, PanelPacking, pack_panels};

/// The panel buffers of the last run, kept for the next one (a fresh allocation would fault
/// in every page again); a run while another holds them packs into buffers of its own.
#[derive(Default)]
pub(crate) struct PanelScratch(Mutex<Vec<f32>>);

impl fmt::Debug for PanelScratch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PanelScratch")
    }
}

/// One run's packed K and V: in the kept buffers, or in its own when another run holds them.
pub(crate) struct Packed<'a> {
    buf: Result<MutexGuard<'a, Vec<f32>>, Vec<f32>>,
    k_len: usize,
}

impl Packed<'_> {
    /// The key panels and the value panels.
    pub fn panels(&self) -> (&[f32], &[f32]) {
        let buf = match &self.buf {
            Ok(kept) => &kept[..],
            Err(own) => &own[..],
        };
        buf.split_at(self.k_len)
    }
}

/// Where each key/value head's panels lie, block by block of keys, so that every key block's
/// panels are contiguous: per block of `keys` keys (the last one narrower), the keys' panels
/// `K^T` (D rows, one panel per `w` keys, each `D x w`) in one buffer and the values' (the
/// block's rows of V, one panel per `w` columns of D, each `rows x w`) in the other, both laid
/// out `(batch, kv head, key block, panels)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvPanels {
    /// Columns per panel.
    pub width: usize,
    /// Keys per block.
    pub keys: usize,
    /// Elements of one head's key panels.
    pub k_head: usize,
    /// Elements of one head's value panels.
    pub v_head: usize,
    /// `[batch, head, row]` strides of k and v.
    strides: [usize; 3],
    kv_heads: usize,
    heads: usize,
    d: usize,
    n_k: usize,
}

impl KvPanels {
    /// The panels of `config`'s keys and values at `width` columns each, for key blocks of
    /// `keys` keys (a multiple of `width`, or at least `n_k`).
    pub fn new(config: &SdpaConfig, width: usize, keys: usize) -> KvPanels {
        let &SdpaConfig { batch, kv_heads, n_k, d, .. } = config;
        let keys = keys.min(n_k);
        let (full, rest) = (n_k / keys, n_k % keys);
        KvPanels {
            width,
            keys,
            k_head: (full * keys.next_multiple_of(width) + rest.next_multiple_of(width)) * d,
            v_head: d.next_multiple_of(width) * n_k,
            strides: config.layout.strides(kv_heads, n_k, d),
            kv_heads,
            heads: batch * kv_heads,
            d,
            n_k,
        }
    }

    /// Elements of all key panels.
    pub fn k_len(&self) -> usize {
        self.heads * self.k_head
    }

    /// Elements of all value panels.
    pub fn v_len(&self) -> usize {
        self.heads * self.v_head
    }

    /// How the `cols` keys of one block become the B of the score GEMM (`K^T`, D x cols): k's
    /// rows are its columns, so it is read transposed.
    pub fn keys(&self, cols: usize) -> PanelPacking {
        let w = self.width;
        PanelPacking {
            k: self.d,
            n: cols,
            trans: true,
            ld: self.strides[2],
            width: w,
            panel_stride: self.d * w,
        }
    }

    /// How the `cols` values of one block become the B of `P · V` (cols x D).
    pub fn values(&self, cols: usize) -> PanelPacking {
        let w = self.width;
        PanelPacking {
            k: cols,
            n: self.d,
            trans: false,
            ld: self.strides[2],
            width: w,
            panel_stride: cols * w,
        }
    }

    /// Packs k and v (f32, of the configuration's layout and lengths, checked by the caller)
    /// into `scratch`'s kept buffers when no other run holds them, else into new ones.
    pub fn pack_into<'a>(&self, scratch: &'a PanelScratch, k: &[f32], v: &[f32]) -> Packed<'a> {
        let (kn, vn) = (self.k_len(), self.v_len());
        let mut buf = scratch.0.try_lock().map_err(|_| Vec::new());
        let vec = match &mut buf {
            Ok(kept) => &mut **kept,
            Err(own) => own,
        };
        if vec.len() != kn + vn {
            *vec = vec![0.0; kn + vn];
        }
        let (kp, vp) = vec.split_at_mut(kn);
        self.pack(k, v, kp, vp);
        Packed { buf, k_len: kn }
    }

    /// Packs k and v (f32, of `config`'s layout and lengths, checked by the caller) into
    /// `kp` and `vp` ([`KvPanels::k_len`] and [`KvPanels::v_len`] long), one rayon task per key
    /// block of each head, so that even one head's packing is spread over the cores.
    pub fn pack(&self, k: &[f32], v: &[f32], kp: &mut [f32], vp: &mut [f32]) {
        let isa = Isa::detect();
        let (bc, d_pad) = (self.keys, self.d.next_multiple_of(self.width));
        let k_block = bc.next_multiple_of(self.width) * self.d;
        let heads = kp.par_chunks_mut(self.k_head).zip(vp.par_chunks_mut(self.v_head)).enumerate();
        let blocks = heads.flat_map(|(head, (kp, vp))| {
            kp.par_chunks_mut(k_block)
                .zip(vp.par_chunks_mut(bc * d_pad))
                .enumerate()
                .map(move |(b, (kp, vp))| (head, b, kp, vp))
        });
        // The run checked k's and v's lengths against the configuration, whose heads each span
        // the packings' source extents; the chunks are one block of one head.
        blocks.for_each(|(head, block, kp, vp)| {
            let first = block * bc;
            let cols = bc.min(self.n_k - first);
            let at = head / self.kv_heads * self.strides[0]
                + head % self.kv_heads * self.strides[1]
                + first * self.strides[2];
            pack_panels(isa, &self.keys(cols), &k[at..], kp).expect("one key block's panels");
            pack_panels(isa, &self.values(cols), &v[at..], vp).expect("one value block's panels");
        });
    }
}
