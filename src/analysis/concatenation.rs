//! Objects grown by concatenation: `x = torch.cat([x, new])` makes the longer copy while the old one is live, then
//! lets the old one go. However many times it is re-made, it is one growing object: a KV cache, an accumulator of
//! predictions, a history kept by hand. Found from the allocations alone, whatever the frames are called.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::timeline::stacks::{StackId, EMPTY_STACK};
use crate::timeline::{Action, Event};

/// Whether a block of `old` bytes made at `born`, freed at event `freed`, was replaced by a copy of `new` bytes made
/// at `made`: made after it, let go within four events of the copy, and smaller by at most a fifth of the copy (a
/// few more tokens, not a size sweep that doubles).
fn replaced(old: u64, born: usize, freed: usize, new: u64, made: usize) -> bool {
    born < made && freed - made <= 4 && new > old && new <= old + old / 4
}

/// Stacks whose tensors grow by concatenation: each allocation is soon followed by the free of a smaller one the same
/// stack made (`x = torch.cat([x, new])`: the longer tensor, then the old one let go), in most of its allocations.
/// Such a stack holds one growing object however many times it is re-made — a cache the user wrote, a buffer grown
/// token by token — whatever its frames are called.
pub fn by_stack(events: &[Event], last: usize, eligible: &dyn Fn(usize) -> bool) -> FxHashSet<StackId> {
    let mut made: FxHashMap<u64, (StackId, u64, usize)> = FxHashMap::default();
    let mut counts: FxHashMap<StackId, (u32, u32)> = FxHashMap::default();
    // The last few allocations: (stack, size, event).
    let mut recent: [(StackId, u64, usize); 4] = [(EMPTY_STACK, 0, usize::MAX); 4];
    for (i, e) in events.iter().enumerate().take(last + 1) {
        match e.action {
            Action::Alloc if e.stack != EMPTY_STACK && eligible(i) => {
                made.insert(e.addr, (e.stack, e.size, i));
                counts.entry(e.stack).or_default().0 += 1;
                recent.rotate_right(1);
                recent[0] = (e.stack, e.size, i);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some((stack, size, born)) = made.remove(&e.addr) {
                    let copied = recent
                        .iter()
                        .any(|&(s, n, at)| s == stack && at != usize::MAX && replaced(size, born, i, n, at));
                    if copied {
                        counts.entry(stack).or_default().1 += 1;
                    }
                }
            }
            _ => {}
        }
    }
    counts.into_iter().filter(|&(_, (allocs, grew))| grew >= 8 && 2 * grew >= allocs).map(|(s, _)| s).collect()
}

/// The objects a trace with no frame at all re-made larger again and again: with no stack to group a line's
/// allocations, each copy is linked to the block it replaced.
#[derive(Debug, Default)]
pub struct Frameless {
    /// The allocating events of each object re-made at least eight times, in order.
    pub objects: Vec<Vec<usize>>,
}

impl Frameless {
    /// How many objects grew over the same stretch of the trace as the one re-made most, and to its size (within
    /// the most it grew in one step): a model's cache is a key and a value per layer, all of one shape, growing
    /// together; an accumulator is one, and two of them side by side (predictions and labels) differ in size.
    pub fn side_by_side(&self, events: &[Event]) -> usize {
        let Some(most) = self.objects.iter().max_by_key(|o| o.len()) else { return 0 };
        let (lo, hi) = (most[0], most[most.len() - 1]);
        let size = events[hi].size;
        let step = most.windows(2).map(|w| events[w[1]].size.saturating_sub(events[w[0]].size)).max().unwrap_or(0);
        self.objects
            .iter()
            .filter(|o| o[0] <= hi && o[o.len() - 1] >= lo && events[o[o.len() - 1]].size.abs_diff(size) <= step)
            .count()
    }

    /// Whether the objects are a model's cache: several of one size growing side by side.
    pub fn a_cache(&self, events: &[Event]) -> bool {
        self.side_by_side(events) >= 2
    }

    /// Whether the request at event `at` (an OOM's, rounded to 512 bytes) is the next copy of one of the objects:
    /// its last copy still live, the request a little larger (at most a quarter more).
    pub fn extended_by(&self, events: &[Event], at: usize) -> bool {
        self.objects.iter().any(|o| extends(events, o, at, events[at].size, |old| old + old / 4))
    }

    /// Every allocating event of the objects.
    pub fn events(&self) -> FxHashSet<usize> {
        self.objects.iter().flatten().copied().collect()
    }
}

/// In a trace that recorded no frame at all, the objects grown by concatenation up to its OOM (or its end), each
/// copy a few tokens longer than the last (at most a quarter more) and re-made at least eight times, as a decode
/// loop grows its cache; `None` where the trace has frames, whose stacks say what grew ([`by_stack`]).
pub fn of_frameless_trace(events: &[Event]) -> Option<Frameless> {
    let last = frameless_until(events)?;
    let mut grown = frameless(events, last, |old| old + old / 4);
    grown.objects.retain(|o| o.len() > 8);
    Some(grown)
}

/// In a trace that recorded no frame at all, the buffers a loop grew by concatenation before event `last`: each
/// copy up to twice the last (a batch's rows appended to what was kept: the first append doubles), three copies or
/// more, by steady steps (a sweep of sizes that doubles each time is no buffer growing).
pub fn frameless_buffers(events: &[Event]) -> Vec<Vec<usize>> {
    let Some(last) = frameless_until(events) else { return Vec::new() };
    let mut grown = frameless(events, last, |old| old * 2);
    grown.objects.retain(|o| {
        let steps: Vec<u64> = o.windows(2).map(|w| events[w[1]].size.saturating_sub(events[w[0]].size)).collect();
        let (lo, hi) = (steps.iter().min().copied().unwrap_or(0), steps.iter().max().copied().unwrap_or(0));
        o.len() >= 3 && hi <= 2 * lo
    });
    grown.objects
}

/// Whether a request of `requested` bytes before event `at` is the next copy of `object`: its last copy still live,
/// the request larger than it and at most `most(last)` (plus the allocator's 512-byte rounding of the request).
pub fn extends(events: &[Event], object: &[usize], at: usize, requested: u64, most: fn(u64) -> u64) -> bool {
    let last = &events[object[object.len() - 1]];
    let freed = events[object[object.len() - 1]..at]
        .iter()
        .any(|e| matches!(e.action, Action::FreeRequested | Action::FreeCompleted) && e.addr == last.addr);
    !freed && requested > last.size && requested <= most(last.size) + 512
}

/// The OOM's event (or the last) of a trace with no frame at all; `None` where it has frames or no event.
fn frameless_until(events: &[Event]) -> Option<usize> {
    if events.is_empty() || events.iter().any(|e| e.action == Action::Alloc && e.stack != EMPTY_STACK) {
        return None;
    }
    Some(events.iter().rposition(|e| e.action == Action::Oom).unwrap_or(events.len() - 1))
}

/// The objects re-made larger in events `..=last` of a trace that recorded no frame, each copy at most `most(old)`
/// bytes.
fn frameless(events: &[Event], last: usize, most: fn(u64) -> u64) -> Frameless {
    const NONE: u32 = u32::MAX;
    // Live blocks: (object, size, allocating event).
    let mut made: FxHashMap<u64, (u32, u64, usize)> = FxHashMap::default();
    let mut objects: Vec<Vec<usize>> = Vec::new();
    // The last few allocations: (address, size, event).
    let mut recent: [(u64, u64, usize); 4] = [(0, 0, usize::MAX); 4];
    for (i, e) in events.iter().enumerate().take(last + 1) {
        match e.action {
            Action::Alloc if e.stack == EMPTY_STACK => {
                made.insert(e.addr, (NONE, e.size, i));
                recent.rotate_right(1);
                recent[0] = (e.addr, e.size, i);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                let Some((object, size, born)) = made.remove(&e.addr) else { continue };
                // The copy: a recent allocation still live, not yet the copy of another block, made after this one
                // and let go of within four events of it.
                let copy = recent.iter().find(|&&(addr, n, at)| {
                    at != usize::MAX
                        && born < at
                        && i - at <= 4
                        && n > size
                        && n <= most(size)
                        && made.get(&addr).is_some_and(|m| m.0 == NONE && m.2 == at)
                });
                let Some(&(addr, _, at)) = copy else { continue };
                let object = if object == NONE {
                    objects.push(vec![born]);
                    objects.len() as u32 - 1
                } else {
                    object
                };
                objects[object as usize].push(at);
                if let Some(m) = made.get_mut(&addr) {
                    m.0 = object;
                }
            }
            _ => {}
        }
    }
    Frameless { objects }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors grown together from the sizes `firsts` by `step(size)` bytes, `copies` times each: each copy made,
    /// then the old one freed (`torch.cat`), with an unrelated temporary between steps.
    fn grown(firsts: &[u64], step: impl Fn(u64) -> u64, copies: u64) -> Vec<Event> {
        let mut v = Vec::new();
        let mut size: Vec<u64> = firsts.to_vec();
        let addr = |o: usize, k: u64| ((o as u64) << 32) | (k << 12);
        for (o, &first) in firsts.iter().enumerate() {
            v.push(Event::new(Action::Alloc, addr(o, 0), first));
        }
        for k in 1..copies {
            for (o, size) in size.iter_mut().enumerate() {
                let new = *size + step(*size);
                v.push(Event::new(Action::Alloc, addr(o, k), new));
                v.push(Event::new(Action::FreeRequested, addr(o, k - 1), *size));
                v.push(Event::new(Action::FreeCompleted, addr(o, k - 1), *size));
                *size = new;
            }
            v.push(Event::new(Action::Alloc, 1, 512));
            v.push(Event::new(Action::FreeCompleted, 1, 512));
        }
        v
    }

    #[test]
    fn objects_grown_side_by_side_are_a_cache_and_one_alone_is_not() {
        let layers = grown(&[1 << 20; 4], |_| 4096, 12);
        let cache = of_frameless_trace(&layers).expect("frameless");
        assert_eq!(cache.objects.len(), 4);
        assert!(cache.objects.iter().all(|o| o.len() == 12), "{:?}", cache.objects);
        assert!(cache.a_cache(&layers));
        let one = grown(&[1 << 20], |_| 4096, 12);
        let alone = of_frameless_trace(&one).expect("frameless");
        assert_eq!(alone.objects.len(), 1);
        assert!(!alone.a_cache(&one));
        // Two accumulators side by side, predictions and labels: not of one size, no cache.
        let two = grown(&[1 << 20, 1 << 14], |n| n / 16, 12);
        let accumulators = of_frameless_trace(&two).expect("frameless");
        assert_eq!(accumulators.objects.len(), 2);
        assert!(!accumulators.a_cache(&two));
        // Too few copies to be a cache.
        assert!(of_frameless_trace(&grown(&[1 << 20; 4], |_| 4096, 6)).unwrap().objects.is_empty());
    }

    #[test]
    fn a_buffer_appended_to_grows_by_steady_steps_and_a_doubling_sweep_does_not() {
        // A batch's rows appended each step: the first append doubles the buffer.
        let appended = grown(&[1 << 20], |_| 1 << 20, 5);
        assert_eq!(frameless_buffers(&appended).len(), 1);
        // Nor is it a cache: each copy is far more than a quarter larger.
        assert!(of_frameless_trace(&appended).unwrap().objects.is_empty());
        let sweep = grown(&[1 << 20], |n| n, 5);
        assert!(frameless_buffers(&sweep).is_empty());
        // With frames, the stacks say what grew.
        let mut framed = appended.clone();
        framed[0].stack = 1;
        assert!(of_frameless_trace(&framed).is_none() && frameless_buffers(&framed).is_empty());
    }
}
