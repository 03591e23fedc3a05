//! A wrapped trace's start, rebuilt by undoing it (`timeline::replay`): the index of block starts that the undo
//! builds where its walks are long must find what walking the chains finds, and the start read off each address's
//! first event, which the replay takes where it holds, must be the undo's.

use oomdoc::ingest::snapshot;
use oomdoc::timeline::replay::{start_by_first_events_agrees, undo_with_index_agrees};

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

#[test]
fn the_start_read_off_each_address_first_event_is_the_one_the_whole_undo_rebuilds() {
    // The replay takes the start its first events give wherever a forward pass from it meets no anomaly and ends at
    // the file's state; on every real trace that must be rebuilt, that start must be the whole undo's, and the traces
    // whose start it cannot give (anomalies, an end elsewhere) must be refused, not guessed.
    let mut files = common::fixtures("fixtures/real", ".pickle");
    for d in ["kv-growth", "leaked-references", "fragmentation", "ddp-no-sync", "ddp-without-no-sync"] {
        files.push(format!("fixtures/real-gpu/{d}/snapshot.pickle"));
    }
    let (mut taken, mut refused) = (0, 0);
    for f in files {
        let Ok(snap) = snapshot::read(&common::read(&f)[..], None) else { continue };
        for dev in &snap.timeline.devices {
            if let Some((same, accepted)) = start_by_first_events_agrees(dev, snap.timeline.settings.as_ref()) {
                if accepted {
                    assert!(same, "{f}: device {}: the start taken is not the undo's", dev.device);
                    taken += 1;
                } else {
                    refused += 1;
                }
            }
        }
    }
    assert!(taken >= 15 && refused >= 2, "{taken} starts taken, {refused} refused");
}
