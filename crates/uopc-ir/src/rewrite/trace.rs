//! How often each rule fired: per run ([`RewriteStats`]), summed per thread, and printed when
//! the trace is on.

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// How often one rule fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleHits {
    /// The rule's table.
    pub table: &'static str,
    /// The rule.
    pub rule: &'static str,
    /// Replacements it made.
    pub count: u64,
}

/// How often each rule of a pass fired (rules that never fired are left out): for one run in
/// table and rule order; summed over runs ([`rewrite_counts`]) in the order rules first fired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RewriteStats {
    /// The pass's name.
    pub pass: &'static str,
    /// Per rule that fired, its count.
    pub hits: Vec<RuleHits>,
}

impl RewriteStats {
    /// Replacements made by the rule called `rule` (in any table).
    pub fn count(&self, rule: &str) -> u64 {
        self.hits.iter().filter(|h| h.rule == rule).map(|h| h.count).sum()
    }

    /// Replacements made by all rules.
    pub fn total(&self) -> u64 {
        self.hits.iter().map(|h| h.count).sum()
    }

    fn add(&mut self, other: &RewriteStats) {
        for h in &other.hits {
            match self.hits.iter_mut().find(|x| x.table == h.table && x.rule == h.rule) {
                Some(x) => x.count += h.count,
                None => self.hits.push(h.clone()),
            }
        }
    }
}

impl fmt::Display for RewriteStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rewrite {}:", self.pass)?;
        for h in &self.hits {
            write!(f, " {}/{}={}", h.table, h.rule, h.count)?;
        }
        Ok(())
    }
}

static TRACE: AtomicBool = AtomicBool::new(false);

thread_local! {
    static COUNTS: RefCell<Vec<RewriteStats>> = const { RefCell::new(Vec::new()) };
}

/// Turns printing on or off: while on, every pass run that fired a rule prints its
/// [`RewriteStats`] to stderr (process-wide).
pub fn set_rewrite_trace(on: bool) {
    TRACE.store(on, Ordering::Relaxed);
}

/// Whether [`set_rewrite_trace`] turned printing on.
pub fn rewrite_trace() -> bool {
    TRACE.load(Ordering::Relaxed)
}

/// The rule counts of every pass run on this thread since the last [`take_rewrite_counts`],
/// one entry per pass name, in the order the passes first ran.
pub fn rewrite_counts() -> Vec<RewriteStats> {
    COUNTS.with(|c| c.borrow().clone())
}

/// [`rewrite_counts`], resetting them to nothing.
pub fn take_rewrite_counts() -> Vec<RewriteStats> {
    COUNTS.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

pub(super) fn record(stats: &RewriteStats) {
    if stats.hits.is_empty() {
        return;
    }
    if rewrite_trace() {
        eprintln!("{stats}");
    }
    COUNTS.with(|c| {
        let mut c = c.borrow_mut();
        match c.iter_mut().find(|s| s.pass == stats.pass) {
            Some(s) => s.add(stats),
            None => c.push(stats.clone()),
        }
    });
}
