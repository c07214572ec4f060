//! Digests as values: fixed-size byte arrays, written as the lower-case hex text users read.
//!
//! - [`WeightsDigest`]: the first 8 bytes of BLAKE3 of a model's outer weights
//!   ([`weights_digest`](crate::node::digest::weights_digest)), the `weights_hash` column;
//! - [`Blake3Digest`]: a full BLAKE3 digest (a state part's, a piece's, a checkpoint tensor's).
//!
//! Both are one type, [`Digest`], over their length. [`Display`](fmt::Display) and
//! [`Debug`](fmt::Debug) write lower-case hex; [`FromStr`] reads hex of either case and exactly
//! the right length back. With serde, a human-readable format (JSON, TOML) gets the hex text and a
//! binary one (postcard frames) the bytes as a fixed-length tuple: no length prefix, and nothing a
//! decoder must bound. Where a digest may be absent, [`hex_or_empty`] writes `None` as the empty
//! string, as the rows and metrics lines always have.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A digest of `N` bytes. See the [module docs](self).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest<const N: usize>([u8; N]);

/// The digest of a model's outer weights: the first 8 bytes of BLAKE3 of their little-endian
/// bits, written as 16 hex characters.
pub type WeightsDigest = Digest<8>;

/// A full BLAKE3 digest: 32 bytes, written as 64 hex characters.
pub type Blake3Digest = Digest<32>;

impl<const N: usize> Digest<N> {
    /// Hex characters of the text form.
    pub const HEX_LEN: usize = 2 * N;

    /// The digest with these bytes.
    pub const fn from_bytes(bytes: [u8; N]) -> Self {
        Digest(bytes)
    }

    /// Its bytes.
    pub const fn as_bytes(&self) -> &[u8; N] {
        &self.0
    }

    /// The first `N` bytes of a BLAKE3 hash (all of them for [`Blake3Digest`]).
    pub fn from_blake3(h: &blake3::Hash) -> Self {
        const { assert!(N <= blake3::OUT_LEN, "BLAKE3 gives 32 bytes") };
        let mut out = [0; N];
        out.copy_from_slice(&h.as_bytes()[..N]);
        Digest(out)
    }
}

impl<const N: usize> Default for Digest<N> {
    /// All zeros (a virtual body's piece digest).
    fn default() -> Self {
        Digest([0; N])
    }
}

impl<const N: usize> From<[u8; N]> for Digest<N> {
    fn from(bytes: [u8; N]) -> Self {
        Digest(bytes)
    }
}

impl<const N: usize> fmt::Display for Digest<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl<const N: usize> fmt::Debug for Digest<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Text that is not a digest's hex form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DigestParseError {
    /// Another number of characters than the digest's length in hex.
    #[error("a digest of {expected} hex characters expected, found {found} characters")]
    Length {
        /// Hex characters of the digest.
        expected: usize,
        /// Characters found.
        found: usize,
    },
    /// A character that is not a hex digit.
    #[error("a digest of hex characters expected, found {found:?} at character {at}")]
    NotHex {
        /// The character.
        found: char,
        /// Its index among the characters (0-based).
        at: usize,
    },
}

impl<const N: usize> FromStr for Digest<N> {
    type Err = DigestParseError;

    fn from_str(s: &str) -> Result<Self, DigestParseError> {
        if let Some((at, found)) = s.chars().enumerate().find(|(_, c)| !c.is_ascii_hexdigit()) {
            return Err(DigestParseError::NotHex { found, at });
        }
        // Only ASCII is left: bytes are characters.
        if s.len() != 2 * N {
            return Err(DigestParseError::Length { expected: 2 * N, found: s.len() });
        }
        let mut out = [0u8; N];
        for (o, pair) in out.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
            *o = (nibble(pair[0]) << 4) | nibble(pair[1]);
        }
        Ok(Digest(out))
    }
}

/// The value of an ASCII hex digit (checked by the caller; anything else is 0).
fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    }
}

impl<const N: usize> Serialize for Digest<N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_str(self)
        } else {
            let mut t = s.serialize_tuple(N)?;
            for b in &self.0 {
                t.serialize_element(b)?;
            }
            t.end()
        }
    }
}

impl<'de, const N: usize> Deserialize<'de> for Digest<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            d.deserialize_str(HexVisitor::<N>)
        } else {
            d.deserialize_tuple(N, BytesVisitor::<N>)
        }
    }
}

struct HexVisitor<const N: usize>;

impl<const N: usize> Visitor<'_> for HexVisitor<N> {
    type Value = Digest<N>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a digest of {} hex characters", 2 * N)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Digest<N>, E> {
        v.parse().map_err(E::custom)
    }
}

struct BytesVisitor<const N: usize>;

impl<'de, const N: usize> Visitor<'de> for BytesVisitor<N> {
    type Value = Digest<N>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a digest of {N} bytes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Digest<N>, A::Error> {
        let mut out = [0u8; N];
        for (i, o) in out.iter_mut().enumerate() {
            *o = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(i, &self))?;
        }
        Ok(Digest(out))
    }
}

/// An optional digest as its text: the hex form, or the empty string for `None`.
#[derive(Clone, Copy)]
pub struct HexOrEmpty<'a, const N: usize>(pub &'a Option<Digest<N>>);

impl<const N: usize> fmt::Display for HexOrEmpty<'_, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(d) => fmt::Display::fmt(d, f),
            None => Ok(()),
        }
    }
}

/// Serde for `Option<Digest<N>>` as text (`#[serde(with = "hex_or_empty")]`): the hex form, or
/// the empty string for `None`; reading back, the empty string is `None`. A binary format gets
/// serde's own `Option`.
pub mod hex_or_empty {
    use super::{Digest, HexOrEmpty, HexVisitor};
    use serde::de::{self, Deserializer, Visitor};
    use serde::{Deserialize, Serialize, Serializer};
    use std::fmt;

    /// Writes the hex form, or `""` for `None`.
    pub fn serialize<S: Serializer, const N: usize>(
        d: &Option<Digest<N>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() { s.collect_str(&HexOrEmpty(d)) } else { d.serialize(s) }
    }

    /// Reads the hex form, or `""` as `None`.
    pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        d: D,
    ) -> Result<Option<Digest<N>>, D::Error> {
        if d.is_human_readable() {
            d.deserialize_str(OptVisitor::<N>)
        } else {
            Option::deserialize(d)
        }
    }

    struct OptVisitor<const N: usize>;

    impl<const N: usize> Visitor<'_> for OptVisitor<N> {
        type Value = Option<Digest<N>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a digest of {} hex characters, or the empty string", 2 * N)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            if v.is_empty() { Ok(None) } else { HexVisitor::<N>.visit_str(v).map(Some) }
        }
    }
}

#[cfg(test)]
mod tests;
