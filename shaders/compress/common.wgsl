// Helpers shared by the codec kernels; engine/src/compress/support.rs and engine/src/rng.rs
// are the CPU definitions they mirror bit for bit.

// ---- Philox4x32-10, the counter-based generator (engine/src/rng.rs) ----

// (high, low) words of the 64-bit product a * b, from 16-bit halves (WGSL has no u64).
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(hi, a * b);
}

fn philox(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var round = 0u; round < 10u; round++) {
        if (round > 0u) {
            k = k + vec2<u32>(0x9e3779b9u, 0xbb67ae85u);
        }
        let p0 = mulhilo(0xd2511f53u, c.x);
        let p1 = mulhilo(0xcd9e8d57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
    }
    return c;
}

// Random words of elements 4 * block .. 4 * block + 3 (rng::element_block).
fn element_block(seed: vec2<u32>, step: u32, key: u32, block: u32) -> vec4<u32> {
    return philox(vec4<u32>(block, key, step, 0u), seed);
}

// Uniform in [0, 1) with 24 random bits (rng::unit_f32).
fn unit_f32(word: u32) -> f32 {
    return f32(word >> 8u) * bitcast<f32>(0x33800000u);
}

// ---- values ----

// f32's largest finite value: results past f32's range saturate here.
const F32_MAX: f32 = 3.40282346638528859812e38;
// The largest scale of the max- and l2-scaled quantizers (compress::support::MAX_SCALE).
const MAX_SCALE: f32 = 1.70141183460469231732e38;

// Non-finite inputs count as zero (compress::support::clean).
fn clean(v: f32) -> f32 {
    if ((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u) {
        return 0.0;
    }
    return v;
}

// 2^e for |e| <= 126.
fn pow2(e: i32) -> f32 {
    return bitcast<f32>(u32(e + 127) << 23u);
}

fn sign_extend(pattern: u32, bits: u32) -> i32 {
    return bitcast<i32>(pattern << (32u - bits)) >> (32u - bits);
}

fn to_pattern(v: i32, bits: u32) -> u32 {
    return bitcast<u32>(v) & ((1u << bits) - 1u);
}

// IEEE binary16 bits, round to nearest even (support::f32_to_f16).
fn f32_to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let exp = i32((b >> 23u) & 0xffu);
    let man = b & 0x007fffffu;
    if (exp == 255) {
        var nan = 0u;
        if (man != 0u) {
            nan = 0x0200u | (man >> 13u);
        }
        return sign | 0x7c00u | nan;
    }
    let e = exp - 127 + 15;
    if (e >= 31) {
        return sign | 0x7c00u;
    }
    if (e <= 0) {
        if (e < -10) {
            return sign;
        }
        let m = man | 0x00800000u;
        let shift = u32(14 - e);
        let half = 1u << (shift - 1u);
        var q = m >> shift;
        let rem = m & ((1u << shift) - 1u);
        if (rem > half || (rem == half && (q & 1u) == 1u)) {
            q = q + 1u;
        }
        return sign | q;
    }
    var q = (u32(e) << 10u) | (man >> 13u);
    let rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u) == 1u)) {
        q = q + 1u;
    }
    return sign | q;
}

fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let exp = (h >> 10u) & 0x1fu;
    let man = h & 0x03ffu;
    if (exp == 0u) {
        let v = f32(man) * bitcast<f32>(0x33800000u);
        return select(v, -v, sign != 0u);
    }
    if (exp == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (man << 13u));
    }
    return bitcast<f32>(sign | ((exp + 112u) << 23u) | (man << 13u));
}

fn f32_to_bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) { // NaN, tested on bits: compilers may fold x != x
        return (b >> 16u) | 0x0040u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

fn bf16_to_f32(h: u32) -> f32 {
    return bitcast<f32>(h << 16u);
}
