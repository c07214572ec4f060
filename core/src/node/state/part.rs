//! The joiner's buffer of one state part, allocated once at its checked length. Pieces are
//! written into it where they belong; the replicated part is held as the vectors it decodes to,
//! so that decoding moves them and a joiner never holds two whole copies of the state.

use super::format::{SHARED_HEADER_LEN, segments_digest};
use std::ops::Range;

/// One part's bytes: in one vector, or, for the replicated part on a little-endian machine, in
/// the encoding's own three pieces (the header, and the outer weights and the momentum as the
/// float vectors they decode to: pieces are written into their final buffers and decoding moves
/// them).
#[derive(Clone, Debug)]
pub struct PartBytes(Repr);

#[derive(Clone, Debug)]
enum Repr {
    Flat(Vec<u8>),
    Floats { header: Vec<u8>, outer: Vec<f32>, momentum: Vec<f32> },
}

/// Equal when the bytes are (whatever buffers hold them).
impl PartialEq for PartBytes {
    fn eq(&self, other: &PartBytes) -> bool {
        self.len() == other.len() && self.segments().concat() == other.segments().concat()
    }
}

impl Eq for PartBytes {}

impl Default for PartBytes {
    fn default() -> Self {
        PartBytes::zeroed(0)
    }
}

impl PartBytes {
    /// `len` zero bytes in one vector.
    pub fn zeroed(len: usize) -> PartBytes {
        PartBytes(Repr::Flat(vec![0u8; len]))
    }

    /// Zero bytes for an encoded replicated part of `n` parameters ([`encoded_len`]), held as
    /// the header and two float vectors on a little-endian machine (else in one vector).
    ///
    /// [`encoded_len`]: super::encoded_len
    pub fn shared(n: usize) -> PartBytes {
        let head = SHARED_HEADER_LEN as usize;
        if cfg!(target_endian = "little") {
            PartBytes(Repr::Floats {
                header: vec![0u8; head],
                outer: vec![0.0; n],
                momentum: vec![0.0; n],
            })
        } else {
            PartBytes::zeroed(n.saturating_mul(8).saturating_add(head))
        }
    }

    /// Buffers of an encoded replicated part of `outer.len()` parameters made of two float
    /// vectors held already (their values are overwritten by the pieces); `None` unless they
    /// have one length, or on a big-endian machine.
    pub fn shared_from(outer: Vec<f32>, momentum: Vec<f32>) -> Option<PartBytes> {
        let head = SHARED_HEADER_LEN as usize;
        (cfg!(target_endian = "little") && outer.len() == momentum.len())
            .then(|| PartBytes(Repr::Floats { header: vec![0u8; head], outer, momentum }))
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.segments().iter().map(|s| s.len()).sum()
    }

    /// True when it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its buffers in order, as bytes.
    fn segments(&self) -> Vec<&[u8]> {
        match &self.0 {
            Repr::Flat(v) => vec![v.as_slice()],
            Repr::Floats { header, outer, momentum } => {
                vec![header, bytemuck::cast_slice(outer), bytemuck::cast_slice(momentum)]
            }
        }
    }

    fn segments_mut(&mut self) -> Vec<&mut [u8]> {
        match &mut self.0 {
            Repr::Flat(v) => vec![v.as_mut_slice()],
            Repr::Floats { header, outer, momentum } => vec![
                header.as_mut_slice(),
                bytemuck::cast_slice_mut(outer.as_mut_slice()),
                bytemuck::cast_slice_mut(momentum.as_mut_slice()),
            ],
        }
    }

    /// Writes `src` at `at`; false (and nothing written) when it does not lie within.
    pub fn write(&mut self, at: usize, src: &[u8]) -> bool {
        let Some(end) = at.checked_add(src.len()).filter(|&e| e <= self.len()) else {
            return false;
        };
        let mut start = 0;
        for seg in self.segments_mut() {
            let seg_end = start + seg.len();
            let (lo, hi) = (at.max(start), end.min(seg_end));
            if lo < hi {
                seg[lo - start..hi - start].copy_from_slice(&src[lo - at..hi - at]);
            }
            start = seg_end;
        }
        true
    }

    /// Calls `f` on the bytes of `range` (clamped to the part), buffer by buffer, in order.
    pub fn for_each(&self, range: Range<usize>, mut f: impl FnMut(&[u8])) {
        let mut start = 0;
        for seg in self.segments() {
            let seg_end = start + seg.len();
            let (lo, hi) = (range.start.max(start), range.end.min(seg_end));
            if lo < hi {
                f(&seg[lo - start..hi - start]);
            }
            start = seg_end;
        }
    }

    /// The digest of its bytes ([`super::state_digest`] of their concatenation).
    pub fn digest(&self) -> crate::digest::Blake3Digest {
        segments_digest(self.segments())
    }

    /// Its bytes in one vector: moved when they are one, else concatenated.
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Repr::Flat(v) => v,
            Repr::Floats { .. } => self.segments().concat(),
        }
    }

    /// The replicated part's outer weights and momentum, when it is held as them.
    pub(crate) fn into_floats(self) -> Result<[Vec<f32>; 2], PartBytes> {
        match self.0 {
            Repr::Floats { outer, momentum, .. } => Ok([outer, momentum]),
            repr => Err(PartBytes(repr)),
        }
    }
}

impl From<Vec<u8>> for PartBytes {
    fn from(v: Vec<u8>) -> PartBytes {
        PartBytes(Repr::Flat(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Writes = Vec<(usize, Vec<u8>)>;

    /// `writes` into `p` read back as the same writes into one vector do; the digest is the
    /// vector's.
    fn behaves_as_one_vector(
        mut p: PartBytes,
        writes: &Writes,
        a: usize,
        b: usize,
    ) -> Result<(), TestCaseError> {
        let len = p.len();
        let mut v = vec![0u8; len];
        for (at, src) in writes {
            let fits = at + src.len() <= len;
            prop_assert_eq!(p.write(*at, src), fits);
            if fits {
                v[*at..at + src.len()].copy_from_slice(src);
            }
        }
        let (lo, hi) = (a.min(b), a.max(b));
        let mut got = Vec::new();
        p.for_each(lo..hi, |s| got.extend_from_slice(s));
        prop_assert_eq!(&got[..], &v[lo.min(len)..hi.min(len)]);
        prop_assert_eq!(p.digest(), super::super::state_digest(&v));
        prop_assert_eq!(p.into_vec(), v);
        Ok(())
    }

    fn writes() -> impl Strategy<Value = Writes> {
        prop::collection::vec((0usize..320, prop::collection::vec(any::<u8>(), 0..80)), 0..12)
    }

    proptest! {
        #[test]
        fn a_flat_part_behaves_as_one_vector(len in 0usize..300, w in writes(),
                                             a in 0usize..320, b in 0usize..320) {
            behaves_as_one_vector(PartBytes::zeroed(len), &w, a, b)?;
        }

        /// The replicated part held as floats too.
        #[test]
        fn floats_behave_as_one_vector(n in 0usize..20, w in writes(), a in 0usize..320, b in 0usize..320) {
            let p = PartBytes::shared(n);
            prop_assert_eq!(p.len(), 24 + 8 * n);
            behaves_as_one_vector(p, &w, a, b)?;
        }
    }
}
