use super::*;
use crate::node::state::{encoded_len, virtual_part_lens};

fn share(sends_own: bool) -> Share {
    Share { index: u64::from(!sends_own), of: 2, sends_own }
}

#[test]
fn prepared_bytes_count_the_whole_replicated_part_and_the_own_part_if_sent() {
    let shared = || SharedState::new(3, vec![1.0; 100], vec![0.5; 100]).unwrap();
    let job = |own| StateJob::real(Epoch(1), NodeId(9), share(own), PieceRule::Clamped, shared());
    // Real bytes: the encoded replicated part, whichever of its pieces go, and the own part's.
    assert_eq!(job(true).prepare(Some(vec![7; 50])).bytes(), encoded_len(100) + 50);
    assert_eq!(job(false).prepare(None).bytes(), encoded_len(100));
    assert_eq!(job(false).prepare(Some(vec![7; 50])).bytes(), encoded_len(100));
    // Virtual numerics: the virtual lengths.
    let (s, o) = virtual_part_lens(1000);
    let virt = |sends_own| {
        let mut j = job(sends_own);
        (j.shared, j.virtual_lens) = (None, (s, o));
        j
    };
    assert_eq!(virt(true).prepare(None).bytes(), 16_000);
    assert_eq!(virt(false).prepare(None).bytes(), s);
}
