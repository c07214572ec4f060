//! The data loader: packing, formats, shards, resumable positions, errors. No libtorch.

use loco_real::data::{
    DataError, DataLoader, DataPosition, DataSource, Order, Shard, Synthetic, write_token_file,
};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn genesis() -> DataSource {
    DataSource::File(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/genesis-kjv.txt")))
}

#[test]
fn text_is_packed_byte_by_byte() {
    let DataSource::File(path) = genesis() else { unreachable!() };
    let bytes = std::fs::read(&path).unwrap();
    let mut l = DataLoader::new(&genesis(), 64, 256, Shard::WHOLE, Order::Sequential).unwrap();
    assert_eq!(l.sequences(), (bytes.len() as u64 - 1) / 64);
    assert!(l.sequences() > 3000, "the shipped text is about 200 KB");
    let batch = l.next_batch(2).unwrap();
    assert_eq!(batch.len(), 130);
    let want: Vec<i64> = bytes[..65].iter().chain(&bytes[64..129]).map(|&b| i64::from(b)).collect();
    assert_eq!(batch, want);
    assert!(bytes.starts_with(b"Genesis 1\n"));
    assert_eq!(l.position(), DataPosition { epoch: 0, offset: 2 });
}

#[test]
fn binary_token_files_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["u16", "u32"] {
        let path = dir.path().join(format!("tokens.{ext}"));
        let tokens: Vec<u32> = (0..1000u32).map(|i| (i * 7919) % 50_000).collect();
        write_token_file(&path, &tokens).unwrap();
        let width = if ext == "u16" { 2 } else { 4 };
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1000 * width);
        let src = DataSource::File(path);
        let mut l = DataLoader::new(&src, 10, 50_000, Shard::WHOLE, Order::Sequential).unwrap();
        assert_eq!(l.sequences(), 99);
        for k in 0..99usize {
            let mut row = Vec::new();
            l.next_sequence_into(&mut row).unwrap();
            let want: Vec<i64> =
                tokens[k * 10..k * 10 + 11].iter().map(|&t| i64::from(t)).collect();
            assert_eq!(row, want, "{ext} sequence {k}");
        }
        // The epoch wraps around to the first sequence.
        assert_eq!(l.position(), DataPosition { epoch: 1, offset: 0 });
        assert_eq!(l.next_batch(1).unwrap()[..3], [0, 7919, 15838]);
    }
    // A token that does not fit u16 is refused before anything is written.
    let path = dir.path().join("wide.u16");
    let err = write_token_file(&path, &[1, 70_000]).unwrap_err();
    assert!(matches!(err, DataError::TokenTooWide { token: 70_000, width: 2, .. }), "{err}");
    assert!(!path.exists());
}

#[test]
fn bad_files_name_the_file_and_what_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.u16");
    std::fs::write(&odd, [1u8, 2, 3]).unwrap();
    let err =
        DataLoader::new(&DataSource::File(odd.clone()), 4, 256, Shard::WHOLE, Order::Sequential)
            .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::BadLength { bytes: 3, width: 2, .. }));
    assert!(msg.contains("odd.u16") && msg.contains("little-endian u16"), "{msg}");

    let short = dir.path().join("short.txt");
    std::fs::write(&short, b"abc").unwrap();
    let err = DataLoader::new(&DataSource::File(short), 4, 256, Shard::WHOLE, Order::Sequential)
        .unwrap_err();
    assert!(matches!(err, DataError::TooShort { tokens: 3, needed: 5, .. }), "{err}");

    let big = dir.path().join("big.u16");
    write_token_file(&big, &[1, 2, 3, 4, 5, 6, 300, 7, 8]).unwrap();
    let mut l =
        DataLoader::new(&DataSource::File(big), 4, 256, Shard::WHOLE, Order::Sequential).unwrap();
    l.next_batch(1).unwrap();
    let err = l.next_batch(1).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::TokenOutOfRange { offset: 6, token: 300, vocab: 256, .. }));
    assert!(msg.contains("big.u16") && msg.contains("expected < 256"), "{msg}");
    // The failed sequence was not consumed.
    assert_eq!(l.position(), DataPosition { epoch: 0, offset: 1 });

    let missing = dir.path().join("missing.txt");
    let err = DataLoader::new(&DataSource::File(missing), 4, 256, Shard::WHOLE, Order::Sequential)
        .unwrap_err();
    assert!(matches!(err, DataError::Open { .. }) && err.to_string().contains("missing.txt"));
}

/// The sequence indices a shard reads in epochs `0..epochs`, by epoch.
fn indices(l: &mut DataLoader, epochs: u64) -> Vec<Vec<u64>> {
    (0..epochs)
        .map(|epoch| {
            (0..l.per_epoch())
                .map(|offset| l.sequence_index(DataPosition { epoch, offset }))
                .collect()
        })
        .collect()
}

#[test]
fn shards_are_disjoint_and_cover_the_data() {
    for order in [Order::Sequential, Order::Shuffled { seed: 5 }] {
        let count = 3;
        let mut whole = DataLoader::new(&genesis(), 64, 256, Shard::WHOLE, order).unwrap();
        let n = whole.sequences();
        let mut per_epoch: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); 2];
        let mut total = 0;
        for index in 0..count {
            let shard = Shard::new(index, count).unwrap();
            let mut l = DataLoader::new(&genesis(), 64, 256, shard, order).unwrap();
            total += l.per_epoch();
            for (epoch, idx) in indices(&mut l, 2).into_iter().enumerate() {
                for k in idx {
                    assert!(per_epoch[epoch].insert(k), "{order:?}: sequence {k} read twice");
                }
            }
            // What a shard reads is the whole data's sequences at those indices.
            let first = l.sequence_index(DataPosition::default());
            let row = l.next_batch(1).unwrap();
            let mut w =
                DataLoader::new(&genesis(), 64, 256, Shard::WHOLE, Order::Sequential).unwrap();
            w.seek(DataPosition { epoch: 0, offset: first }).unwrap();
            assert_eq!(row, w.next_batch(1).unwrap());
        }
        assert_eq!(total, n);
        for set in &per_epoch {
            assert_eq!(set.len() as u64, n, "{order:?}: every sequence once per epoch");
        }
        let e = indices(&mut whole, 2);
        if let Order::Shuffled { .. } = order {
            assert_ne!(e[0], e[1], "a new order every epoch");
            assert_ne!(e[0], (0..n).collect::<Vec<_>>());
        } else {
            assert_eq!(e[0], (0..n).collect::<Vec<_>>());
        }
    }
}

#[test]
fn positions_resume_exactly() {
    for order in [Order::Sequential, Order::Shuffled { seed: 11 }] {
        let src = DataSource::Synthetic(Synthetic { seed: 3, sequences: 50 });
        let shard = Shard::new(1, 4).unwrap();
        let mut a = DataLoader::new(&src, 16, 100, shard, order).unwrap();
        assert_eq!(a.per_epoch(), 13);
        // Three batches of 5 rows cross the end of the first epoch.
        a.next_batch(5).unwrap();
        let saved = a.position();
        let json = serde_json::to_string(&saved).unwrap();
        let rest: Vec<_> = (0..4).map(|_| a.next_batch(5).unwrap()).collect();
        assert_eq!(a.position(), DataPosition { epoch: 1, offset: 12 });

        let mut b = DataLoader::new(&src, 16, 100, shard, order).unwrap();
        b.seek(serde_json::from_str(&json).unwrap()).unwrap();
        let again: Vec<_> = (0..4).map(|_| b.next_batch(5).unwrap()).collect();
        assert_eq!(rest, again, "{order:?}");
        assert_eq!(a.position(), b.position());
        let err = b.seek(DataPosition { epoch: 0, offset: 13 }).unwrap_err();
        assert!(matches!(err, DataError::BadPosition { per_epoch: 13, .. }), "{err}");
    }
}

#[test]
fn synthetic_data_is_seeded_and_in_range() {
    let src = |seed| DataSource::Synthetic(Synthetic { seed, sequences: 64 });
    let batch = |seed| {
        DataLoader::new(&src(seed), 32, 1000, Shard::WHOLE, Order::Sequential)
            .unwrap()
            .next_batch(8)
            .unwrap()
    };
    let a = batch(1);
    assert_eq!(a, batch(1));
    assert_ne!(a, batch(2));
    assert_eq!(a.len(), 8 * 33);
    assert!(a.iter().all(|&t| (0..1000).contains(&t)));
    // A Markov chain with four successors per token: many repeated bigrams, unlike noise.
    let bigrams: BTreeSet<(i64, i64)> =
        a.chunks(33).flat_map(|r| r.windows(2).map(|w| (w[0], w[1]))).collect();
    assert!(bigrams.len() < 8 * 32, "{}", bigrams.len());
}

#[test]
fn shard_errors() {
    assert!(matches!(Shard::new(3, 3), Err(DataError::BadShard { index: 3, count: 3 })));
    let src = DataSource::Synthetic(Synthetic { seed: 1, sequences: 2 });
    let err =
        DataLoader::new(&src, 8, 10, Shard { index: 2, count: 3 }, Order::Sequential).unwrap_err();
    assert!(matches!(err, DataError::EmptyShard { index: 2, count: 3, sequences: 2 }), "{err}");
    let err = DataLoader::new(&src, 0, 10, Shard::WHOLE, Order::Sequential).unwrap_err();
    assert!(err.to_string().contains("seq_len = 0"), "{err}");
}

#[test]
fn scenario_sources() {
    let dir = std::path::Path::new("/scenarios");
    assert_eq!(
        DataSource::from_scenario(Some("../data/a.txt"), dir, 1),
        DataSource::File(PathBuf::from("/scenarios/../data/a.txt"))
    );
    assert_eq!(
        DataSource::from_scenario(Some("/abs/b.u16"), dir, 1),
        DataSource::File(PathBuf::from("/abs/b.u16"))
    );
    assert_eq!(
        DataSource::from_scenario(None, dir, 9),
        DataSource::Synthetic(Synthetic { seed: 9, sequences: DataSource::SYNTHETIC_SEQUENCES })
    );
}
