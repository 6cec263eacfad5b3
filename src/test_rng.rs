//! A small deterministic generator for randomized unit tests (xorshift64*): the same sequence on every run, so a
//! failure names a history that can be replayed.

/// The generator's state; any non-zero seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next value, below `n` (`n` > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}
