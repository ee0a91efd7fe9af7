//! The counter-based random generator every random choice in murmur comes from.
//!
//! Philox4x32-10 (Salmon et al., SC'11) maps a 128-bit counter and a 64-bit key to four
//! 32-bit words. It needs only 32-bit multiplies, so `shaders/common/philox.wgsl` computes the
//! same words on the GPU, and any element's randomness can be computed without the others:
//! CPU, GPU and every peer agree bit for bit.
//!
//! Counter layout (the house rule "keyed by seed, step, key, index"):
//! - per-element randomness: key = seed, counter = `[index / 4, key, step, 0]`, element `index`
//!   taking word `index % 4`, so that one Philox call serves four neighbouring elements;
//! - sequential streams ([`Rng`]): key = seed, counter = `[block_lo, block_hi, stream, 1]`.
//!
//! The last word separates the two domains so that they never share a counter.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox4x32 with 10 rounds.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

fn seed_key(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// The random word of element `index` of tensor `key` at `step`.
pub fn element_u32(seed: u64, step: u32, key: u32, index: u32) -> u32 {
    element_block(seed, step, key, index / 4)[(index % 4) as usize]
}

/// The random words of elements `4 * block .. 4 * block + 4`.
pub fn element_block(seed: u64, step: u32, key: u32, block: u32) -> [u32; 4] {
    philox4x32([block, key, step, 0], seed_key(seed))
}

/// Random words for elements `first .. first + out.len()` (`first` a multiple of 4), computed
/// eight Philox blocks at a time so that the compiler vectorises the rounds. Always inlined,
/// so that callers compiled for wider vector units (the codecs' AVX2 paths) get a vector
/// generator too.
#[inline(always)]
pub fn element_words(seed: u64, step: u32, key: u32, first: u32, out: &mut [u32]) {
    debug_assert!(first.is_multiple_of(4));
    let k = seed_key(seed);
    let mut chunks = out.chunks_exact_mut(32);
    let mut block = first / 4;
    for chunk in &mut chunks {
        let words = philox_x8(std::array::from_fn(|l| block + l as u32), key, step, k);
        for l in 0..8 {
            for w in 0..4 {
                chunk[4 * l + w] = words[w][l];
            }
        }
        block += 8;
    }
    for (i, w) in chunks.into_remainder().iter_mut().enumerate() {
        *w = element_block(seed, step, key, block + (i / 4) as u32)[i % 4];
    }
}

/// Eight Philox4x32-10 blocks in lock step: counters `[c0[l], c1, c2, 0]`.
#[inline(always)]
fn philox_x8(c0: [u32; 8], c1: u32, c2: u32, key: [u32; 2]) -> [[u32; 8]; 4] {
    let mut c = [c0, [c1; 8], [c2; 8], [0; 8]];
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let mut next = [[0u32; 8]; 4];
        for l in 0..8 {
            let p0 = M0 as u64 * c[0][l] as u64;
            let p1 = M1 as u64 * c[2][l] as u64;
            next[0][l] = (p1 >> 32) as u32 ^ c[1][l] ^ k[0];
            next[1][l] = p1 as u32;
            next[2][l] = (p0 >> 32) as u32 ^ c[3][l] ^ k[1];
            next[3][l] = p0 as u32;
        }
        c = next;
    }
    c
}

/// A uniform f32 in [0, 1) with 24 random bits, exactly representable on every device.
pub fn unit_f32(word: u32) -> f32 {
    (word >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// A sequential stream of random numbers for host-side choices (initialisation, shuffling).
#[derive(Debug, Clone)]
pub struct Rng {
    key: [u32; 2],
    stream: u32,
    block: u64,
    buf: [u32; 4],
    used: usize,
}

impl Rng {
    /// Stream `stream` of `seed`; different streams are independent.
    pub fn new(seed: u64, stream: u32) -> Self {
        Rng {
            key: seed_key(seed),
            stream,
            block: 0,
            buf: [0; 4],
            used: 4,
        }
    }

    /// The next 32 random bits of the stream.
    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            let ctr = [self.block as u32, (self.block >> 32) as u32, self.stream, 1];
            self.buf = philox4x32(ctr, self.key);
            self.block += 1;
            self.used = 0;
        }
        self.used += 1;
        self.buf[self.used - 1]
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        unit_f32(self.next_u32())
    }

    /// Uniform in [lo, hi).
    pub fn uniform_in(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.uniform()
    }

    /// Standard normal (Box-Muller, one value per two draws).
    pub fn normal(&mut self) -> f32 {
        let u1 = (self.next_u32() as f64 + 1.0) / 4_294_967_297.0; // (0, 1)
        let u2 = self.next_u32() as f64 / 4_294_967_296.0;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// Uniform integer in [0, n) (Lemire's multiply-shift; bias below 2^-32 * n).
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0 && n <= u32::MAX as usize, "below({n})");
        ((self.next_u32() as u64 * n as u64) >> 32) as usize
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_random123_known_answers() {
        // Random123 kat_vectors, "philox4x32 10".
        assert_eq!(
            philox4x32([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn bulk_element_words_match_the_single_element_definition() {
        let mut out = vec![0u32; 77];
        element_words(9, 3, 5, 40, &mut out);
        for (i, &w) in out.iter().enumerate() {
            assert_eq!(w, element_u32(9, 3, 5, 40 + i as u32), "element {}", 40 + i);
        }
        // Keyed by every input.
        let base = element_u32(1, 2, 3, 4);
        assert_ne!(base, element_u32(2, 2, 3, 4));
        assert_ne!(base, element_u32(1, 3, 3, 4));
        assert_ne!(base, element_u32(1, 2, 4, 4));
        assert_ne!(base, element_u32(1, 2, 3, 5));
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u32> = (0..10)
            .scan(Rng::new(7, 0), |r, _| Some(r.next_u32()))
            .collect();
        let b: Vec<u32> = (0..10)
            .scan(Rng::new(7, 0), |r, _| Some(r.next_u32()))
            .collect();
        let c: Vec<u32> = (0..10)
            .scan(Rng::new(7, 1), |r, _| Some(r.next_u32()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn uniform_and_normal_have_the_right_moments() {
        let mut r = Rng::new(1, 0);
        let n = 200_000;
        let u: Vec<f32> = (0..n).map(|_| r.uniform()).collect();
        let mean = u.iter().sum::<f32>() / n as f32;
        assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)));
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
        let z: Vec<f64> = (0..n).map(|_| r.normal() as f64).collect();
        let m = z.iter().sum::<f64>() / n as f64;
        let var = z.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n as f64;
        assert!(
            m.abs() < 0.01 && (var - 1.0).abs() < 0.02,
            "mean {m} var {var}"
        );
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<usize> = (0..1000).collect();
        Rng::new(3, 0).shuffle(&mut v);
        assert_ne!(v, (0..1000).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
    }
}
