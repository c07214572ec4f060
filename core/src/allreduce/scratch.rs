//! Working space of the ring's reduce steps: one segment of f32 values per collective, reused
//! across collectives.
//!
//! A reduce-scatter hop sums the received segment and the node's own values into this space and
//! encodes from it, so the payload is only read (see `RingAllReduce`). The space is a segment
//! long (4 MiB at the default segment) and is used over and over, so it stays in the caches; a
//! fresh allocation per collective would have the kernel zero its pages on first touch every
//! time, so buffers go back to a small process-wide pool when a collective ends.

use std::sync::Mutex;

/// Most idle buffers kept (one per concurrent collective is typical: a node's rings).
const MAX_IDLE: usize = 16;

static IDLE: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A reusable f32 buffer, empty until [`Scratch::get`] sizes it; returned to the pool on drop.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    buf: Vec<f32>,
}

impl Scratch {
    /// The first `n` values of the buffer (of unspecified content), growing it if needed; the
    /// first call takes a buffer from the pool.
    pub(crate) fn get(&mut self, n: usize) -> &mut [f32] {
        if self.buf.capacity() == 0 && n > 0 {
            let mut idle = IDLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // The largest idle buffer: collectives of one process tend to share a segment size.
            if let Some(i) = (0..idle.len()).max_by_key(|&i| idle[i].capacity()) {
                self.buf = idle.swap_remove(i);
            }
        }
        if self.buf.len() < n {
            self.buf.resize(n, 0.0);
        }
        &mut self.buf[..n]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.buf.capacity() == 0 {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        let mut idle = IDLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_reused_and_grown_on_demand() {
        let mut a = Scratch::default();
        assert_eq!(a.get(10).len(), 10);
        a.get(10)[3] = 7.0;
        assert_eq!(a.get(20).len(), 20, "grows");
        assert_eq!(a.get(5).len(), 5, "a shorter view");
        drop(a);
        // Other tests may take it meanwhile: the pool never hands out less than asked for.
        let mut b = Scratch::default();
        assert_eq!(b.get(1000).len(), 1000);
        assert!(Scratch::default().get(0).is_empty());
    }
}
