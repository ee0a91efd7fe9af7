// Scaled sign (engine/src/compress/sign.rs). The payload's u64 word w, little-endian, holds
// element 64w + j at bit 63 - j; as u32 words, element 32g + j sits at bit 31 - j of word
// g ^ 1 (the high half of each u64 comes second). The f32 scale follows the bits: the mean
// magnitude, rounded once, which `magnitudes`, `add_sums` and `mean` below compute.

struct Params {
    n: u32,
    // Index of the scale word: 2 * ceil(n / 64).
    scale_word: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

override MODE: u32 = 0u;

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> payload: array<u32>;

// One invocation per u32 word of sign bits, including an all-zero partner word at the end.
@compute @workgroup_size(256)
fn encode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = flat_index(wid, nwg, lid);
    if (g >= p.scale_word) {
        return;
    }
    var word = 0u;
    for (var j = 0u; j < 32u; j++) {
        let i = 32u * g + j;
        if (i < p.n && clean(x[i]) < 0.0) {
            word = word | (1u << (31u - j));
        }
    }
    payload[g ^ 1u] = word;
}

@group(0) @binding(1) var<storage, read> code: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    let scale = bitcast<f32>(code[p.scale_word]);
    let g = i / 32u;
    let negative = (code[g ^ 1u] >> (31u - i % 32u)) & 1u;
    let v = select(scale, -scale, negative == 1u);
    switch MODE {
        case 0u: { out[i] = v; }
        case 1u: { out[i] = out[i] + v; }
        default: { out[i] = out[i] - v; }
    }
}

// ---------------------------------------------------------------------------------------------
// The scale, mean |clean(x)| rounded once to f32 (compress/mean_abs.rs, whose docs say why it
// is computed in integers). Each magnitude is placed exactly in a 128-bit fixed-point frame
// whose unit is 2^-GUARD of the largest magnitude's last bit (`top`: reduce.wgsl's max), and
// the placed values are added as integers, so the order does not matter for the bits.
// `magnitudes` sums each chunk of CHUNK values and `add_sums` each chunk of CHUNK sums of the
// level below; a sum is five words: the 128-bit value, least significant word first, and 1
// where bits fell below the frame. `mean` divides the last sum by n, rounds to nearest even,
// and writes the f32 into payload[scale_word].

@group(0) @binding(3) var<storage, read> top: array<u32>;

const LANES: u32 = 256u;
const CHUNK: u32 = 4096u;
const GUARD: i32 = 64;
var<workgroup> lane_sums: array<vec4<u32>, 256>;
var<workgroup> lane_dropped: array<u32, 256>;

fn add128(a: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    let x = a.x + b.x;
    var carry = select(0u, 1u, x < a.x);
    let y0 = a.y + b.y;
    let y = y0 + carry;
    // At most one of the two additions wraps.
    carry = select(0u, 1u, y0 < a.y) + select(0u, 1u, y < y0);
    let z0 = a.z + b.z;
    let z = z0 + carry;
    carry = select(0u, 1u, z0 < a.z) + select(0u, 1u, z < z0);
    return vec4<u32>(x, y, z, a.w + b.w + carry);
}

// The frame's exponent field: the largest magnitude's, 1 for zero and subnormal values.
fn frame_exponent() -> u32 {
    return max((top[0] >> 23u) & 0xffu, 1u);
}

struct Placed {
    value: vec4<u32>,
    dropped: u32,
}

// |v| in the frame (mean_abs::place); non-finite values count as zero.
fn place(v: f32, frame: u32) -> Placed {
    var out = Placed(vec4<u32>(0u), 0u);
    let bits = bitcast<u32>(v) & 0x7fffffffu;
    let field = bits >> 23u;
    if (field == 0xffu) {
        return out;
    }
    let significand = (bits & 0x7fffffu) | select(0u, 0x800000u, field > 0u);
    let shift = GUARD - (i32(frame) - i32(max(field, 1u)));
    if (shift >= 0) {
        let word = u32(shift) / 32u;
        let bit = u32(shift) % 32u;
        out.value[word] = significand << bit;
        if (word < 3u) {
            // (Two shifts, so that bit = 0 shifts everything out.)
            out.value[word + 1u] = (significand >> 1u) >> (31u - bit);
        }
    } else if (shift > -24) {
        let drop = u32(-shift);
        out.value.x = significand >> drop;
        out.dropped = select(0u, 1u, (significand & ((1u << drop) - 1u)) != 0u);
    } else {
        out.dropped = select(0u, 1u, significand != 0u);
    }
    return out;
}

// Combines the workgroup's lanes and writes chunk c's sum.
fn write_chunk_sum(c: u32, lid: u32, sum: vec4<u32>, dropped: u32) {
    lane_sums[lid] = sum;
    lane_dropped[lid] = dropped;
    workgroupBarrier();
    for (var w = LANES / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            lane_sums[lid] = add128(lane_sums[lid], lane_sums[lid + w]);
            lane_dropped[lid] = lane_dropped[lid] | lane_dropped[lid + w];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let s = lane_sums[0];
        payload[5u * c] = s.x;
        payload[5u * c + 1u] = s.y;
        payload[5u * c + 2u] = s.z;
        payload[5u * c + 3u] = s.w;
        payload[5u * c + 4u] = lane_dropped[0];
    }
}

@compute @workgroup_size(256)
fn magnitudes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.y * nwg.x + wid.x;
    let start = c * CHUNK;
    if (start >= p.n && c > 0u) {
        return;
    }
    let frame = frame_exponent();
    var sum = vec4<u32>(0u);
    var dropped = 0u;
    for (var i = start + lid; i < min(start + CHUNK, p.n); i += LANES) {
        let placed = place(x[i], frame);
        sum = add128(sum, placed.value);
        dropped = dropped | placed.dropped;
    }
    write_chunk_sum(c, lid, sum, dropped);
}

@compute @workgroup_size(256)
fn add_sums(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.y * nwg.x + wid.x;
    let start = c * CHUNK;
    if (start >= p.n && c > 0u) {
        return;
    }
    var sum = vec4<u32>(0u);
    var dropped = 0u;
    for (var i = start + lid; i < min(start + CHUNK, p.n); i += LANES) {
        let at = 5u * i;
        sum = add128(sum, vec4<u32>(code[at], code[at + 1u], code[at + 2u], code[at + 3u]));
        dropped = dropped | code[at + 4u];
    }
    write_chunk_sum(c, lid, sum, dropped);
}

// Bit i of q (0 past the top).
fn bit_at(q: vec4<u32>, i: u32) -> u32 {
    if (i >= 128u) {
        return 0u;
    }
    return (q[i / 32u] >> (i % 32u)) & 1u;
}

// The low 32 bits of q >> s (s < 128).
fn shifted_word(q: vec4<u32>, s: u32) -> u32 {
    let word = s / 32u;
    let bit = s % 32u;
    var out = q[word] >> bit;
    if (word < 3u) {
        out = out | ((q[word + 1u] << 1u) << (31u - bit));
    }
    return out;
}

// Whether any of bits 0..s-1 of q is set.
fn any_below(q: vec4<u32>, s: u32) -> bool {
    for (var w = 0u; w < 4u; w++) {
        let low = 32u * w;
        if (s >= low + 32u) {
            if (q[w] != 0u) {
                return true;
            }
        } else if (s > low) {
            if ((q[w] & ((1u << (s - low)) - 1u)) != 0u) {
                return true;
            }
        }
    }
    return false;
}

@compute @workgroup_size(1)
fn mean() {
    let a = vec4<u32>(code[0], code[1], code[2], code[3]);
    if (p.n == 0u || all(a == vec4<u32>(0u))) {
        payload[p.scale_word] = 0u;
        return;
    }
    // Long division of the 128-bit sum by n, a bit at a time.
    var q = vec4<u32>(0u);
    var r = 0u;
    for (var i = 0u; i < 128u; i++) {
        let at = 127u - i;
        let carry = r >> 31u;
        r = (r << 1u) | bit_at(a, at);
        // With the carry the true remainder is past 2^32 > n; the wrapped difference is right.
        if (carry == 1u || r >= p.n) {
            r = r - p.n;
            q[at / 32u] = q[at / 32u] | (1u << (at % 32u));
        }
    }
    let sticky = code[4] != 0u || r != 0u;
    var length = 0;
    for (var w = 3; w >= 0; w--) {
        if (q[w] != 0u) {
            length = 32 * w + 32 - i32(countLeadingZeros(q[w]));
            break;
        }
    }
    let unit = i32(frame_exponent()) - 150 - GUARD;
    let high = length - 1 + unit;
    var drop = length - 24;
    if (high < -126) {
        drop = -149 - unit;
    }
    let kept = shifted_word(q, u32(drop));
    let half = bit_at(q, u32(drop - 1)) == 1u;
    let below = sticky || any_below(q, u32(drop - 1));
    let rounded = kept + select(0u, 1u, half && (below || (kept & 1u) == 1u));
    if (high >= -126) {
        payload[p.scale_word] = (u32(high + 127 - 1) << 23u) + rounded;
    } else {
        payload[p.scale_word] = rounded;
    }
}
