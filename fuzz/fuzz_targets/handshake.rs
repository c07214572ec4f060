//! Both ends of the handshake, plaintext, with the run secret, and with the secret and node
//! keys (mode 0, 1, 2), on everything the other side sends; and a genuine secured connection's reader on forged records. A forged secured
//! handshake or record taken as authentic fails the target (the entry points assert it).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use loco_real::tcp::fuzz;

#[derive(Arbitrary, Debug)]
enum Input {
    Accept { mode: u8, bytes: Vec<u8> },
    Dial { mode: u8, bytes: Vec<u8> },
    SecuredRecords(Vec<u8>),
}

fuzz_target!(|input: Input| {
    match input {
        Input::Accept { mode, bytes } => {
            fuzz::accept(&bytes, mode % 3);
        }
        Input::Dial { mode, bytes } => {
            fuzz::dial(&bytes, mode % 3);
        }
        Input::SecuredRecords(bytes) => {
            fuzz::secured_records(&bytes);
        }
    }
});
