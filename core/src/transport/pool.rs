//! A process-wide pool of large byte buffers for frame bodies.
//!
//! An all-reduce allocates a body per segment (the encoded values it sends, the bytes it
//! receives), megabytes each, and frees it a moment later. Allocators tend to hand such sizes
//! out as fresh pages (mimalloc from untouched arena space, glibc by `mmap`), which the kernel
//! zeroes on their first touch; a profile of a four-process ring on loopback put a large share of
//! each rank's time there. Bodies taken from here go back here when their last [`Bytes`] handle
//! drops, so later segments (and later all-reduces) reuse pages that are already mapped.
//!
//! Only buffers of at least [`MIN_POOLED`] bytes are kept, and at most [`MAX_IDLE_BYTES`] of
//! them while unused; the rest go back to the allocator. Reuse never changes what a body holds:
//! [`zeroed`] zeroes, readers fill a buffer from [`with_capacity`] before freezing it, and
//! encoders overwrite the whole of a [`for_overwrite`] buffer.

use bytes::Bytes;
use std::sync::Mutex;

/// Smaller buffers are left to the allocator.
pub const MIN_POOLED: usize = 64 << 10;
/// Most bytes kept in idle buffers.
pub const MAX_IDLE_BYTES: usize = 256 << 20;

struct Idle {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

static IDLE: Mutex<Idle> = Mutex::new(Idle { bufs: Vec::new(), bytes: 0 });

fn idle() -> std::sync::MutexGuard<'static, Idle> {
    // The pool holds no invariant a panic could break halfway.
    IDLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An empty buffer with room for at least `n` bytes: an idle one of `n` to `2n` bytes' capacity
/// when there is one, else a new one.
pub fn with_capacity(n: usize) -> Vec<u8> {
    let mut b = reuse(n);
    b.clear();
    b
}

/// An idle buffer of `n` to `2n` bytes' capacity, with its old contents, or a new empty one.
fn reuse(n: usize) -> Vec<u8> {
    if n >= MIN_POOLED {
        let mut idle = idle();
        if let Some(i) = idle.bufs.iter().position(|b| b.capacity() >= n && b.capacity() <= 2 * n) {
            let b = idle.bufs.swap_remove(i);
            idle.bytes -= b.capacity();
            return b;
        }
    }
    Vec::with_capacity(n)
}

/// A buffer of `n` bytes to be overwritten whole (an encoder's output): a reused buffer keeps
/// its old bytes where it had some, and only the rest is zeroed, which saves a pass over the
/// buffer. What it holds is unspecified, never uninitialised.
pub fn for_overwrite(n: usize) -> Vec<u8> {
    let mut b = reuse(n);
    b.resize(n, 0);
    b
}

/// A buffer of `n` zero bytes (see [`with_capacity`]).
pub fn zeroed(n: usize) -> Vec<u8> {
    let mut b = with_capacity(n);
    b.resize(n, 0);
    b
}

/// Freezes `buf` into [`Bytes`] whose memory returns to the pool once the last handle drops.
pub fn freeze(buf: Vec<u8>) -> Bytes {
    if buf.capacity() < MIN_POOLED {
        return Bytes::from(buf);
    }
    Bytes::from_owner(Pooled(buf))
}

/// Idle buffers and their total capacity (for tests and diagnostics).
pub fn idle_stats() -> (usize, usize) {
    let idle = idle();
    (idle.bufs.len(), idle.bytes)
}

struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        let mut idle = idle();
        if idle.bytes + buf.capacity() <= MAX_IDLE_BYTES {
            idle.bytes += buf.capacity();
            idle.bufs.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_body_is_handed_out_again_with_its_pages() {
        let n = MIN_POOLED * 3 + 5;
        let mut a = zeroed(n);
        a[7] = 42;
        let ptr = a.as_ptr();
        let body = freeze(a);
        let clone = body.clone();
        drop(body);
        assert_eq!(clone[7], 42, "a live handle keeps the buffer");
        drop(clone);
        // Other tests use the pool at the same time: look for this buffer among a few takes.
        let takes: Vec<Vec<u8>> = (0..64).map(|_| zeroed(n)).collect();
        let again = takes.iter().find(|b| b.as_ptr() == ptr).expect("reused");
        assert_eq!(again.len(), n);
        assert!(again.iter().all(|&x| x == 0), "zeroed() zeroes reused memory");
    }

    #[test]
    fn a_buffer_for_overwrite_keeps_old_bytes_and_zeroes_only_what_is_new() {
        let n = MIN_POOLED * 5 + 3;
        let mut a = Vec::with_capacity(n + 100);
        a.resize(n, 0xab);
        let ptr = a.as_ptr();
        drop(freeze(a));
        // Longer than the old contents, within the capacity: the old bytes stay, the rest is 0.
        let takes: Vec<Vec<u8>> = (0..64).map(|_| for_overwrite(n + 50)).collect();
        let again = takes.iter().find(|b| b.as_ptr() == ptr).expect("reused");
        assert_eq!(again.len(), n + 50);
        assert!(again[..n].iter().all(|&x| x == 0xab), "no pass over the old bytes");
        assert!(again[n..].iter().all(|&x| x == 0), "new bytes are zeroed");
    }

    #[test]
    fn small_buffers_are_plain_bytes_and_sizes_far_apart_are_not_mixed() {
        let small = freeze(vec![1u8; 100]);
        assert_eq!(&small[..], &[1u8; 100][..]);
        drop(freeze(zeroed(MIN_POOLED * 16)));
        let b = with_capacity(MIN_POOLED);
        assert!(b.is_empty());
        assert!(b.capacity() >= MIN_POOLED && b.capacity() <= 2 * MIN_POOLED, "{}", b.capacity());
    }
}
