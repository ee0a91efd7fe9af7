//! Element-wise loops compiled for the widest vector unit the CPU has, chosen at run time.
//!
//! The release build targets x86-64's baseline, whose vector unit is SSE2's 4 lanes; the same
//! loop compiled with AVX2 runs 8 lanes and with AVX-512 16. The bits do not change: Rust never
//! lets the compiler fuse a multiply and an add or reorder float arithmetic, so every lane
//! computes what the scalar reference computes, in the same order.

/// Runs `f` compiled, through inlining, for the widest vector unit of this CPU. `f` should be
/// a loop over elements: the work to vectorise must be inlined into it (the CPU path's math is
/// `#[inline(always)]`).
#[inline(always)]
pub fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: this CPU has AVX-512F.
            return unsafe { x86::avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: this CPU has AVX2.
            return unsafe { x86::avx2(f) };
        }
    }
    f()
}

/// The mask of an AVX-512 vector's first `count` lanes (all 16 from 16 on): a partial
/// block's loads and stores in the CPU path's intrinsic kernels.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn first_lanes(count: usize) -> std::arch::x86_64::__mmask16 {
    ((1u32 << count.min(16)) - 1) as std::arch::x86_64::__mmask16
}

/// Sixteen vectors of 16 lanes transposed: lane `c` of vector `r` comes out as lane `r` of
/// vector `c`. Four rounds of shuffles, 64 in all, where element by element a 16 x 16 block
/// is 256 loads and stores: 32-bit and then 64-bit pairs interleaved within each 128-bit
/// quarter, then quarters exchanged between vectors four and eight apart.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_16(
    rows: [std::arch::x86_64::__m512; 16],
) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    let r = rows;
    // Lanes (4q + e) of row pairs interleaved: rows 2i and 2i + 1's elements side by side.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // Pairs of those interleaved again, as 64-bit elements: within each quarter, one
    // element of four consecutive rows.
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let base = i / 4 * 4;
        let (a, b) = (t[base + (i % 4) / 2], t[base + (i % 4) / 2 + 2]);
        let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
        _mm512_castpd_ps(if i % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    // Quarters: even quarters of vectors four apart, then odd ones.
    let v: [__m512; 16] = std::array::from_fn(|i| {
        let (half, j) = (i / 8 * 8, i % 8);
        let (a, b) = (u[half + j % 4], u[half + j % 4 + 4]);
        if j < 4 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xdd>(a, b)
        }
    });
    // And quarters of vectors eight apart.
    std::array::from_fn(|i| {
        let (a, b) = (v[i % 8], v[i % 8 + 8]);
        if i < 8 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xdd>(a, b)
        }
    })
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sixteen_vectors_transpose() {
        use std::arch::x86_64::*;
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let values: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut out = [0.0f32; 256];
        // SAFETY: this CPU has AVX-512F; every load and store is 16 floats inside a slice
        // of 256.
        unsafe {
            let rows = std::array::from_fn(|r| _mm512_loadu_ps(values[r * 16..].as_ptr()));
            for (c, column) in super::transpose_16(rows).iter().enumerate() {
                _mm512_storeu_ps(out[c * 16..].as_mut_ptr(), *column);
            }
        }
        for r in 0..16 {
            for c in 0..16 {
                assert_eq!(out[c * 16 + r], values[r * 16 + c], "row {r}, column {c}");
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}
