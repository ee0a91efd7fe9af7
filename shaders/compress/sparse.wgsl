// Payloads of the sparse codecs (engine/src/compress/sparse.rs has the layouts), from the
// selected indices that select.wgsl wrote in increasing order.
//   KIND: 0 topk with f32 values, 1 topk with f16 values, 2 randk values only,
//         3 randk with indices, 4 hybrid.   MODE (decode): 0 set, 1 add, 2 subtract, 2 subtract.
// Encoding entries bind x, idx, payload, tmp; decoding entries bind payload, idx, out.

struct Params {
    n: u32,
    k: u32,
    bits: u32,
    // Word offsets of the hybrid's support mask and codes.
    mask_offset: u32,
    codes_offset: u32,
    // Random-k's n / k (1 when unscaled), and the largest |v| whose product with it is
    // finite (compress::sparse::randk_factor): past it the value saturates at f32's maximum.
    factor: f32,
    limit: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

override KIND: u32 = 0u;
override MODE: u32 = 0u;

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> payload: array<u32>;
@group(0) @binding(4) var<storage, read_write> tmp: array<u32>;

fn hybrid_top() -> f32 {
    return f32((1u << (p.bits - 1u)) - 1u);
}

// Random-k's v * n / k, saturating as compress::sparse::scale_saturating does.
fn scale_saturating(v: f32) -> f32 {
    if (abs(v) > p.limit) {
        return select(F32_MAX, -F32_MAX, v < 0.0);
    }
    return v * p.factor;
}

// One invocation per kept element j.
@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    _ = tmp[0];
    let j = flat_index(wid, nwg, lid);
    if (j >= p.k) {
        return;
    }
    let i = idx[j];
    let v = clean(x[i]);
    switch KIND {
        case 0u: {
            payload[j] = i;
            payload[p.k + j] = bitcast<u32>(v);
        }
        case 1u: {
            payload[j] = i;
            tmp[j] = f32_to_f16(clamp(v, -65504.0, 65504.0));
        }
        case 2u: {
            payload[j] = bitcast<u32>(scale_saturating(v));
        }
        case 3u: {
            payload[j] = i;
            payload[p.k + j] = bitcast<u32>(scale_saturating(v));
        }
        default: {
            let scale = bitcast<f32>(payload[0]);
            let top = hybrid_top();
            var l = 0;
            let factor = top / scale;
            if (factor <= 8.5070591730234616e37) { // compress::support::MAX_FACTOR
                l = i32(min(round(abs(v) * factor), top));
            }
            tmp[j] = to_pattern(select(l, -l, v < 0.0), p.bits);
        }
    }
}

// f16 values, two per word after the k indices.
@compute @workgroup_size(256)
fn pack_halves(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    _ = x[0];
    _ = idx[0];
    let w = flat_index(wid, nwg, lid);
    if (2u * w >= p.k) {
        return;
    }
    var word = tmp[2u * w];
    if (2u * w + 1u < p.k) {
        word = word | (tmp[2u * w + 1u] << 16u);
    }
    payload[p.k + w] = word;
}

// The hybrid's b-bit codes, 32 per invocation, into `bits` words each.
@compute @workgroup_size(64)
fn pack_codes(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    _ = x[0];
    _ = idx[0];
    let g = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (32u * g >= p.k) {
        return;
    }
    var words: array<u32, 8>;
    for (var w = 0u; w < 8u; w++) {
        words[w] = 0u;
    }
    for (var j = 0u; j < 32u; j++) {
        let c = 32u * g + j;
        if (c >= p.k) {
            break;
        }
        let bit = j * p.bits;
        words[bit / 32u] = words[bit / 32u] | (tmp[c] << (bit % 32u));
        if (bit % 32u + p.bits > 32u) {
            words[bit / 32u + 1u] = words[bit / 32u + 1u] | (tmp[c] >> (32u - bit % 32u));
        }
    }
    // A last, partial group fills only the words its codes reach: the payload ends there.
    let used = (min(32u, p.k - 32u * g) * p.bits + 31u) / 32u;
    for (var w = 0u; w < used; w++) {
        payload[p.codes_offset + g * p.bits + w] = words[w];
    }
}

@group(0) @binding(3) var<storage, read_write> mask_words: array<atomic<u32>>;

// The hybrid's support bits (the mask words start zeroed).
@compute @workgroup_size(256)
fn mark_mask(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    _ = x[0];
    _ = tmp[0];
    let j = flat_index(wid, nwg, lid);
    if (j >= p.k) {
        return;
    }
    let i = idx[j];
    atomicOr(&mask_words[p.mask_offset + i / 32u], 1u << (i % 32u));
}

@group(0) @binding(1) var<storage, read> code: array<u32>;
@group(0) @binding(2) var<storage, read> kept: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// One invocation per kept element; indices come from the payload (topk, explicit randk) or
// from `kept` (shared-seed randk and hybrid, recomputed on the device).
@compute @workgroup_size(256)
fn scatter(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    _ = kept[0];
    let j = flat_index(wid, nwg, lid);
    if (j >= p.k) {
        return;
    }
    var i: u32;
    var v: f32;
    switch KIND {
        case 0u, 3u: {
            i = code[j];
            v = bitcast<f32>(code[p.k + j]);
        }
        case 1u: {
            i = code[j];
            v = f16_to_f32((code[p.k + j / 2u] >> (16u * (j % 2u))) & 0xffffu);
        }
        case 2u: {
            i = kept[j];
            v = bitcast<f32>(code[j]);
        }
        default: {
            i = kept[j];
            let bit = j * p.bits;
            let w = p.codes_offset + bit / 32u;
            var pattern = code[w] >> (bit % 32u);
            if (bit % 32u + p.bits > 32u) {
                pattern = pattern | (code[w + 1u] << (32u - bit % 32u));
            }
            pattern = pattern & ((1u << p.bits) - 1u);
            v = f32(sign_extend(pattern, p.bits)) * (bitcast<f32>(code[0]) / hybrid_top());
        }
    }
    if (i >= p.n) {
        return;
    }
    switch MODE {
        case 0u: { out[i] = v; }
        case 1u: { out[i] = out[i] + v; }
        default: { out[i] = out[i] - v; }
    }
}
