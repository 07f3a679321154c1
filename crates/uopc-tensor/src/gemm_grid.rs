//! How a GEMM kernel is cut into THREAD tasks: the grid of row and column blocks.
//!
//! Each task is one call of the tile GEMM on its block, and every call packs its own operands:
//! the `k x cols` slab of B and the `rows x k` block of A. Cutting the rows into many blocks
//! therefore packs B many times over, and cutting the columns packs A many times over. The
//! grid is the one with the least estimated time per thread: the compute of the tasks a
//! thread runs (padded to whole register tiles) plus their packing, over whole rounds of
//! tasks so that no thread idles at the end.

/// The cost model's constants, named so the rule reads as data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GridModel {
    /// Rows and columns of the micro-kernel's register tile: a block is padded up to them.
    pub tile_rows: usize,
    pub tile_cols: usize,
    /// Flops one core computes in the time it packs one float (the copy plus its share of the
    /// cache misses of reading the operand): the micro-kernel's rate over the packing rate.
    pub flops_per_packed_float: usize,
    /// Flops' worth of fixed cost per task: the call, its dispatch and its first cache misses.
    pub flops_per_task: usize,
    /// The narrowest column block besides all of `n`: narrower calls spend their time packing.
    pub min_cols: usize,
    /// Flops' worth of waking the pool's other threads, paid once by a cut into several tasks.
    pub flops_to_start_threads: usize,
}

impl GridModel {
    /// The model for the AVX-512 f32 register tile (12 x 32); [`GridModel::of_this_machine`]
    /// takes the tile of the kernels this machine runs.
    pub(crate) const DEFAULT: GridModel = GridModel {
        tile_rows: 12,
        tile_cols: 32,
        flops_per_packed_float: 48,
        flops_per_task: 400_000,
        min_cols: 128,
        flops_to_start_threads: 2_000_000,
    };

    /// [`GridModel::DEFAULT`] with the register tile of the f32 kernels the machine model
    /// chose (6 x 16 on AVX2), which blocks are padded up to.
    pub(crate) fn of_this_machine() -> GridModel {
        let machine = uopc_tile::machine::Machine::get();
        let (tile_rows, tile_cols) = uopc_tile::machine::register_tile(machine.isa());
        GridModel { tile_rows, tile_cols, ..GridModel::DEFAULT }
    }
}

/// A cut of `items` independent `m x n` products of depth `k` into tasks of `rows x cols`
/// blocks (each a divisor of its dimension), chosen for `threads` cores by [`GridModel`].
/// With `split_in_call`, the one task's GEMM call cuts itself over the pool instead, in blocks
/// of whole register tiles with a ragged last one (`uopc_tile::GemmShape::parallel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    pub rows: usize,
    pub cols: usize,
    pub split_in_call: bool,
}

impl Grid {
    /// Tasks of the grid for `items` products of `m x n`.
    pub(crate) fn tasks(&self, items: usize, m: usize, n: usize) -> usize {
        items * (m / self.rows) * (n / self.cols)
    }
}

/// The divisors of `n`, ascending.
fn divisors(n: usize) -> Vec<usize> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            small.push(d);
            if d * d != n {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// The grid with the least estimated time per thread (see the module docs); ties go to fewer,
/// larger tasks. With `may_split_in_call`, one task whose call cuts itself in ragged blocks is
/// a candidate too (a single product, `items == 1`, whose sizes may have no divisor that
/// spreads it evenly).
pub(crate) fn choose(
    model: &GridModel,
    items: usize,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    may_split_in_call: bool,
) -> Grid {
    let (exact, grid) = choose_exact(model, items, m, n, k, threads);
    if !may_split_in_call || items != 1 {
        return grid;
    }
    // The call's own cut, priced as one round of its blocks.
    let Some((rows, cols)) = uopc_tile::parallel_block(m, n, k, threads, (model.tile_rows, model.tile_cols))
    else {
        return grid;
    };
    let split = task_cost(model, rows, cols, k) + model.flops_to_start_threads as u128;
    if split * SPLIT_MARGIN_PERCENT < exact * 100 {
        Grid { rows: m, cols: n, split_in_call: true }
    } else {
        grid
    }
}

/// The grid of a product of a few rows against a deep B stored by rows (a decode step's
/// projection): one task whose call cuts k over the pool ([`uopc_tile::depth_split`]), so each
/// thread reads whole rows of B, one contiguous run, where a cut of the columns would give it
/// a short stretch of every row. `None` where the call would not cut k (`items > 1`, a
/// transposed operand, more rows, too little work or depth).
pub(crate) fn few_rows_by_depth(
    items: usize,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    (a_trans, b_trans): (bool, bool),
) -> Option<Grid> {
    let cuts_k = items == 1 && uopc_tile::depth_split(m, n, k, threads, a_trans, b_trans).is_some();
    cuts_k.then_some(Grid { rows: m, cols: n, split_in_call: true })
}

/// A split inside the call must beat the exact grid by this much (in percent of its cost) to
/// be taken: the exact grid's tasks balance themselves across a busy pool, the call's blocks
/// are fixed.
const SPLIT_MARGIN_PERCENT: u128 = 105;

/// The estimated time of one task computing a `rows x cols` block of depth `k`, in flops:
/// its compute padded to whole register tiles, its packing and its fixed cost.
fn task_cost(model: &GridModel, rows: usize, cols: usize, k: usize) -> u128 {
    let k = k.max(1) as u128;
    let (pr, pc) = (rows.next_multiple_of(model.tile_rows), cols.next_multiple_of(model.tile_cols));
    let compute = 2 * (pr * pc) as u128 * k;
    let packing = (model.flops_per_packed_float as u128) * k * (rows + cols) as u128;
    compute + packing + model.flops_per_task as u128
}

/// The estimated time per thread of `grid` (see the module docs), in flops: whole rounds of
/// its tasks, plus waking the pool when there are several.
fn cost(model: &GridModel, grid: Grid, items: usize, m: usize, n: usize, k: usize, threads: usize) -> u128 {
    let tasks = grid.tasks(items, m, n);
    let rounds = tasks.div_ceil(threads.max(1)) as u128;
    let start = if tasks > 1 { model.flops_to_start_threads as u128 } else { 0 };
    rounds * task_cost(model, grid.rows, grid.cols, k) + start
}

/// The best grid of exact divisors, with its cost.
fn choose_exact(
    model: &GridModel,
    items: usize,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
) -> (u128, Grid) {
    let cols: Vec<usize> = divisors(n).into_iter().filter(|&c| c == n || c >= model.min_cols).collect();
    let mut best: Option<(u128, Grid)> = None;
    for &rows in divisors(m).iter().rev() {
        for &c in cols.iter().rev() {
            let grid = Grid { rows, cols: c, split_in_call: false };
            let cost = cost(model, grid, items, m, n, k, threads);
            if best.is_none_or(|(b, _)| cost < b) {
                best = Some((cost, grid));
            }
        }
    }
    let whole = Grid { rows: m.max(1), cols: n.max(1), split_in_call: false };
    best.unwrap_or((cost(model, whole, items, m, n, k, threads), whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: GridModel = GridModel::DEFAULT;

    #[test]
    fn divisors_are_complete_and_sorted() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(97), vec![1, 97]);
    }

    #[test]
    fn a_large_square_product_gets_one_task_per_thread() {
        let g = choose(&M, 1, 2048, 2048, 2048, 2, false);
        assert_eq!(g.tasks(1, 2048, 2048), 2);
        let g = choose(&M, 1, 4096, 4096, 4096, 16, false);
        assert_eq!(g.tasks(1, 4096, 4096), 16);
    }

    #[test]
    fn wide_products_cut_columns_and_tall_ones_rows() {
        // Few rows, many columns: packing A again per column block is cheap.
        let g = choose(&M, 1, 128, 3072, 768, 2, false);
        assert_eq!((g.rows, g.tasks(1, 128, 3072)), (128, 2));
        // Many rows, few columns: the rows are cut.
        let g = choose(&M, 1, 4096, 128, 768, 2, false);
        assert_eq!(g.cols, 128);
        assert!(g.tasks(1, 4096, 128) >= 2);
    }

    #[test]
    fn batched_products_stay_whole() {
        let g = choose(&M, 16, 256, 256, 64, 2, false);
        assert_eq!(g, Grid { rows: 256, cols: 256, split_in_call: false });
    }

    #[test]
    fn uneven_rounds_are_avoided() {
        // Three row blocks on two threads leave one idle for a round: four or two are better.
        let g = choose(&M, 1, 1536, 1024, 1024, 2, false);
        assert_eq!(g.tasks(1, 1536, 1024) % 2, 0);
    }

    #[test]
    fn a_prime_row_count_is_cut_by_columns() {
        let g = choose(&M, 1, 997, 1024, 1024, 2, false);
        assert_eq!(g.rows, 997);
        assert_eq!(g.tasks(1, 997, 1024), 2);
    }

    #[test]
    fn few_rows_against_a_deep_row_major_b_cut_k_inside_the_call() {
        let whole = Grid { rows: 1, cols: 768, split_in_call: true };
        assert_eq!(few_rows_by_depth(1, 1, 768, 3072, 2, (false, false)), Some(whole));
        // Batched, transposed, or many rows: the exact grid decides.
        assert_eq!(few_rows_by_depth(4, 1, 768, 3072, 2, (false, false)), None);
        assert_eq!(few_rows_by_depth(1, 1, 768, 3072, 2, (false, true)), None);
        assert_eq!(few_rows_by_depth(1, 64, 768, 3072, 2, (false, false)), None);
        assert_eq!(few_rows_by_depth(1, 1, 768, 3072, 1, (false, false)), None);
    }

    #[test]
    fn sizes_without_an_even_divisor_split_inside_the_call() {
        // 1023 = 3 * 11 * 31: three exact blocks keep one of two threads idle a third of the
        // time; the call's own ragged halves do not.
        let g = choose(&M, 1, 1023, 1023, 1023, 2, true);
        assert!(g.split_in_call && g.rows == 1023 && g.cols == 1023, "{g:?}");
        // Even sizes keep their exact grid, and so does anything when splitting is not allowed.
        assert!(!choose(&M, 1, 2048, 2048, 2048, 2, true).split_in_call);
        assert!(!choose(&M, 1, 1023, 1023, 1023, 2, false).split_in_call);
        // Batched products never split inside a call.
        assert!(!choose(&M, 3, 1023, 1023, 1023, 2, true).split_in_call);
    }

    #[test]
    fn tiny_products_are_one_task() {
        assert_eq!(choose(&M, 1, 8, 8, 8, 2, false), Grid { rows: 8, cols: 8, split_in_call: false });
    }
}
