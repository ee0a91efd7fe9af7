// Scaled sign (engine/src/compress/sign.rs). The payload's u64 word w, little-endian, holds
// element 64w + j at bit 63 - j; as u32 words, element 32g + j sits at bit 31 - j of word
// g ^ 1 (the high half of each u64 comes second). The f32 scale follows the bits; the
// reduce.wgsl kernels write it.

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
