// Dense quantizers (engine/src/compress/dense.rs holds the definitions and the table of
// formulas): `encode` turns 32 elements into `bits` payload words, `decode` one code into one
// value. The scales sit in the first `header` payload words (written by reduce.wgsl; a
// rescalable LoCo payload's, its fixed scale, by `encode`).
//   OP: 0 linear dithering, 1 natural dithering, 2 natural compression, 3 qsgd, 4 loco,
//       5 blockq.   STOCHASTIC: qsgd's rounding.   MODE (decode): 0 set, 1 add, 2 subtract.

struct Params {
    n: u32,
    bits: u32,
    header: u32,
    // Dithering levels s; blockq group size; loco log2 s (as i32 bits).
    s: u32,
    group: u32,
    log2s: i32,
    step: u32,
    key: u32,
    seed: vec2<u32>,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

override OP: u32 = 0u;
override STOCHASTIC: bool = false;
override MODE: u32 = 0u;

// compress::support::MAX_FACTOR, 2^126: smaller scales encode as zeros.
const MAX_FACTOR: f32 = 8.5070591730234616e37;

fn scale_index(i: u32) -> u32 {
    if (OP == 5u) {
        return i / p.group;
    }
    return 0u;
}

// (encode factor, decode step) for a scale, as DenseCodec::factors computes them.
fn factors(scale: f32) -> vec2<f32> {
    switch OP {
        case 0u: { return vec2<f32>(f32(p.s) / scale, scale / f32(p.s)); }
        case 1u: {
            let top = pow2(i32(p.s) - 1);
            return vec2<f32>(top / scale, scale / top);
        }
        case 3u: {
            let l = f32((1u << (p.bits - 1u)) - 1u);
            return vec2<f32>(l / scale, scale / l);
        }
        case 4u: {
            // A rescalable LoCo payload carries its scale, 2^k: k from its exponent bits.
            if (p.header == 1u) {
                let k = i32((bitcast<u32>(scale) >> 23u) & 0xffu) - 127;
                return vec2<f32>(pow2(k), pow2(-k));
            }
            return vec2<f32>(pow2(p.log2s), pow2(-p.log2s));
        }
        case 5u: { return vec2<f32>(1.0 / scale, scale); }
        default: { return vec2<f32>(1.0, 1.0); }
    }
}

fn stochastic_level(xi: f32, top: f32, word: u32) -> f32 {
    let l = floor(xi);
    if (l >= top) {
        return top;
    }
    if (unit_f32(word) < xi - l) {
        return l + 1.0;
    }
    return l;
}

fn code(v: f32, scale: f32, factor: f32, word: u32) -> u32 {
    let b = p.bits;
    switch OP {
        case 0u, 1u: {
            if (factor > MAX_FACTOR) {
                return 0u;
            }
            let xi = abs(v) * factor;
            var mag: i32;
            if (OP == 0u) {
                mag = i32(stochastic_level(xi, f32(p.s), word));
            } else {
                let top = pow2(i32(p.s) - 1);
                var q: f32;
                if (xi >= top) {
                    q = top;
                } else if (xi < 1.0) {
                    q = select(0.0, 1.0, unit_f32(word) < xi);
                } else {
                    let lo = bitcast<f32>(bitcast<u32>(xi) & 0xff800000u);
                    q = select(lo, 2.0 * lo, unit_f32(word) < (xi - lo) / lo);
                }
                mag = select(i32(bitcast<u32>(q) >> 23u) - 127 + 1, 0, q == 0.0);
            }
            return to_pattern(select(mag, -mag, v < 0.0), b);
        }
        case 2u: {
            let bits = bitcast<u32>(v);
            var e = (bits >> 23u) & 0xffu;
            if (e == 0u) {
                return 0u;
            }
            let frac = f32(bits & 0x007fffffu) * pow2(-23);
            if (unit_f32(word) < frac) {
                e = min(e + 1u, 254u);
            }
            return ((bits >> 31u) << 8u) | e;
        }
        case 3u: {
            if (factor > MAX_FACTOR) {
                return 0u;
            }
            let top = f32((1u << (b - 1u)) - 1u);
            let xi = abs(v) * factor;
            var l: i32;
            if (STOCHASTIC) {
                l = i32(stochastic_level(xi, top, word));
            } else {
                l = i32(min(round(xi), top));
            }
            return to_pattern(select(l, -l, v < 0.0), b);
        }
        default: {
            if (OP == 5u && factor > MAX_FACTOR) {
                return 0u;
            }
            let lim = f32(1u << (b - 1u));
            return to_pattern(i32(clamp(round(v * factor), -lim, lim - 1.0)), b);
        }
    }
}

fn value(pattern: u32, step: f32) -> f32 {
    let b = p.bits;
    switch OP {
        case 0u, 1u: {
            let c = sign_extend(pattern, b);
            let m = u32(abs(c));
            var mag: f32;
            if (OP == 0u) {
                mag = f32(m) * step;
            } else if (m == 0u) {
                mag = 0.0;
            } else {
                mag = pow2(i32(m) - 1) * step;
            }
            return select(mag, -mag, c < 0);
        }
        case 2u: {
            let e = pattern & 0xffu;
            if (e == 0u) {
                return 0.0;
            }
            return bitcast<f32>(((pattern >> 8u) << 31u) | (e << 23u));
        }
        default: {
            return f32(sign_extend(pattern, b)) * step;
        }
    }
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> payload: array<u32>;

// One invocation per 32 elements: their codes fill exactly `bits` words.
// The scale an element is coded against: LoCo's is fixed (p.log2s; `encode` writes it into a
// rescalable payload's header itself), the others' reduce.wgsl wrote into the header.
fn encode_scale(i: u32) -> f32 {
    if (OP == 4u) {
        return pow2(p.log2s);
    }
    return bitcast<f32>(payload[scale_index(i)]);
}

@compute @workgroup_size(64)
fn encode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = (wid.y * nwg.x + wid.x) * 64u + lid;
    let first = 32u * g;
    // A rescalable LoCo payload's header is its fixed scale (written for n = 0 too).
    if (OP == 4u && p.header == 1u && g == 0u) {
        payload[0] = bitcast<u32>(pow2(p.log2s));
    }
    if (first >= p.n) {
        return;
    }
    var words: array<u32, 16>;
    for (var w = 0u; w < 16u; w++) {
        words[w] = 0u;
    }
    var rand = vec4<u32>(0u);
    for (var j = 0u; j < 32u; j++) {
        let i = first + j;
        if (i >= p.n) {
            break;
        }
        if (j % 4u == 0u && (OP <= 2u || STOCHASTIC)) {
            rand = element_block(p.seed, p.step, p.key, i / 4u);
        }
        let scale = encode_scale(i);
        let f = factors(scale);
        let c = code(clean(x[i]), scale, f.x, rand[j % 4u]);
        let bit = j * p.bits;
        words[bit / 32u] = words[bit / 32u] | (c << (bit % 32u));
        if (bit % 32u + p.bits > 32u) {
            words[bit / 32u + 1u] = words[bit / 32u + 1u] | (c >> (32u - bit % 32u));
        }
    }
    // A last, partial group fills only the words its codes reach: the payload ends there.
    let used = (min(32u, p.n - first) * p.bits + 31u) / 32u;
    for (var w = 0u; w < used; w++) {
        payload[p.header + g * p.bits + w] = words[w];
    }
}

@group(0) @binding(1) var<storage, read> code_words: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    let bit = i * p.bits;
    let w = p.header + bit / 32u;
    var pattern = code_words[w] >> (bit % 32u);
    if (bit % 32u + p.bits > 32u) {
        pattern = pattern | (code_words[w + 1u] << (32u - bit % 32u));
    }
    pattern = pattern & ((1u << p.bits) - 1u);
    let step = factors(bitcast<f32>(code_words[scale_index(i)])).y;
    let v = value(pattern, step);
    switch MODE {
        case 0u: { out[i] = v; }
        case 1u: { out[i] = out[i] + v; }
        default: { out[i] = out[i] - v; }
    }
}
