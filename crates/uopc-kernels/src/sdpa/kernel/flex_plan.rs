//! The per-run block plan of a mask whose key bounds cannot be read off at compile time (a
//! document mask over captured ids): one kernel counts, for every query block and full key
//! block, the (row, key) pairs the mask lets through; the run turns the counts into each
//! task's blocks to skip, to mask and to run whole (as torch's `create_block_mask` does once
//! per mask).

use super::SdpaKernel;
use super::task::{TaskIndices, first_query};
use crate::masked::min_idx;
use crate::sdpa::flex::Reads;
use crate::sdpa::{AttentionMods, Blocking, Extras, SdpaConfig, SdpaError, push_captures};
use uopc_ir::{AxisType, DType, ProgramBuilder, UOp, buffer, f32c, idx, var};
use uopc_jit::{Arg, BufRef, Program};

/// How a flex kernel knows its blocks: from the mask's key bounds at compile time, or from a
/// plan counted at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlanMode {
    /// Bounds read off the mask (exact, or no mask at all).
    Static,
    /// Counted once per run: per query block of each batch item (a mask that does not read
    /// the head), or per task (`per_head`).
    Runtime { per_head: bool },
}

impl PlanMode {
    /// The mode for `mods`: a runtime plan when the mask's key bounds are not exact.
    pub fn of(mods: &AttentionMods) -> PlanMode {
        match mods.mask_analysis() {
            Some(m) if !m.bounds.exact => PlanMode::Runtime { per_head: m.reads_head },
            _ => PlanMode::Static,
        }
    }

    /// Plan entries (units) for `config` under `blocking`.
    pub fn units(self, config: &SdpaConfig, blocking: &Blocking) -> usize {
        match self {
            PlanMode::Runtime { per_head: false } => config.batch * config.n_q.div_ceil(blocking.queries),
            _ => blocking.tasks(config),
        }
    }

    /// Query rows one unit counts over.
    pub fn rows(self, blocking: &Blocking) -> usize {
        match self {
            PlanMode::Runtime { per_head: false } => blocking.queries,
            _ => blocking.rows(),
        }
    }
}

/// The counting kernel of a runtime plan: for unit `u` (a query block of an item, or a task when
/// the mask reads the head) and full key
/// block `kb`, `counts[u * full + kb]` = the pairs of the unit's query rows and the block's keys
/// that the mask, the causal limit, the KV length and the item's key length let through (an
/// f32, exact below 2^24). Buffers: the captures, the key lengths (with
/// [`SdpaConfig::key_lengths`]), then the counts; the runtime KV length is variable 0.
pub fn sdpa_flex_plan_ir(config: &SdpaConfig, blocking: &Blocking, mods: &AttentionMods) -> UOp {
    let mode = PlanMode::of(mods);
    let &SdpaConfig { n_q, n_k, .. } = config;
    let Blocking { heads_per_task: gs, queries: bq, keys: bc, .. } = *blocking;
    let (full, blocks) = (n_k / bc, n_q.div_ceil(bq));
    let used = mods.captures_read(Reads::MASK);
    let captures = mods.buffers_used(0, &used);
    let mut slot = used.iter().filter(|&&u| u).count();
    let lens = config.key_lengths.then(|| buffer(slot, DType::I32, config.batch));
    slot += usize::from(lens.is_some());
    let units = mode.units(config, blocking);
    let counts = buffer(slot, DType::F32, units * full);
    let kv_length = config.runtime_kv_length.then(|| var(0, 0, n_k as i64));
    let mut pb = ProgramBuilder::new();
    let acc = pb.alloc(DType::F32, 1);
    let u = pb.range(units, AxisType::Thread);
    let per_head = mode != (PlanMode::Runtime { per_head: false });
    // The unit's item, query block and first head, numbered as the attention's tasks are
    // (one chunk of keys), or as `item * blocks + query block`.
    let (item, qblk, head0) = if per_head {
        let TaskIndices { item, qblk, head0, .. } = TaskIndices::of(&u, config, blocking);
        (item, qblk, head0)
    } else {
        (u.idiv(blocks as i64), u.modulo(blocks as i64), idx(0))
    };
    let q0 = first_query(&qblk, n_q, bq);
    let kb = pb.range(full, AxisType::Loop);
    let init = acc.after(&[u.clone(), kb.clone()]).index(0).store(0.0f32);
    let hh = pb.range(if per_head { gs } else { 1 }, AxisType::Reduce);
    let rq = pb.range(bq, AxisType::Reduce);
    let cc = pb.range(bc, AxisType::Reduce);
    let (q, kv, h) = (&q0 + &rq, &kb * bc as i64 + &cc, &head0 + &hh);
    let (_, mask, _) = mods.build((&item, &h, &q, &kv), &captures, None);
    let mut keep: Vec<UOp> = mask.into_iter().collect();
    let limit = match &kv_length {
        Some(len) => {
            keep.push(kv.lt(len));
            len - n_q as i64
        }
        None => idx(n_k as i64 - n_q as i64),
    };
    if config.causal {
        keep.push(kv.lt(&q + &limit + 1));
    }
    if let Some(lens) = &lens {
        keep.push(kv.lt(lens.index(&item).load().cast(DType::INDEX)));
    }
    let seen = keep.into_iter().fold(f32c(1.0), |x, k| k.where_(&x, f32c(0.0)));
    let a = acc.after(&[init, hh.clone(), rq.clone(), cc.clone()]);
    let add = a.index(0).store(a.index(0).load() + seen).end(&[cc, rq, hh]);
    let total = acc.after(&[add]).index(0).load();
    let st = counts.index(&u * full as i64 + &kb).store(total);
    uopc_ir::sink(&[st.end(&[kb, u])])
}

/// The counts of `program`, a counting kernel of `mods` ([`sdpa_flex_plan_ir`]), for a run with
/// `extras` (the captures its mask reads, `mask_reads`, the key lengths, the runtime KV
/// length): `len` values, `units x full key blocks`.
pub(crate) fn count_pairs(
    program: &Program,
    (mods, mask_reads): (&AttentionMods, &[bool]),
    extras: Extras<'_>,
    len: usize,
) -> Result<Vec<f32>, SdpaError> {
    let mut counts = vec![0.0f32; len];
    let mut args: Vec<Arg<'_>> = Vec::new();
    push_captures(mods.captures(), extras.captures, mask_reads, &mut args)?;
    if let Some(lens) = extras.key_lengths {
        args.push(Arg::Read(BufRef::I32(lens)));
    }
    args.push(Arg::WriteF32(&mut counts));
    let vars: Vec<i64> = extras.kv_length.map(|l| l as i64).into_iter().collect();
    program.run_with_vars(&mut args, &vars)?;
    drop(args);
    Ok(counts)
}

/// Each unit's `[t0, c0, c1, t1]` from its counts (`full` per unit, each out of `whole`
/// pairs): full key blocks `[t0, t1)` from the first to the last one some pair is seen in,
/// and within them the longest run `[c0, c1)` in which every pair is seen (empty at `t1`
/// when there is none).
pub(crate) fn plan_from_counts(counts: &[f32], full: usize, whole: usize) -> Vec<i32> {
    let mut plan = Vec::with_capacity(counts.len() / full.max(1) * 4);
    for unit in counts.chunks(full.max(1)) {
        let seen = |c: &f32| *c > 0.0;
        let t0 = unit.iter().position(seen).unwrap_or(0);
        let t1 = unit.iter().rposition(seen).map_or(0, |p| p + 1);
        let (mut c0, mut c1) = (t1, t1);
        let mut run_start = None;
        for (i, &c) in unit.iter().enumerate().take(t1).skip(t0) {
            if c as usize == whole {
                let start = *run_start.get_or_insert(i);
                if i + 1 - start > c1 - c0 {
                    (c0, c1) = (start, i + 1);
                }
            } else {
                run_start = None;
            }
        }
        plan.extend([t0, c0, c1, t1].map(|x| x as i32));
    }
    plan
}

/// `[t0, c0, c1, t1]` clamped in this order into `0 <= t0 <= c0 <= c1 <= t1 <= full`, so the
/// key loops' trip counts are never negative and the verifier sees every block inside the
/// keys; values already in order are unchanged.
pub(super) fn in_order([t0, c0, c1, t1]: [UOp; 4], full: usize) -> [UOp; 4] {
    let full = idx(full as i64);
    let t0 = min_idx(&t0.maximum(idx(0)), &full);
    let t1 = min_idx(&t1.maximum(&t0), &full);
    let c0 = min_idx(&c0.maximum(&t0), &t1);
    let c1 = min_idx(&c1.maximum(&c0), &t1);
    [t0, c0, c1, t1]
}

impl SdpaKernel {
    /// A task's `[t0, c0, c1, t1]` read from the runtime plan `plan` (see [`PlanMode`]), put
    /// [`in_order`] again, so every loop bound is provably in range.
    pub(super) fn planned_blocks(
        &self,
        plan: &UOp,
        per_head: bool,
        task: &super::Task,
        full: usize,
    ) -> [UOp; 4] {
        let unit = if per_head {
            task.t.clone()
        } else {
            &task.item * self.c.n_q.div_ceil(self.b.queries) as i64 + &task.qblk
        };
        let at = |i: i64| plan.index(&unit * 4 + i).load().cast(DType::INDEX);
        in_order([at(0), at(1), at(2), at(3)], full)
    }
}

#[cfg(test)]
mod tests {
    use super::plan_from_counts;

    #[test]
    fn counts_give_the_seen_span_and_its_longest_whole_run() {
        // blocks of 4 pairs: none, part, whole, whole, part, whole, none
        let counts = [0.0, 2.0, 4.0, 4.0, 1.0, 4.0, 0.0];
        assert_eq!(plan_from_counts(&counts, 7, 4), [1, 2, 4, 6]);
        // nothing seen: an empty span
        assert_eq!(plan_from_counts(&[0.0; 3], 3, 4), [0, 0, 0, 0]);
        // no whole block: the run is empty at the span's end
        assert_eq!(plan_from_counts(&[1.0, 3.0, 0.0], 3, 4), [0, 2, 2, 2]);
    }
}
