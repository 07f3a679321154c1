//! The block sizes of the forward kernel ([`Blocking`]) and how they are chosen for a
//! configuration and a machine.

use super::panels::KvPanels;
use super::{MaskKind, SdpaConfig, SdpaDType};
use uopc_jit::MAX_LOCAL_BYTES;

/// Block sizes of one compiled attention (see [`Blocking::choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Query heads of one key/value group stacked into one task's tile (they share every K/V
    /// block the task loads).
    pub heads_per_task: usize,
    /// Query rows per head in one task.
    pub queries: usize,
    /// Keys per block.
    pub keys: usize,
    /// Chunks the keys of one task's rows are split into, each its own task; above 1 the
    /// tasks write partial softmax states that [`super::sdpa_merge_ir`] combines (split-K, for
    /// decode shapes with too few rows to keep every core busy).
    pub splits: usize,
    /// 0: each task's GEMMs pack the K and V blocks they read. `w > 0`: the run packs every
    /// key/value head's K and V once into panels of `w` columns, which the GEMMs read in place
    /// (without split-K; see [`Blocking::choose`]): f32 panels, or for bf16 attention on a
    /// machine whose bf16 GEMM multiplies bf16 (AMX, `vdpbf16ps`) bf16 pair panels of 32
    /// ([`Blocking::pair_panels`]).
    pub kv_panel_width: usize,
    /// Parts the GEMMs of a causal sub-tile's diagonal block run in, as a staircase that skips
    /// the keys above the diagonal (by row parts, part `p` of `n` over the first `(p + 1) / n`
    /// of the block's keys, or by key columns; see [`sdpa_ir`](super::sdpa_ir)); 1 runs the
    /// block whole. Applies where [`Blocking::diagonal_in_parts`] holds; at most
    /// [`Blocking::keys`].
    pub diagonal_parts: usize,
}

/// Keys per block: a 64-key block of K and V (32 KiB each at D = 128) stays in L1/L2 while both
/// GEMMs of the block read it, and 64 columns fill the score micro-kernel's 4 x 16-lane rows.
const KEY_BLOCK: usize = 64;

/// Keys per block without the causal mask, when a task still keeps at least
/// [`WIDE_KEY_MIN_ROWS`] rows with it: `P · V` then adds 128 keys into the output tile per pass
/// over it instead of 64, and what each block costs whatever its width (the tile calls, the
/// softmax update's per-row reductions) is spread over twice the keys. Under the causal mask
/// the diagonal band's sub-tiles are one [`KEY_BLOCK`] tall, so blocks stay at that.
const WIDE_KEY_BLOCK: usize = 2 * KEY_BLOCK;

/// Keys per block, widest first, taken where they leave a task as many rows as
/// [`WIDE_KEY_BLOCK`]s do: the output tile's pass per block and the softmax's per-row costs
/// are spread over more keys, and since the rows stay no K/V block is packed for fewer rows.
/// Multiples of 64, so a block starts a panel of every register-tile and AMX width.
const WIDER_KEY_BLOCKS: [usize; 2] = [4 * KEY_BLOCK, 3 * KEY_BLOCK];

/// Rows a task must keep for [`WIDE_KEY_BLOCK`] unless it keeps as many as with 64-key
/// blocks: fewer would re-pack each K/V block for fewer rows than the 64-key blocking's
/// taller tasks do.
const WIDE_KEY_MIN_ROWS: usize = 128;

/// Rows per task under the causal mask. The blocks every row sees run on all rows; the
/// diagonal band runs in sub-tiles of [`CAUSAL_SUB_ROWS`] rows, each over the blocks its own
/// rows see, so the static FLOPs are those of 64-row tasks (about 0.53 of the unmasked
/// kernel's at n = 1024) while the blocks below the band pack each K/V block once per 128
/// rows.
const CAUSAL_MAX_ROWS: usize = 2 * KEY_BLOCK;

/// Rows of one sub-tile of a causal task's diagonal band: one key block, so each sub-tile has
/// a single diagonal block whose masked half is wasted.
pub(super) const CAUSAL_SUB_ROWS: usize = KEY_BLOCK;

/// Parts of a causal diagonal block's GEMMs ([`Blocking::diagonal_parts`]): quarters of a
/// 64-key block skip 3/8 of its work (halves a quarter), in GEMMs 16 keys or rows wide; eighths
/// would skip little more with 8-wide GEMMs, whose ragged register tiles cost more than they
/// save.
const DIAGONAL_PARTS: usize = 4;

/// Keys per block of bf16 attention from pair panels ([`Blocking::pair_panel_blocks`]): 256
/// keys make `P · V` eight k steps of the bf16 tiles per pass over the output, where 128 make
/// four.
const PAIR_PANEL_KEY_BLOCK: usize = 4 * KEY_BLOCK;

/// Rows a task from pair panels keeps at least with [`PAIR_PANEL_KEY_BLOCK`]s: two row blocks
/// of the bf16 tiles, so each K and V panel step loaded into L1 serves more than one.
const PAIR_PANEL_MIN_ROWS: usize = 2 * 32;

/// Query rows per task may shrink to this fraction of the most that fit to divide n_q exactly.
const EXACT_ROWS_MIN_FRACTION: usize = 4;

/// Stack the tiles of one task may take: the JIT's limit less room for the kernel's own frame.
const TILE_BUDGET: usize = MAX_LOCAL_BYTES - 16 * 1024;

/// Tasks per core below which the keys are split (when the rows cannot be): with four tasks
/// per core, uneven task counts leave a core idle for at most a fifth of the run.
const SPLIT_TASKS_PER_CORE: usize = 4;

/// Keys a chunk keeps at least (and at least one block), so the partial state each chunk
/// writes and the merge reads (rows x (D + 2) floats) stays small next to the chunk's K and V.
const MIN_CHUNK_KEYS: usize = 8 * KEY_BLOCK;

/// Reads of each key block (tasks per key/value head, halved under the causal mask, whose
/// tasks read half the blocks on average) from which K and V are packed once per run rather
/// than by every task: the packing pass streams K and V from memory and writes the panels
/// back, several times what one task's packing of blocks already in cache costs, so it pays
/// only when it replaces several of those.
const PACK_ONCE_MIN_READS: usize = 6;

/// Rows per task up to which the tile GEMMs stream K and V rows straight from memory instead
/// of packing register-tile panels (the AVX-512 and AVX2 dot-product and row-streamed kernels).
const FEW_ROWS: usize = 8;

/// Keys per block for tasks of at most [`FEW_ROWS`] rows (decode). Such a task does little
/// arithmetic per key, so what each block costs regardless of its width (three tile calls,
/// the softmax update's per-row reductions, one rescale pass over the output tile) is a large
/// share of it; the streamed kernels read each K and V row once whatever the block's width, so
/// a wide block costs no cache reuse. The score tile stays small (rows x 512 floats).
const STREAMED_KEY_BLOCK: usize = 512;

impl Blocking {
    /// Tasks of `heads_per_task` query heads times `queries` rows, keys in blocks of `keys`:
    /// one chunk of keys, K and V packed by each task, diagonal blocks whole. Set the other
    /// fields with struct update syntax (`Blocking { splits: 2, ..Blocking::new(1, 64, 64) }`).
    pub fn new(heads_per_task: usize, queries: usize, keys: usize) -> Blocking {
        Blocking { heads_per_task, queries, keys, splits: 1, kv_panel_width: 0, diagonal_parts: 1 }
    }

    /// Block sizes for `config` on `cores` cores.
    ///
    /// The task's tiles (the output, `rows x D`, the `rows x keys` score tile and the running
    /// max and sum; a scaled `rows x D` copy of the queries unless the task
    /// [reads them in place](Blocking::reads_queries_in_place); with bf16 the query tile in
    /// bf16 and a `rows x keys` bf16 tile of rounded probabilities besides) must fit the JIT's
    /// stack limit less 16 KiB; within that, rows are as many as possible, up to 256 (a
    /// multiple of 16), because every task re-packs
    /// each K/V block it reads (unless K and V come packed once per run; see below) and
    /// taller tiles amortize that; under the causal mask at most
    /// 128, whose diagonal band runs in 64-row sub-tiles (see [`sdpa_ir`](super::sdpa_ir)). With fewer
    /// queries than rows, the query heads of a key/value group fill the rows (decode: one K/V pass serves the whole group). Query
    /// rows are a divisor of n_q when one lies within half of the most rows; otherwise query
    /// blocks are evened out (no mostly-empty last block); they are split further if there
    /// would be fewer tasks than cores. Keys come in blocks of 128 without the causal mask when
    /// that leaves a task at least 128 rows or as many as 64-key blocks would (and of 256, else
    /// 192, where those leave it as many rows as 128 do), else of 64, or of 512 when a task has
    /// at most 8
    /// rows (those stream K and V, and a wide block spreads the per-block costs). When
    /// one query block holds all rows and there are fewer than four tasks per core, the keys
    /// are split into chunks of at least 512 keys and one block (split-K).
    ///
    /// K and V are packed once per run into panels of the GEMM's register-tile width
    /// ([`Blocking::kv_panel_width`]) for f32 and f16, and for bf16 where the machine's bf16
    /// GEMM widens to f32 (elsewhere into bf16 pair panels of 32, whose tasks then take
    /// 256-key blocks where they can: [`Blocking::pair_panels`]), without split-K or a runtime
    /// KV length, when tasks have more than 8 rows (fewer stream K and V unpacked) and each key
    /// block is read by at least six tasks (counting a causal task as half a read).
    ///
    /// Under the causal mask, diagonal blocks run their GEMMs in four parts
    /// ([`Blocking::diagonal_parts`]).
    pub fn choose(config: &SdpaConfig, cores: usize) -> Blocking {
        let mut b = Self::choose_with_key_block(config, cores, KEY_BLOCK);
        if !config.causal && config.n_k >= WIDE_KEY_BLOCK {
            let wide = Self::choose_with_key_block(config, cores, WIDE_KEY_BLOCK);
            let (wide_rows, rows) = (wide.rows(), b.rows());
            if wide.keys == WIDE_KEY_BLOCK && (wide_rows >= WIDE_KEY_MIN_ROWS || wide_rows >= rows) {
                b = wide;
            }
        }
        if !config.causal && b.keys == WIDE_KEY_BLOCK {
            let rows = b.rows();
            // The widest block that leaves the rows as they are.
            let wider = WIDER_KEY_BLOCKS
                .iter()
                .filter(|&&keys| config.n_k >= keys)
                .map(|&keys| Self::choose_with_key_block(config, cores, keys))
                .find(|w| WIDER_KEY_BLOCKS.contains(&w.keys) && w.rows() >= rows);
            if let Some(wider) = wider {
                b = wider;
            }
        }
        let reads = b.tasks(config) / (config.batch * config.kv_heads) / if config.causal { 2 } else { 1 };
        let width = uopc_tile::panel_width(uopc_tile::Isa::detect());
        // With panels the GEMMs read f32 K and V: 16-bit queries take an f32 query tile where
        // it fits, else one head's are read in place (the 16-bit A x f32 panel GEMM widens them
        // as it packs them), and bf16 writes its rounded P over the f32 scores: f32's tiles,
        // which must fit. bf16 packs f32 panels only where its GEMM path widens bf16 to f32 anyway
        // (AMX and vdpbf16ps take bf16 operands).
        // bf16 on bf16 GEMMs packs bf16 pair panels instead, and keeps its bf16 tiles.
        let rows = b.rows();
        let query_tile = !queries_in_place(b.heads_per_task);
        let pairs = bf16_on_bf16_gemms(config);
        let width = if pairs { uopc_tile::PAIR_PANEL_WIDTH } else { width };
        let query_tile_fits = config.dtype == SdpaDType::F32
            || pairs
            || rows * tile_bytes_per_row(SdpaDType::F32, config.d, b.keys, query_tile) <= TILE_BUDGET;
        if rows > FEW_ROWS && reads >= PACK_ONCE_MIN_READS && query_tile_fits && b.panels_fit(config, width) {
            b.kv_panel_width = width;
        }
        if b.pair_panels(config)
            && let Some(wide) = Self::pair_panel_blocks(config, cores)
        {
            b = wide;
        }
        b
    }

    /// The blocks of bf16 attention from pair panels when its key blocks can be
    /// [`PAIR_PANEL_KEY_BLOCK`] wide: no task packs K or V then, so rows per task no longer
    /// spread a packing, while each key block costs a pass of `P · V` over the output tile
    /// (its tiles loaded and stored, `rows x D` f32) and a rescale of it, which wider blocks
    /// spread over more keys. One head's rows per task, as many as fit if they divide n_q,
    /// else the most whole 32-row tile blocks that split n_q evenly (a ragged tile block
    /// multiplies mostly padding); at least [`PAIR_PANEL_MIN_ROWS`], with a task for every
    /// core and K and V still read often enough to pack once. Not under the causal mask, whose
    /// band runs in 64-key sub-tiles.
    fn pair_panel_blocks(config: &SdpaConfig, cores: usize) -> Option<Blocking> {
        if config.causal || config.n_k < PAIR_PANEL_KEY_BLOCK {
            return None;
        }
        let mut b = Self::choose_with_key_block(config, cores, PAIR_PANEL_KEY_BLOCK);
        if b.keys != PAIR_PANEL_KEY_BLOCK || b.heads_per_task != 1 || b.splits != 1 {
            return None;
        }
        let n_q = config.n_q;
        if !n_q.is_multiple_of(b.queries) {
            let evenly = |r: usize| n_q.div_ceil(n_q.div_ceil(r)) == r;
            b.queries =
                (PAIR_PANEL_MIN_ROWS / 32..=b.queries / 32).rev().map(|t| 32 * t).find(|&r| evenly(r))?;
        }
        let reads = b.tasks(config) / (config.batch * config.kv_heads);
        b.kv_panel_width = uopc_tile::PAIR_PANEL_WIDTH;
        let fits = b.panels_fit(config, b.kv_panel_width);
        (b.queries >= PAIR_PANEL_MIN_ROWS && b.tasks(config) >= cores && reads >= PACK_ONCE_MIN_READS && fits)
            .then_some(b)
    }

    /// Whether K and V can be read from panels of `width` columns under these blocks: f32, or
    /// f16 or bf16 packed widened to f32 (bf16 pair panels, of 32, where the machine's bf16
    /// GEMM multiplies bf16), without split-K or a runtime KV length, every key block
    /// starting a panel, and a width the GEMM descriptor carries.
    pub fn panels_fit(&self, config: &SdpaConfig, width: usize) -> bool {
        let pairs = bf16_on_bf16_gemms(config);
        (1..=uopc_tile::GEMM_MAX_PANEL_WIDTH).contains(&width)
            && (!pairs || width == uopc_tile::PAIR_PANEL_WIDTH)
            && self.splits == 1
            && !config.runtime_kv_length
            && (self.keys.is_multiple_of(width) || self.keys >= config.n_k)
    }

    /// [`Blocking::choose`] with blocks of `key_block` keys (but for few-row tasks' wide ones).
    fn choose_with_key_block(config: &SdpaConfig, cores: usize, key_block: usize) -> Blocking {
        let &SdpaConfig { batch, heads, kv_heads, n_q, n_k, d, .. } = config;
        let keys = key_block.min(n_k);
        let rows_fitting = |per_row: usize| {
            let fit = (TILE_BUDGET / per_row).max(1);
            let rows = if fit >= 16 { (fit / 16 * 16).min(256) } else { fit };
            // The diagonal band of a block wastes about (rows + keys) / 2 masked pairs per row.
            if config.causal { rows.min(CAUSAL_MAX_ROWS) } else { rows }
        };
        // Stacked heads keep a query tile; one head's rows read q in place.
        let stacked_rows = rows_fitting(tile_bytes_per_row(config.dtype, d, keys, true));
        let one_head_rows = rows_fitting(tile_bytes_per_row(config.dtype, d, keys, !queries_in_place(1)));
        let group = heads / kv_heads;
        let (heads_per_task, mut queries) = if n_q >= one_head_rows {
            (1, one_head_rows)
        } else {
            let g =
                (1..=group).rev().find(|g| group.is_multiple_of(*g) && g * n_q <= stacked_rows).unwrap_or(1);
            (g, n_q)
        };
        let max_rows = if heads_per_task == 1 { one_head_rows } else { stacked_rows };
        if heads_per_task == 1
            && let Some(rows) =
                (max_rows.div_ceil(EXACT_ROWS_MIN_FRACTION)..=max_rows).rev().find(|r| n_q.is_multiple_of(*r))
        {
            // Rows that divide n_q exactly: no overlapping last block, and each task's output
            // rows are contiguous, so the tasks are proven disjoint and run in parallel. An
            // overlapping last block makes the tasks' writes overlap, and they run one after
            // another: a quarter of the rows per task costs far less than that (n_q = 777 on
            // 2 cores ran at half speed with 195-row blocks; 111 rows divide it).
            queries = rows;
        }
        let mut blocks = n_q.div_ceil(queries);
        let tasks = batch * kv_heads * (group / heads_per_task) * blocks;
        if tasks < cores {
            blocks = (blocks * cores.div_ceil(tasks)).min(n_q);
        }
        queries = n_q.div_ceil(blocks);
        let tasks = batch * kv_heads * (group / heads_per_task) * n_q.div_ceil(queries);
        let rows = heads_per_task * queries;
        let wide = STREAMED_KEY_BLOCK.min(n_k);
        let query_tile = !queries_in_place(heads_per_task);
        let keys = if rows <= FEW_ROWS
            && rows * tile_bytes_per_row(config.dtype, d, wide, query_tile) <= TILE_BUDGET
        {
            wide
        } else {
            keys
        };
        let mut splits = 1;
        if queries == n_q && tasks < SPLIT_TASKS_PER_CORE * cores {
            let full = n_k / keys;
            let want =
                (SPLIT_TASKS_PER_CORE * cores).div_ceil(tasks).min((n_k / MIN_CHUNK_KEYS).min(full)).max(1);
            // Even chunks, none of them empty.
            splits = full.div_ceil(full.div_ceil(want));
        }
        let diagonal_parts = if config.causal { DIAGONAL_PARTS.min(keys) } else { 1 };
        Blocking { heads_per_task, queries, keys, splits, kv_panel_width: 0, diagonal_parts }
    }

    /// Whether the score GEMM reads the task's query rows from q itself, unscaled (the softmax
    /// step then applies the scale, and a mask loop that reads every score scales it), rather
    /// than from a copy on the stack: with one query head per task, whose rows are evenly
    /// strided in q, for every dtype (the widening 16-bit GEMMs widen A as they pack it; bf16
    /// GEMMs on AMX or `vdpbf16ps` read bf16 A where it lies). The copy's room then goes to
    /// more rows. 16-bit queries against f32 K/V
    /// panels are the exception while an f32 copy fits the stack: widened once per task, they
    /// spare every key block's score GEMM that widening.
    pub fn reads_queries_in_place(&self, config: &SdpaConfig) -> bool {
        let rows = self.rows();
        let copy_fits = rows * tile_bytes_per_row(SdpaDType::F32, config.d, self.keys, true) <= TILE_BUDGET;
        let widened_once = config.dtype != SdpaDType::F32
            && self.kv_panel_width > 0
            && !self.pair_panels(config)
            && copy_fits;
        queries_in_place(self.heads_per_task) && !widened_once
    }

    /// Whether bf16 attention keeps bf16 query and probability tiles of its own, for bf16
    /// GEMMs that take both operands in bf16 (natively on AMX or `vdpbf16ps`), from K and V
    /// where they lie or in pair panels. Where the machine's bf16 GEMM widens to f32 (and so
    /// the GEMMs read f32 panels), it has f16's f32 tiles instead and writes its rounded
    /// probabilities over the f32 scores: the same values, which the f32 x bf16 GEMM (or the
    /// panels' f32 GEMM) reads in place.
    pub(crate) fn bf16_tiles(&self, config: &SdpaConfig) -> bool {
        bf16_on_bf16_gemms(config)
    }

    /// Whether K and V come packed once per run in bf16 pair panels: bf16 attention with
    /// panels, on a machine whose bf16 GEMM multiplies bf16.
    pub fn pair_panels(&self, config: &SdpaConfig) -> bool {
        self.kv_panel_width > 0 && self.bf16_tiles(config)
    }

    /// Rows of each sub-tile that a causal task's diagonal band runs in, when the band is
    /// split (see [`sdpa_ir`](super::sdpa_ir)): `Some` for a causal task of one head's queries
    /// taller than one key block.
    pub fn causal_sub_tile_rows(&self, config: &SdpaConfig) -> Option<usize> {
        let rows = self.rows();
        (config.causal && self.splits == 1 && self.heads_per_task == 1 && rows > CAUSAL_SUB_ROWS)
            .then_some(CAUSAL_SUB_ROWS)
    }

    /// Whether the causal sub-tiles' diagonal blocks run their GEMMs in
    /// [`Blocking::diagonal_parts`] parts: with more than one part, when the causal mask is the
    /// only one (no bool mask or bias, key lengths or runtime KV length), the diagonal band runs
    /// in sub-tiles one key block tall, and every sub-tile's first query plus the causal offset
    /// (`n_k - n_q`) is a multiple of the block, so each sub-tile's masked keys are exactly one
    /// block whose row `r` sees its keys `0..=r`.
    pub fn diagonal_in_parts(&self, config: &SdpaConfig) -> bool {
        let (bc, bq, n_q) = (self.keys, self.queries, config.n_q);
        let every_start_aligned = bq.is_multiple_of(bc) && (n_q.is_multiple_of(bq) || n_q <= bq);
        self.diagonal_parts > 1
            && self.causal_sub_tile_rows(config) == Some(bc)
            && config.mask == MaskKind::None
            && !config.key_lengths
            && !config.runtime_kv_length
            && every_start_aligned
            && config.causal_offset().rem_euclid(bc as i64) == 0
    }

    /// Whether [`Blocking::kv_panel_width`] is 0 or a width [`Blocking::panels_fit`] allows.
    pub fn kv_panels_valid(&self, config: &SdpaConfig) -> bool {
        self.kv_panel_width == 0 || self.panels_fit(config, self.kv_panel_width)
    }

    /// Where K and V lie in panels for `config`, when these blocks read them so.
    pub(crate) fn kv_panels(&self, config: &SdpaConfig) -> Option<KvPanels> {
        (self.kv_panel_width > 0)
            .then(|| KvPanels::new(config, self.kv_panel_width, self.keys, self.pair_panels(config)))
    }

    /// Keys per block of the blocks every row of a causal task sees (those before its diagonal
    /// band), when the band runs in sub-tiles: twice [`Blocking::keys`] when there are at least
    /// two full blocks and the wider score tile still fits the stack, so that prefix runs with
    /// the per-block costs of the unmasked kernel's wide blocks; otherwise `keys`.
    pub fn causal_prefix_keys(&self, config: &SdpaConfig) -> usize {
        let wide = 2 * self.keys;
        let rows = self.rows();
        let query_tile = !self.reads_queries_in_place(config);
        let dtype = if config.dtype == SdpaDType::BF16 && !self.bf16_tiles(config) {
            SdpaDType::F32
        } else {
            config.dtype
        };
        let fits = rows * tile_bytes_per_row(dtype, config.d, wide, query_tile) <= TILE_BUDGET;
        if self.causal_sub_tile_rows(config).is_some() && config.n_k >= wide && fits {
            wide
        } else {
            self.keys
        }
    }

    /// Full key blocks per chunk of a split-K blocking (all full blocks when `splits == 1`).
    pub fn chunk_blocks(&self, n_k: usize) -> usize {
        (n_k / self.keys).div_ceil(self.splits)
    }

    /// Query rows of one task: its heads' queries.
    pub fn rows(&self) -> usize {
        self.heads_per_task * self.queries
    }

    /// THREAD tasks of the kernel for `config`.
    pub fn tasks(&self, config: &SdpaConfig) -> usize {
        let group = config.heads / config.kv_heads;
        config.batch
            * config.kv_heads
            * (group / self.heads_per_task)
            * config.n_q.div_ceil(self.queries)
            * self.splits
    }
}

/// Whether tasks of `heads_per_task` query heads read their queries in place: with one head
/// (stacked heads' rows are not evenly strided in q), whatever the dtype. f16, and bf16 where
/// its GEMMs widen, have the score GEMM widen the query rows as it packs them; bf16 GEMMs
/// that take bf16 operands read the rows as their A where they lie, as a copy would be read.
fn queries_in_place(heads_per_task: usize) -> bool {
    heads_per_task == 1
}

/// Whether this machine's bf16 GEMM widens bf16 to f32 for the f32 kernels (no AMX or
/// `vdpbf16ps` path chosen): then bf16 attention runs on f16's f32 tiles.
fn bf16_widens() -> bool {
    uopc_jit::machine::Machine::get().choices().bf16.widens()
}

/// Whether `config` is bf16 attention on a machine whose bf16 GEMM multiplies bf16 (AMX,
/// `vdpbf16ps`): it keeps bf16 tiles and packs K and V into pair panels.
fn bf16_on_bf16_gemms(config: &SdpaConfig) -> bool {
    config.dtype == SdpaDType::BF16 && !bf16_widens()
}

/// Stack bytes one task row takes with blocks of `keys` keys: the query row when there is a
/// query tile, the output row, the score row and the running max and sum; bf16 attention on
/// bf16 GEMMs keeps its query row in bf16 and adds a row of rounded probabilities, f16 (and
/// bf16 where its GEMMs widen) has f32's tiles (an f32 query row, P over the scores).
fn tile_bytes_per_row(dtype: SdpaDType, d: usize, keys: usize, query_tile: bool) -> usize {
    let query = usize::from(query_tile) * d;
    match dtype {
        SdpaDType::BF16 if !bf16_widens() => 2 * query + 4 * d + 4 * keys + 2 * keys + 8,
        _ => 4 * (query + d + keys + 2),
    }
}

/// The cores the THREAD range is spread over.
pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
