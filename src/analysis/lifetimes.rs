//! What each allocation of a trace that recorded no frame at all (`context=None`) is, read from when it was made
//! and how long it lived. With no stack, what a block *is* must come from the program's shape, which the trace
//! still holds:
//!
//! - where the loop's passes are found (see [`super::iterations`]), what was made before the first pass and kept is
//!   the model (and what the first pass made and kept: gradients and optimizer state where it trains); what a pass
//!   makes and lets go of, even passes later, or what the pass running at the end made, is working memory (its
//!   activations); what pass after pass makes and never lets go of is held from step to step (a leak): several per
//!   pass are the pass's saved tensors, kept by a reference to its graph; one made as a copy of a tensor the pass
//!   let go of at once (`.clone()`, `.float()`) is the program's own. What a later pass made once and kept is left
//!   unsaid;
//! - where no pass completed (the first one ran out), the trace is read in phases, and only at its OOM: runs of
//!   allocations whose sizes the rest of the trace never makes. The model is the blocks from before the trace, or
//!   else the first phase of several allocations that the trace kept; what the trace kept of the model's sizes are
//!   its copies (gradients, optimizer moments); the rest is the pass that ran out. Without a model found so, or
//!   without an OOM, nothing says which blocks were working memory.
//!
//! Real captures stripped of their frames (`bench/attribution.py --variants none`) are the check that this holds
//! beyond the generator it was first built on.

use rustc_hash::{FxHashMap, FxHashSet};

use super::iterations::Iterations;
use crate::timeline::stacks::EMPTY_STACK;
use crate::timeline::{Action, Event};

/// What a frameless allocation was to the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Made before the loop's passes, or once by the first of them, and kept: the model and its state.
    BuiltFirst,
    /// Made by a pass and let go of (within it or passes later), or made by the pass that was running at the end.
    Transient,
    /// Kept from pass to pass, with others of its pass: a graph held by a reference to its output.
    KeptWithItsPass,
    /// Kept from pass to pass, the one tensor its pass keeps: the pass's output.
    OutputKept,
    /// Kept from pass to pass, made as a copy of a tensor of its size that the pass let go of right after.
    CopyKept,
}

impl Role {
    /// Whether the loop kept it from pass to pass (a leak).
    pub fn kept_from_pass_to_pass(self) -> bool {
        matches!(self, Role::KeptWithItsPass | Role::OutputKept | Role::CopyKept)
    }
}

/// The role of every allocating event of a frameless trace, by event index (`None` for other events).
pub struct Roles {
    by_event: Vec<Option<Role>>,
    /// Per allocating event, the event that freed its block (see [`frees`]).
    freed: Vec<usize>,
}

impl Roles {
    pub fn of(&self, event: usize) -> Option<Role> {
        self.by_event.get(event).copied().flatten()
    }

    /// Whether the block the allocation at `event` made is still live at the trace's end.
    pub fn live_at_end(&self, event: usize) -> bool {
        self.freed.get(event) == Some(&usize::MAX)
    }
}

/// The roles of a trace with no frame, its passes `iterations` where found; `model` holds the sizes of the blocks
/// live from before the trace began (a wrapped or late history: the model is among them). `None` where the trace
/// has frames or no allocation.
pub fn of_frameless_trace(events: &[Event], iterations: Option<&Iterations>, model: &FxHashSet<u64>) -> Option<Roles> {
    if !events.iter().any(|e| e.action == Action::Alloc)
        || events.iter().any(|e| e.action == Action::Alloc && e.stack != EMPTY_STACK)
    {
        return None;
    }
    let mut by_event = vec![None; events.len()];
    let freed = frees(events);
    match iterations.filter(|it| it.ends.len() >= 2) {
        Some(it) => by_pass(events, &it.ends, &freed, &mut by_event),
        None => by_phase(events, model, &freed, &mut by_event),
    }
    Some(Roles { by_event, freed })
}

/// Per allocating event, the event that freed its block (`usize::MAX` where none did, and for other events).
fn frees(events: &[Event]) -> Vec<usize> {
    let mut freed = vec![usize::MAX; events.len()];
    let mut live: FxHashMap<u64, usize> = FxHashMap::default();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, i);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(a) = live.remove(&e.addr) {
                    freed[a] = i;
                }
            }
            _ => {}
        }
    }
    freed
}

fn by_pass(events: &[Event], ends: &[usize], freed: &[usize], by_event: &mut [Option<Role>]) {
    // The pass an event belongs to: 0 up to the first end, `ends.len()` after the last (the pass running at the end).
    let pass_of = |i: usize| ends.partition_point(|&e| e < i);
    let mut spans: Vec<usize> = ends.windows(2).map(|w| w[1] - w[0]).collect();
    spans.sort_unstable();
    let first_start = (ends[0] + 1).saturating_sub(spans[spans.len() / 2]);
    // Kept: never let go of, though whole passes followed its own. Counted per pass to tell a loop that keeps
    // something every pass (a leak) from one whose state was made once. A tensor carried into a later pass and let
    // go of there (the last step's output, a buffer used in turn) is working memory, not kept.
    let kept = |i: usize| freed[i] == usize::MAX && pass_of(i) + 1 < ends.len();
    let mut kept_per_pass = vec![0u32; ends.len()];
    for (i, e) in events.iter().enumerate() {
        if e.action == Action::Alloc && i >= first_start && pass_of(i) < ends.len() && kept(i) {
            kept_per_pass[pass_of(i)] += 1;
        }
    }
    // The passes judged: all whole ones but the last, whose kept tensors the end of the trace cannot tell from those
    // it would have let go of in the next pass.
    let judged = &kept_per_pass[..ends.len() - 1];
    let keeping = judged.iter().filter(|&&n| n > 0).count();
    let leaks = 2 * keeping >= judged.len() && keeping >= 2;
    let mut counts: Vec<u32> = judged.to_vec();
    counts.sort_unstable();
    let several = counts[counts.len() / 2] >= 2;
    for (i, e) in events.iter().enumerate() {
        if e.action != Action::Alloc {
            continue;
        }
        let p = pass_of(i);
        let role = if i < first_start {
            if freed[i] == usize::MAX {
                Role::BuiltFirst
            } else {
                Role::Transient
            }
        } else if p >= ends.len() {
            Role::Transient
        } else if leaks && (kept(i) || p + 1 == ends.len() && freed[i] == usize::MAX) {
            if copy_of_one_let_go(events, i) {
                Role::CopyKept
            } else if several {
                Role::KeptWithItsPass
            } else {
                Role::OutputKept
            }
        } else if !leaks && kept(i) {
            // Made once and kept: by the first pass, the state a first step makes (gradients, optimizer moments);
            // by a later one, nothing in the trace says what.
            if p > 0 {
                continue;
            }
            Role::BuiltFirst
        } else {
            Role::Transient
        };
        by_event[i] = Some(role);
    }
}

/// Whether the allocation at `i` copied a tensor of its size: the next allocation or free after it lets go of a
/// block of the same size.
fn copy_of_one_let_go(events: &[Event], i: usize) -> bool {
    let next = events[i + 1..]
        .iter()
        .find(|e| matches!(e.action, Action::Alloc | Action::FreeRequested | Action::FreeCompleted));
    next.is_some_and(|e| e.action != Action::Alloc && e.size == events[i].size && e.addr != events[i].addr)
}

/// A trace whose first pass ran out (no pass completed): read only at an OOM, whose pass is what the trace ends
/// in. A trace with neither passes nor an OOM says nothing of which of its blocks are working memory.
fn by_phase(events: &[Event], model: &FxHashSet<u64>, freed: &[usize], by_event: &mut [Option<Role>]) {
    if !events.iter().any(|e| e.action == Action::Oom) {
        return;
    }
    let allocs: Vec<usize> = (0..events.len()).filter(|&i| events[i].action == Action::Alloc).collect();
    // The model: blocks from before the trace, or what the first phase of several allocations made.
    let mut built_until = 0;
    if model.is_empty() {
        let mut last_of: FxHashMap<u64, usize> = FxHashMap::default();
        for (k, &i) in allocs.iter().enumerate() {
            last_of.insert(events[i].size, k);
        }
        // A phase ends at `k` where no size made before `k` is made again after it. The model is kept: a phase
        // the trace let go of (a warm-up, tensors made and dropped) is not it.
        let (mut start, mut reach) = (0, 0);
        for (k, &i) in allocs.iter().enumerate() {
            reach = reach.max(last_of[&events[i].size]);
            if reach == k {
                let kept = allocs[start..=k].iter().all(|&a| freed[a] == usize::MAX);
                if k > start && k + 1 < allocs.len() && kept {
                    built_until = k + 1;
                    break;
                }
                start = k + 1;
            }
        }
        if built_until == 0 {
            // Neither blocks from before the trace nor a phase kept: nothing says where the model ends.
            return;
        }
    }
    let mut sizes: FxHashSet<u64> = model.clone();
    sizes.extend(allocs[..built_until].iter().map(|&i| events[i].size));
    for (k, &i) in allocs.iter().enumerate() {
        // Kept, of a size the model has: a copy of its weights (a gradient, an optimizer moment), read as they are.
        let copy = freed[i] == usize::MAX && sizes.contains(&events[i].size);
        by_event[i] = Some(if k < built_until || copy { Role::BuiltFirst } else { Role::Transient });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::iterations::Source;

    /// A trace of the given (action, address, size) triples, frameless.
    fn trace(items: &[(Action, u64, u64)]) -> Vec<Event> {
        items.iter().map(|&(a, addr, size)| Event::new(a, addr, size)).collect()
    }

    /// A model of three weights, then `passes` passes: each makes three temporaries and lets them go, and keeps
    /// `keep` tensors (each a copy of a temporary where `copies`).
    fn looped(passes: u64, keep: u64, copies: bool) -> (Vec<Event>, Vec<usize>) {
        let mut items = vec![(Action::Alloc, 1, 4096), (Action::Alloc, 2, 4096), (Action::Alloc, 3, 64)];
        let mut ends = Vec::new();
        for p in 0..passes {
            let base = 1000 + p * 100;
            for t in 0..3 {
                items.push((Action::Alloc, base + t, 512 * (t + 1)));
            }
            for k in 0..keep {
                let addr = base + 50 + k;
                if copies {
                    items.push((Action::Alloc, addr, 512 * 3));
                } else {
                    items.push((Action::Alloc, addr, 7 * 512 + k));
                }
            }
            for t in 0..3 {
                items.push((Action::FreeRequested, base + 2 - t, 512 * (3 - t)));
            }
            ends.push(items.len() - 1);
        }
        (trace(&items), ends)
    }

    #[test]
    fn a_loop_reads_as_model_working_memory_and_what_each_pass_keeps() {
        let roles_of = |events: &[Event], ends: Vec<usize>| {
            let it = Iterations { ends, source: Source::RepeatingSizes };
            let roles = of_frameless_trace(events, Some(&it), &FxHashSet::default()).expect("frameless");
            events.iter().enumerate().filter_map(|(i, _)| roles.of(i)).collect::<Vec<_>>()
        };
        let (healthy, ends) = looped(6, 0, false);
        let r = roles_of(&healthy, ends);
        assert_eq!(&r[..3], &[Role::BuiltFirst; 3]);
        assert!(r[3..].iter().all(|&x| x == Role::Transient));

        let (one, ends) = looped(6, 1, false);
        let r = roles_of(&one, ends);
        assert_eq!(r.iter().filter(|&&x| x == Role::OutputKept).count(), 6, "{r:?}");

        let (graph, ends) = looped(6, 3, false);
        let r = roles_of(&graph, ends);
        assert_eq!(r.iter().filter(|&&x| x == Role::KeptWithItsPass).count(), 18, "{r:?}");

        let (copied, ends) = looped(6, 1, true);
        let r = roles_of(&copied, ends);
        assert_eq!(r.iter().filter(|&&x| x == Role::CopyKept).count(), 6, "{r:?}");
    }

    #[test]
    fn a_first_pass_that_ran_out_reads_in_phases() {
        let none = FxHashSet::default();
        // One lone allocation, the model (two sizes repeated), the batch, then the pass (sizes repeated per layer).
        let mut items = vec![(Action::Alloc, 1, 512)];
        for l in 0..4 {
            items.push((Action::Alloc, 10 + 2 * l, 8192));
            items.push((Action::Alloc, 11 + 2 * l, 1024));
        }
        let model_end = items.len();
        items.push((Action::Alloc, 30, 2048));
        for l in 0..4 {
            items.push((Action::Alloc, 40 + 2 * l, 4096));
            items.push((Action::Alloc, 41 + 2 * l, 16384));
        }
        // Without an OOM the trace says nothing of which blocks are working memory.
        let events = trace(&items);
        assert!((0..events.len()).all(|i| of_frameless_trace(&events, None, &none).unwrap().of(i).is_none()));
        items.push((Action::Oom, 0, 65536));
        let events = trace(&items);
        let roles = of_frameless_trace(&events, None, &none).unwrap();
        let r: Vec<Role> = (0..events.len()).filter_map(|i| roles.of(i)).collect();
        assert_eq!(r.iter().filter(|&&x| x == Role::BuiltFirst).count(), 9, "{r:?}");
        assert!(r[9..].iter().all(|&x| x == Role::Transient));
        // With blocks from before the trace live, the model is among them: the trace made the pass, and what it
        // kept of the model's sizes (a gradient, an optimizer moment) is read as the model's.
        let mut pass = items[model_end..].to_vec();
        pass.insert(3, (Action::Alloc, 99, 8192));
        let events = trace(&pass);
        let model: FxHashSet<u64> = [8192, 1024].into_iter().collect();
        let roles = of_frameless_trace(&events, None, &model).unwrap();
        let r: Vec<(u64, Role)> = (0..events.len()).filter_map(|i| roles.of(i).map(|x| (events[i].size, x))).collect();
        assert!(r.iter().all(|&(size, x)| (x == Role::BuiltFirst) == (size == 8192)), "{r:?}");
        // A trace with frames is read by its stacks.
        let mut framed = events.clone();
        framed[0].stack = 1;
        assert!(of_frameless_trace(&framed, None, &none).is_none());
    }
}
