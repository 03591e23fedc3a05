//! A wrapped trace's start, rebuilt by undoing it (`timeline::replay`): the index of block starts that the undo
//! builds where its walks are long must find what walking the chains finds.

use oomdoc::ingest::snapshot;
use oomdoc::timeline::replay::undo_with_index_agrees;

use crate::common;

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
