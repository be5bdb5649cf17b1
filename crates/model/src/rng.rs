//! SplitMix64 (Steele, Lea & Flood, OOPSLA 2014): the one small seeded
//! generator whyslow uses, for the localizer's peer sampling (PerfTracker
//! Eq. 9, W_N: the same fingerprints and seed give the same report), for
//! replays with noise and for test data. The same bits on every platform.

/// A SplitMix64 state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in [−1, 1).
    pub fn symmetric(&mut self) -> f64 {
        self.unit() * 2.0 - 1.0
    }

    /// Uniform in 0..=bound (Lemire's multiply-shift, no modulo bias worth
    /// the name for bounds below 2^32).
    pub fn below_incl(&mut self, bound: usize) -> usize {
        let n = bound as u128 + 1;
        ((u128::from(self.next_u64()) * n) >> 64) as usize
    }

    /// In 0..n (n > 0), by modulo: bias below 2^-40 for the small n of
    /// test data and replays.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() <= p
    }

    /// `count` distinct values of 0..n, ascending.
    pub fn choose(&mut self, n: u32, count: usize) -> Vec<u32> {
        let mut all: Vec<u32> = (0..n).collect();
        let count = count.min(all.len());
        for i in 0..count {
            let j = i + (self.next_u64() % (all.len() - i) as u64) as usize;
            all.swap(i, j);
        }
        let mut out = all[..count].to_vec();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // The first outputs for seed 1234567 of the reference C code
        // (Vigna, splitmix64.c).
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(r.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn ranges_hold() {
        let mut r = SplitMix64::new(9);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            assert!(r.below_incl(6) <= 6);
            assert!((-1.0..1.0).contains(&r.symmetric()));
        }
        let c = r.choose(16, 4);
        assert_eq!(c.len(), 4);
        assert!(c.windows(2).all(|w| w[0] < w[1]) && c[3] < 16);
    }
}
