//! Workloads written as programs, for the simulator's tests.

use super::{simulate, simulate_every_op, Config, Edit, Op, Workload};

pub const MIB: u64 = 1 << 20;

/// Ops written as a program: `alloc(size)` returns the request's id.
#[derive(Default)]
pub struct Program {
    pub ops: Vec<Op>,
    next: u32,
}

impl Program {
    pub fn alloc(&mut self, size: u64) -> u32 {
        let id = self.next;
        self.next += 1;
        self.ops.push(Op::Alloc { id, size, stream: 0, pool: 0, event: self.ops.len() as u32, stack: 1 });
        id
    }

    pub fn free(&mut self, id: u32) {
        self.ops.push(Op::Free { id, event: self.ops.len() as u32 });
    }
}

/// Asserts the simulation ends alike with and without skips; returns the ops skipped, and of them those passed over
/// as windows that give back all they take.
pub fn same_either_way(w: &Workload, cfg: Config) -> (u64, u64) {
    let mut fast = simulate(w, cfg.clone(), true);
    let slow = simulate_every_op(w, cfg, true, |_, _| Edit::Keep);
    let skipped = (fast.ops_skipped, fast.ops_passed_over);
    (fast.ops_skipped, fast.ops_passed_over, fast.pool_passes_stopped) = (0, 0, 0);
    assert_eq!(fast, slow);
    skipped
}
