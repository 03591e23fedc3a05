//! A wrapped trace's forward pass on two cores (`timeline::replay`): the later part, replayed from the state the
//! undo found at the cut and joined to the first part's pass, must say what one pass says.

use oomdoc::ingest::snapshot;
use oomdoc::timeline::replay::{forward_cut_agrees, undo_with_index_agrees};

use crate::common;

#[test]
fn a_forward_pass_cut_in_two_says_what_one_pass_says() {
    // Every real snapshot whose trace must be undone to find its start (its ring buffer wrapped), cut at four places.
    let mut files = common::fixtures("fixtures/real", ".pickle");
    files.push("fixtures/real-gpu/kv-growth/snapshot.pickle".into());
    let (mut checked, mut joined) = (0, 0);
    for f in files {
        let Ok(snap) = snapshot::read(&common::read(&f)[..], None) else { continue };
        let tl = snap.timeline;
        for dev in &tl.devices {
            let n = dev.events.len();
            if n < 100 {
                continue;
            }
            for cut in [1, n / 3, n / 2, n - 1] {
                let Some((same, was_joined)) = forward_cut_agrees(dev, tl.settings.as_ref(), cut) else { break };
                assert!(same, "{f}: cut at {cut} of {n}");
                checked += 1;
                joined += was_joined as usize;
            }
        }
    }
    assert!(checked >= 20 && joined >= checked / 2, "{checked} cuts checked, {joined} joined");
}

#[test]
fn undoing_by_the_index_of_block_starts_rebuilds_what_walking_the_chains_does() {
    // The index is built only where walks are long (the wrapped bench trace); here it is forced from the first event
    // on every real trace that must be undone, and must land on the same state with the same anomalies.
    let mut files = common::fixtures("fixtures/real", ".pickle");
    for d in ["kv-growth", "leaked-references", "fragmentation", "ddp-no-sync", "ddp-without-no-sync"] {
        files.push(format!("fixtures/real-gpu/{d}/snapshot.pickle"));
    }
    let mut checked = 0;
    for f in files {
        let Ok(snap) = snapshot::read(&common::read(&f)[..], None) else { continue };
        for dev in &snap.timeline.devices {
            if let Some(same) = undo_with_index_agrees(dev, snap.timeline.settings.as_ref()) {
                assert!(same, "{f}: device {}", dev.device);
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "{checked} traces checked");
}
