//! K and V packed once per run into the panels the tile GEMMs read in place
//! ([`uopc_tile::pack_panels`]), instead of once per task and key block.
//!
//! Every query block of a key/value head reads all of that head's keys and values; each task
//! packing them again for its own GEMMs repeats the same copy as many times as the head has
//! query blocks. With [`Blocking::kv_panel_width`](super::Blocking::kv_panel_width) set, the run
//! packs them once, in parallel over the heads, and the kernel's GEMMs read the panels.

use super::{SdpaConfig, Values};
use half::{bf16, f16};
use rayon::prelude::*;
use std::cell::Cell;
use uopc_ir::UOp;
use uopc_jit::Arg;
use uopc_tile::{
    Isa, PanelPacking, TileError, pack_pair_panels_bf16, pack_panels, pack_panels_bf16, pack_panels_f16,
};

/// The largest panel buffer a thread keeps between runs: 64 MiB of f32.
pub(crate) const KEPT_MAX_FLOATS: usize = 16 << 20;

thread_local! {
    /// The panel buffer of this thread's last run, kept for its next one (a fresh allocation
    /// would fault in every page again): one per calling thread, as large as the largest K and
    /// V it packed up to [`KEPT_MAX_FLOATS`], whatever the configuration.
    static KEPT: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// [`KEPT`] for bf16 pair panels.
    static KEPT_PAIRS: Cell<Vec<bf16>> = const { Cell::new(Vec::new()) };
}

/// An element of packed panels (f32, or bf16 for pair panels), with the thread's kept buffer
/// of them and its cap in elements.
pub(crate) trait PanelElement: Copy + 'static {
    /// The padding value.
    const ZERO: Self;
    /// The most elements a thread keeps: [`KEPT_MAX_FLOATS`]' bytes.
    const KEPT_MAX: usize;
    /// The thread's kept buffer of this element.
    fn kept() -> &'static std::thread::LocalKey<Cell<Vec<Self>>>;
}

impl PanelElement for f32 {
    const ZERO: f32 = 0.0;
    const KEPT_MAX: usize = KEPT_MAX_FLOATS;
    fn kept() -> &'static std::thread::LocalKey<Cell<Vec<f32>>> {
        &KEPT
    }
}

impl PanelElement for bf16 {
    const ZERO: bf16 = bf16::ZERO;
    const KEPT_MAX: usize = 2 * KEPT_MAX_FLOATS;
    fn kept() -> &'static std::thread::LocalKey<Cell<Vec<bf16>>> {
        &KEPT_PAIRS
    }
}

/// One run's packed K and V, in the calling thread's kept buffer (or a new one when a nested
/// run already holds it), from a cache line on; dropping it hands the buffer back.
pub(crate) struct Packed<E: PanelElement> {
    buf: Vec<E>,
    /// The first element of the key panels (the first on a cache line).
    at: usize,
    k_len: usize,
    v_len: usize,
}

impl<E: PanelElement> Packed<E> {
    /// The kept buffer (or a new one) grown to hold `k_len + v_len` elements from a cache line.
    fn new(k_len: usize, v_len: usize) -> Packed<E> {
        let mut buf = E::kept().try_with(Cell::take).unwrap_or_default();
        let at = line_aligned(&mut buf, k_len + v_len, E::ZERO);
        Packed { buf, at, k_len, v_len }
    }

    /// The key panels and the value panels.
    pub fn panels(&self) -> (&[E], &[E]) {
        let (kp, rest) = self.buf[self.at..].split_at(self.k_len);
        (kp, &rest[..self.v_len])
    }

    /// The key panels and the value panels, to write.
    fn panels_mut(&mut self) -> (&mut [E], &mut [E]) {
        let (kp, rest) = self.buf[self.at..].split_at_mut(self.k_len);
        (kp, &mut rest[..self.v_len])
    }
}

impl<E: PanelElement> Drop for Packed<E> {
    fn drop(&mut self) {
        // Keep the larger of this buffer and one a nested run may have put back meanwhile. A
        // buffer past the cap is freed rather than kept: one long context must not pin its
        // size in every calling thread for the rest of the process.
        let buf = std::mem::take(&mut self.buf);
        let _ = E::kept().try_with(|kept| {
            let other = kept.take();
            let larger = if other.capacity() > buf.capacity() { other } else { buf };
            if larger.capacity() <= E::KEPT_MAX {
                kept.set(larger);
            }
        });
    }
}

/// One run's K and V in f32 panels or in bf16 pair panels.
pub(crate) enum PackedKv {
    /// f32 panels.
    F32(Packed<f32>),
    /// bf16 pair panels.
    Pairs(Packed<bf16>),
}

impl PackedKv {
    /// The kernel's arguments for the key panels and the value panels.
    pub fn args(&self) -> (Arg<'_>, Arg<'_>) {
        match self {
            PackedKv::F32(p) => {
                let (kp, vp) = p.panels();
                (kp.into(), vp.into())
            }
            PackedKv::Pairs(p) => {
                let (kp, vp) = p.panels();
                (kp.into(), vp.into())
            }
        }
    }
}

/// Bytes of a cache line, where the panels start: a panel row (or a pair panel's tile row)
/// that straddled two lines would cost two loads of every row the kernels read, and the
/// allocator places a large buffer 16 bytes past a page.
const LINE_BYTES: usize = 64;

/// `buf` grown to hold `len` elements from its first one on a cache line, and that element.
fn line_aligned<E: Copy>(buf: &mut Vec<E>, len: usize, zero: E) -> usize {
    let slack = LINE_BYTES / std::mem::size_of::<E>();
    if buf.len() < len + slack {
        buf.resize(len + slack, zero);
    }
    buf.as_ptr().align_offset(LINE_BYTES).min(slack)
}

/// Where each key/value head's panels lie: the keys' panels `K^T` block by block of keys (per
/// block of `keys` keys, the last one narrower, D rows, one panel per `w` keys, each `D x w`),
/// so every key block's are contiguous, laid out `(batch, kv head, key block, panels)`; and the
/// values' one panel per `w` columns of D over all the head's keys (each `n_k x w`), laid out
/// `(batch, kv head, panel)`, so any stretch of keys is one GEMM's B whatever blocks it spans.
///
/// With `pairs`, the panels are bf16 pair panels of 32 columns
/// ([`uopc_tile::GemmShape::b_pair_panels`]), for the bf16 GEMMs that multiply bf16 operands
/// (AMX, `vdpbf16ps`): D rounded up to 32 for the keys' panels and the keys rounded up to 32
/// for the values'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvPanels {
    /// Columns per panel.
    pub width: usize,
    /// bf16 pair panels rather than f32 panels.
    pub pairs: bool,
    /// Keys per block.
    pub keys: usize,
    /// Elements of one head's key panels.
    pub k_head: usize,
    /// Elements of one head's value panels.
    pub v_head: usize,
    /// `[batch, head, row]` strides of k and v.
    strides: [usize; 3],
    /// Rows a key panel and a value panel hold: D and n_k, each rounded up to a whole step of
    /// 32 for pair panels.
    k_rows: usize,
    v_rows: usize,
    kv_heads: usize,
    heads: usize,
    d: usize,
    n_k: usize,
}

impl KvPanels {
    /// The panels of `config`'s keys and values at `width` columns each, for key blocks of
    /// `keys` keys (a multiple of `width`, or at least `n_k`); pair panels when `pairs` (then
    /// `width` is 32).
    pub fn new(config: &SdpaConfig, width: usize, keys: usize, pairs: bool) -> KvPanels {
        let &SdpaConfig { batch, kv_heads, n_k, d, .. } = config;
        let keys = keys.min(n_k);
        let (full, rest) = (n_k / keys, n_k % keys);
        // A pair panel's rows (D for the keys, n_k for the values) in whole steps of 32.
        let (k_rows, v_rows) =
            if pairs { (d.next_multiple_of(32), n_k.next_multiple_of(32)) } else { (d, n_k) };
        KvPanels {
            width,
            pairs,
            keys,
            k_head: (full * keys.next_multiple_of(width) + rest.next_multiple_of(width)) * k_rows,
            v_head: d.next_multiple_of(width) * v_rows,
            strides: config.layout.strides(kv_heads, n_k, d),
            k_rows,
            v_rows,
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

    /// Where the keys from key `first` (a multiple of the block size) begin in their head's
    /// key panels, and in its value panels (a pair panel's step of 32 keys is 32 x 32
    /// elements).
    pub fn block_offsets(&self, first: &UOp) -> (UOp, UOp) {
        (first * self.k_rows, first * self.width)
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
            panel_stride: self.k_rows * w,
        }
    }

    /// How one head's values become the B of `P · V` (n_k x D); a stretch of keys is its rows
    /// from the stretch's first.
    pub fn values(&self) -> PanelPacking {
        let w = self.width;
        PanelPacking {
            k: self.n_k,
            n: self.d,
            trans: false,
            ld: self.strides[2],
            width: w,
            panel_stride: self.v_rows * w,
        }
    }

    /// Packs k and v of the configuration's element type (lengths checked by the caller) as
    /// these panels take them: into pair panels, or into f32 panels (16-bit values widened
    /// exactly); `None` for k and v of another type.
    pub fn pack_values(&self, k: Values<'_>, v: Values<'_>) -> Option<PackedKv> {
        Some(match (k, v) {
            (Values::BF16(k), Values::BF16(v)) if self.pairs => PackedKv::Pairs(self.pack_pairs_into(k, v)),
            (Values::F32(k), Values::F32(v)) => PackedKv::F32(self.pack_into(k, v)),
            (Values::F16(k), Values::F16(v)) => PackedKv::F32(self.pack_into(k, v)),
            (Values::BF16(k), Values::BF16(v)) => PackedKv::F32(self.pack_into(k, v)),
            _ => return None,
        })
    }

    /// Packs k and v (f32, f16 or bf16, of the configuration's layout and lengths, checked by
    /// the caller; 16-bit values widened exactly as they are packed) into the calling thread's
    /// kept buffer, grown if it is too small.
    pub fn pack_into<E: PanelSource>(&self, k: &[E], v: &[E]) -> Packed<f32> {
        let mut packed = Packed::new(self.k_len(), self.v_len());
        let (kp, vp) = packed.panels_mut();
        self.pack(k, v, kp, vp);
        packed
    }

    /// Packs k and v (f32, f16 or bf16, of `config`'s layout and lengths, checked by the caller) into
    /// `kp` and `vp` ([`KvPanels::k_len`] and [`KvPanels::v_len`] long), one rayon task per key
    /// block and per value panel of each head, so that even one head's packing is spread over
    /// the cores.
    pub fn pack<E: PanelSource>(&self, k: &[E], v: &[E], kp: &mut [f32], vp: &mut [f32]) {
        let isa = Isa::detect();
        self.pack_with((k, v), (kp, vp), |p, src, dst| E::pack(isa, p, src, dst));
    }

    /// Packs bf16 k and v into pair panels in the calling thread's kept buffer, grown if it
    /// is too small (as [`KvPanels::pack_into`]).
    pub fn pack_pairs_into(&self, k: &[bf16], v: &[bf16]) -> Packed<bf16> {
        let mut packed = Packed::new(self.k_len(), self.v_len());
        let (kp, vp) = packed.panels_mut();
        self.pack_with((k, v), (kp, vp), pack_pair_panels_bf16);
        packed
    }

    /// [`KvPanels::pack`] with the packing of one key block or one value panel given.
    fn pack_with<E: Sync, D: Send>(
        &self,
        (k, v): (&[E], &[E]),
        (kp, vp): (&mut [D], &mut [D]),
        pack: impl Fn(&PanelPacking, &[E], &mut [D]) -> Result<(), TileError> + Sync,
    ) {
        let (bc, w) = (self.keys, self.width);
        let head_at =
            |head: usize| head / self.kv_heads * self.strides[0] + head % self.kv_heads * self.strides[1];
        // The run checked k's and v's lengths against the configuration, whose heads each span
        // the packings' source extents; each chunk is one block or one panel of one head.
        let k_block = bc.next_multiple_of(w) * self.keys(bc).panel_stride / w;
        let key_blocks = kp
            .par_chunks_mut(self.k_head)
            .enumerate()
            .flat_map(|(head, kp)| kp.par_chunks_mut(k_block).enumerate().map(move |(b, kp)| (head, b, kp)));
        let value_panels = vp.par_chunks_mut(self.v_head).enumerate().flat_map(|(head, vp)| {
            vp.par_chunks_mut(self.values().panel_stride).enumerate().map(move |(p, vp)| (head, p, vp))
        });
        rayon::join(
            || {
                key_blocks.for_each(|(head, block, kp)| {
                    let first = block * bc;
                    let cols = bc.min(self.n_k - first);
                    let at = head_at(head) + first * self.strides[2];
                    pack(&self.keys(cols), &k[at..], kp).expect("one key block's panels");
                })
            },
            || {
                value_panels.for_each(|(head, panel, vp)| {
                    // One panel: the head's rows, `w` columns of D from the panel's first.
                    let cols = w.min(self.d - panel * w);
                    let one = PanelPacking { n: cols, ..self.values() };
                    let at = head_at(head) + panel * w;
                    pack(&one, &v[at..], vp).expect("one value panel");
                })
            },
        );
    }
}

/// An element type K and V are packed from: f32 copied, f16 and bf16 widened exactly.
pub(crate) trait PanelSource: Copy + Sync {
    /// [`pack_panels`] (or its 16-bit twin) from this type.
    fn pack(isa: Isa, p: &PanelPacking, src: &[Self], dst: &mut [f32]) -> Result<(), TileError>;
}

impl PanelSource for f32 {
    fn pack(isa: Isa, p: &PanelPacking, src: &[f32], dst: &mut [f32]) -> Result<(), TileError> {
        pack_panels(isa, p, src, dst)
    }
}

impl PanelSource for f16 {
    fn pack(isa: Isa, p: &PanelPacking, src: &[f16], dst: &mut [f32]) -> Result<(), TileError> {
        pack_panels_f16(isa, p, src, dst)
    }
}

impl PanelSource for bf16 {
    fn pack(isa: Isa, p: &PanelPacking, src: &[bf16], dst: &mut [f32]) -> Result<(), TileError> {
        pack_panels_bf16(isa, p, src, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The panels start on a cache line whatever the allocator gave, for both element types,
    /// and the buffer holds them from there.
    #[test]
    fn panels_start_on_a_cache_line() {
        for len in [1, 1000, 1 << 20] {
            let mut floats = Vec::new();
            let at = line_aligned(&mut floats, len, 0.0f32);
            assert!(floats[at..].as_ptr().addr().is_multiple_of(LINE_BYTES) && floats.len() - at >= len);
            let mut pairs = Vec::new();
            let at = line_aligned(&mut pairs, len, bf16::ZERO);
            assert!(pairs[at..].as_ptr().addr().is_multiple_of(LINE_BYTES) && pairs.len() - at >= len);
        }
    }
}
