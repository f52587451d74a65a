//! Whether the operations on one register (one settings key) are linearizable: a Wing–Gong search
//! with Lowe's memoisation of (operations taken, value) states, bounded in the states it explores.
//! Pure: operations in, a verdict out. Keys are independent (P-compositionality), so the checker
//! calls this once per key.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::history::{OpId, Tick};

/// What one operation did to the register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Set the register to this value (values are unique per write).
    Write(String),
    /// Answered with this value (`None`: the key was not set).
    Read(Option<String>),
}

/// One operation: invoked at `invoked`, answered at `done`. `done: None` is a write whose outcome
/// is unknown: it may take effect at any point after its invocation, or never.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterOp {
    pub op: OpId,
    pub invoked: Tick,
    pub done: Option<Tick>,
    pub kind: Kind,
    /// How a failure message names it ("read via replica 2, answered by 1").
    pub about: String,
}

/// Where the search stopped when no order fits: the most operations it could take in a row, the
/// value they left, and the operation that had to come next but cannot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck {
    pub taken: usize,
    pub of: usize,
    pub value: Option<String>,
    /// The last write taken before it (the one that left `value`), if any.
    pub written_by: Option<OpId>,
    /// The one that must be next (the earliest answered one left) and cannot be.
    pub blocked: RegisterOp,
}

/// The search's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order of the operations fits their real-time order and the register's meaning.
    Not(Stuck),
    /// The search explored `states` states (its limit) without an answer: neither passed nor failed.
    Undecided {
        states: u64,
    },
}

/// Searches for a linearization of `ops` on a register that starts with one of `initial` (more than
/// one after a restore from a backup whose value is not known exactly), exploring at most
/// `states_max` states.
pub fn check(ops: &[RegisterOp], initial: &[Option<String>], states_max: u64) -> Verdict {
    if initial.is_empty() {
        return check(ops, &[None], states_max);
    }
    // A write of unknown outcome whose value nobody read changes nothing anyone saw: it can be
    // put after everything (or never), so leaving it out decides the same and saves 2^n orders.
    let read: BTreeSet<Option<String>> = ops
        .iter()
        .filter_map(|o| match &o.kind {
            Kind::Read(v) => Some(v.clone()),
            Kind::Write(_) => None,
        })
        .collect();
    let mut ops: Vec<RegisterOp> = ops
        .iter()
        .filter(|o| match &o.kind {
            Kind::Write(v) => o.done.is_some() || read.contains(&Some(v.clone())),
            Kind::Read(_) => true,
        })
        .cloned()
        .collect();
    ops.sort_by_key(|o| o.invoked);
    let mut values: BTreeMap<Option<String>, usize> = BTreeMap::new();
    let mut intern = |v: &Option<String>| {
        let n = values.len();
        *values.entry(v.clone()).or_insert(n)
    };
    let effect: Vec<(bool, usize)> = ops
        .iter()
        .map(|o| match &o.kind {
            Kind::Write(v) => (true, intern(&Some(v.clone()))),
            Kind::Read(v) => (false, intern(v)),
        })
        .collect();
    let starts: Vec<usize> = initial.iter().map(&mut intern).collect();
    let names: BTreeMap<usize, Option<String>> =
        values.iter().map(|(v, n)| (*n, v.clone())).collect();
    let mut search = Search {
        ops: &ops,
        effect: &effect,
        seen: HashSet::new(),
        states: 0,
        states_max,
        deepest: None,
    };
    for start in starts {
        match search.from(start) {
            Found::Yes => return Verdict::Linearizable,
            Found::Limit => {
                return Verdict::Undecided {
                    states: search.states,
                };
            }
            Found::No => {}
        }
    }
    let deepest = search.deepest.unwrap_or(Deepest {
        taken: 0,
        value: 0,
        written_by: None,
        blocked: 0,
    });
    Verdict::Not(Stuck {
        taken: deepest.taken,
        of: ops.len(),
        value: names.get(&deepest.value).cloned().flatten(),
        written_by: deepest.written_by.map(|i| ops[i].op),
        blocked: ops[deepest.blocked].clone(),
    })
}

enum Found {
    Yes,
    No,
    Limit,
}

#[derive(Clone, Copy)]
struct Deepest {
    taken: usize,
    value: usize,
    written_by: Option<usize>,
    blocked: usize,
}

struct Search<'a> {
    ops: &'a [RegisterOp],
    effect: &'a [(bool, usize)],
    seen: HashSet<(Vec<u64>, usize)>,
    states: u64,
    states_max: u64,
    deepest: Option<Deepest>,
}

/// One state on the explicit stack: the operations taken, the value, the last write taken, and the
/// candidates still to try from it.
struct Frame {
    taken: Vec<u64>,
    count: usize,
    value: usize,
    written_by: Option<usize>,
    candidates: Vec<usize>,
}

fn is_taken(taken: &[u64], i: usize) -> bool {
    taken[i / 64] & (1 << (i % 64)) != 0
}

impl Search<'_> {
    /// Depth-first from the empty set with the register at `start`.
    fn from(&mut self, start: usize) -> Found {
        let words = self.ops.len().div_ceil(64).max(1);
        let root = vec![0u64; words];
        if self.done(&root) {
            return Found::Yes;
        }
        let Some(frame) = self.enter(root, 0, start, None) else {
            return Found::No;
        };
        let mut stack = vec![frame];
        while let Some(top) = stack.last_mut() {
            let Some(i) = top.candidates.pop() else {
                stack.pop();
                continue;
            };
            let (is_write, v) = self.effect[i];
            if !is_write && v != top.value {
                continue;
            }
            let mut taken = top.taken.clone();
            taken[i / 64] |= 1 << (i % 64);
            let count = top.count + 1;
            let (value, written_by) = if is_write {
                (v, Some(i))
            } else {
                (top.value, top.written_by)
            };
            if self.done(&taken) {
                return Found::Yes;
            }
            if !self.seen.insert((taken.clone(), value)) {
                continue;
            }
            self.states += 1;
            if self.states >= self.states_max {
                return Found::Limit;
            }
            if let Some(frame) = self.enter(taken, count, value, written_by) {
                stack.push(frame);
            }
        }
        Found::No
    }

    /// Every answered operation is taken: what is left are writes of unknown outcome, which can
    /// take effect after everything else (no read follows them) or never.
    fn done(&self, taken: &[u64]) -> bool {
        (0..self.ops.len()).all(|i| is_taken(taken, i) || self.ops[i].done.is_none())
    }

    /// The frame of a state, with its candidates: the operations not taken that were invoked
    /// before the earliest answer among those not taken (any of them may take effect first).
    /// `None` when every answered operation is taken.
    fn enter(
        &mut self,
        taken: Vec<u64>,
        count: usize,
        value: usize,
        written_by: Option<usize>,
    ) -> Option<Frame> {
        let mut first_done: Option<(Tick, usize)> = None;
        for (i, o) in self.ops.iter().enumerate() {
            if is_taken(&taken, i) {
                continue;
            }
            if let Some(d) = o.done
                && first_done.is_none_or(|(f, _)| d < f)
            {
                first_done = Some((d, i));
            }
        }
        let (limit, blocked) = first_done?;
        let mut candidates = Vec::new();
        for (i, o) in self.ops.iter().enumerate() {
            if o.invoked >= limit {
                break;
            }
            if !is_taken(&taken, i) {
                candidates.push(i);
            }
        }
        // Tried last-first: the earliest invoked first.
        candidates.reverse();
        if self.deepest.is_none_or(|d| count > d.taken) {
            self.deepest = Some(Deepest {
                taken: count,
                value,
                written_by,
                blocked,
            });
        }
        Some(Frame {
            taken,
            count,
            value,
            written_by,
            candidates,
        })
    }
}
