// Deterministic transcendental functions: exp, expm1, log, tanh and sigmoid from +, -, *, /,
// floor and bit casts only, accurate to a few ulp. Built-in exp and log are approximations
// that differ between drivers and from Rust's; these give the same bits as the CPU reference
// (engine/src/kernels/math.rs mirrors this file line for line) on every GPU that evaluates
// `a * b + c` as a rounded product and a rounded sum, as lavapipe does. Constants are f32 bit
// patterns, so no decimal-to-f32 conversion can differ between compilers.

// ln 2 split for Cody-Waite range reduction: LN2_HI has 15 significant bits, so k * LN2_HI is
// exact for every k that occurs (|k| <= 150).
fn ln2_hi() -> f32 { return bitcast<f32>(0x3f317200u); }
fn ln2_lo() -> f32 { return bitcast<f32>(0x35bfbe8eu); }

// 2^n for n in [-126, 127], built from its exponent bits.
fn pow2i(n: i32) -> f32 {
    return bitcast<f32>(u32(n + 127) << 23u);
}

fn det_exp(x: f32) -> f32 {
    if (x != x) {
        return x;
    }
    if (x > bitcast<f32>(0x42b17217u)) { // 88.72283: e^x overflows
        return bitcast<f32>(0x7f800000u);
    }
    if (x < bitcast<f32>(0xc2cff1b4u)) { // -103.97208: e^x underflows to 0
        return 0.0;
    }
    let k = floor(x * bitcast<f32>(0x3fb8aa3bu) + 0.5); // round(x / ln 2)
    var r = x - k * ln2_hi();
    r = r - k * ln2_lo();
    // e^r for |r| <= ln(2) / 2: Taylor series to r^7 (remainder below 1e-8 relative).
    var p = bitcast<f32>(0x39500d01u); // 1/7!
    p = p * r + bitcast<f32>(0x3ab60b61u); // 1/6!
    p = p * r + bitcast<f32>(0x3c088889u); // 1/5!
    p = p * r + bitcast<f32>(0x3d2aaaabu); // 1/4!
    p = p * r + bitcast<f32>(0x3e2aaaabu); // 1/3!
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // 2^k in two factors keeps each inside the normal exponent range.
    let ki = i32(k);
    let k1 = ki / 2;
    return p * pow2i(k1) * pow2i(ki - k1);
}

// e^x - 1 without cancellation near 0.
fn det_expm1(x: f32) -> f32 {
    if (abs(x) >= 0.5) {
        return det_exp(x) - 1.0;
    }
    // Taylor series to x^9 for |x| < 0.5 (remainder below 3e-10).
    var p = bitcast<f32>(0x3638ef1du); // 1/9!
    p = p * x + bitcast<f32>(0x37d00d01u); // 1/8!
    p = p * x + bitcast<f32>(0x39500d01u); // 1/7!
    p = p * x + bitcast<f32>(0x3ab60b61u); // 1/6!
    p = p * x + bitcast<f32>(0x3c088889u); // 1/5!
    p = p * x + bitcast<f32>(0x3d2aaaabu); // 1/4!
    p = p * x + bitcast<f32>(0x3e2aaaabu); // 1/3!
    p = p * x + 0.5;
    p = p * x + 1.0;
    return p * x;
}

fn det_log(x: f32) -> f32 {
    if (x != x || x < 0.0) {
        return bitcast<f32>(0x7fc00000u); // NaN
    }
    if (x == 0.0) {
        return bitcast<f32>(0xff800000u); // -inf
    }
    if (x == bitcast<f32>(0x7f800000u)) {
        return x;
    }
    var v = x;
    var e = 0;
    if (v < bitcast<f32>(0x00800000u)) {
        // Subnormal: scale into the normal range first.
        v = v * 8388608.0;
        e = -23;
    }
    let bits = bitcast<u32>(v);
    e = e + i32((bits >> 23u) & 0xffu) - 127;
    var m = bitcast<f32>((bits & 0x007fffffu) | 0x3f800000u);
    if (m > bitcast<f32>(0x3fb504f3u)) { // sqrt(2)
        m = m * 0.5;
        e = e + 1;
    }
    // log(m) = 2 atanh(s) = 2s (1 + z/3 + z^2/5 + ...), s = (m - 1) / (m + 1), |s| <= 0.1716.
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    var q = bitcast<f32>(0x3dba2e8cu); // 1/11
    q = q * z + bitcast<f32>(0x3de38e39u); // 1/9
    q = q * z + bitcast<f32>(0x3e124925u); // 1/7
    q = q * z + bitcast<f32>(0x3e4ccccdu); // 1/5
    q = q * z + bitcast<f32>(0x3eaaaaabu); // 1/3
    let log_m = 2.0 * s + 2.0 * s * (z * q);
    let ef = f32(e);
    return ef * ln2_hi() + (ef * ln2_lo() + log_m);
}

fn det_tanh(x: f32) -> f32 {
    // tanh(|x|) = expm1(2|x|) / (expm1(2|x|) + 2); saturated past 15 (tanh(15) rounds to 1).
    let a = min(abs(x), 15.0);
    let t = det_expm1(2.0 * a);
    let y = t / (t + 2.0);
    return select(y, -y, x < 0.0);
}

fn det_sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + det_exp(-x));
}
