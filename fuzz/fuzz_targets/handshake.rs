//! Both ends of the handshake, with and without the run secret, on everything the other side
//! sends; and a genuine secured connection's reader on forged records. A forged secured
//! handshake or record taken as authentic fails the target (the entry points assert it).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use loco_real::tcp::fuzz;

#[derive(Arbitrary, Debug)]
enum Input {
    Accept { secret: bool, bytes: Vec<u8> },
    Dial { secret: bool, bytes: Vec<u8> },
    SecuredRecords(Vec<u8>),
}

fuzz_target!(|input: Input| {
    match input {
        Input::Accept { secret, bytes } => {
            fuzz::accept(&bytes, secret);
        }
        Input::Dial { secret, bytes } => {
            fuzz::dial(&bytes, secret);
        }
        Input::SecuredRecords(bytes) => {
            fuzz::secured_records(&bytes);
        }
    }
});
