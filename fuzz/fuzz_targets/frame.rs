//! The frame decoder: what a peer sends after the handshake. Arbitrary bytes, and frames with a
//! right length and checksum around arbitrary header bytes (so that the header's decoder is
//! reached, not only the checksum's refusal).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use loco_real::tcp::fuzz;

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(Vec<u8>),
    Checksummed { kind: u8, header: Vec<u8>, body: Vec<u8> },
}

fuzz_target!(|input: Input| {
    match input {
        Input::Raw(bytes) => {
            fuzz::frames(&bytes);
        }
        Input::Checksummed { kind, header, body } => {
            fuzz::checksummed(kind % 4, &header, &body);
        }
    }
});
