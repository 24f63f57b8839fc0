//! The event trace's fingerprint: FNV-1a (64-bit) over every event the simulator executes.
//! Two runs of one seed must print the same hash; a difference means something outside the
//! seed (a clock, a thread, hash-map order) leaked into the run.

/// A running FNV-1a 64 hash.
#[derive(Clone, Debug)]
pub struct TraceHash(u64);

impl Default for TraceHash {
    fn default() -> Self {
        TraceHash(0xcbf2_9ce4_8422_2325)
    }
}

impl TraceHash {
    pub fn bytes(&mut self, data: &[u8]) {
        for b in data {
            self.0 ^= *b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }

    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    pub fn value(&self) -> u64 {
        self.0
    }
}
