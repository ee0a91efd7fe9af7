// f32, f16 and bf16 codecs (engine/src/compress/plain.rs). Encoding cleans non-finite values
// to 0 and saturates 16-bit formats at their largest finite value; f16/bf16 payload word w
// holds element 2w in its low half and 2w + 1 in its high half.
//   KIND: 0 f32, 1 f16, 2 bf16.   MODE (decode): 0 set, 1 add, 2 subtract, 2 subtract.

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

override KIND: u32 = 0u;
override MODE: u32 = 0u;

fn half_code(v: f32) -> u32 {
    let c = clean(v);
    if (KIND == 1u) {
        return f32_to_f16(clamp(c, -65504.0, 65504.0));
    }
    let m = bitcast<f32>(0x7f7f0000u);
    return f32_to_bf16(clamp(c, -m, m));
}

fn half_value(h: u32) -> f32 {
    if (KIND == 1u) {
        return f16_to_f32(h);
    }
    return bf16_to_f32(h);
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> payload: array<u32>;

// One invocation per payload word.
@compute @workgroup_size(256)
fn encode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = flat_index(wid, nwg, lid);
    if (KIND == 0u) {
        if (w < p.n) {
            payload[w] = bitcast<u32>(clean(x[w]));
        }
        return;
    }
    if (2u * w >= p.n) {
        return;
    }
    var word = half_code(x[2u * w]);
    if (2u * w + 1u < p.n) {
        word = word | (half_code(x[2u * w + 1u]) << 16u);
    }
    payload[w] = word;
}

@group(0) @binding(1) var<storage, read> code: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// One invocation per element.
@compute @workgroup_size(256)
fn decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    var v: f32;
    if (KIND == 0u) {
        // A checked payload is finite, so the clamp changes nothing there; the recursive sign
        // decodes the sum of its rounds through here, and saturates as on the CPU.
        v = clamp(bitcast<f32>(code[i]), -F32_MAX, F32_MAX);
    } else {
        v = half_value((code[i / 2u] >> (16u * (i % 2u))) & 0xffffu);
    }
    switch MODE {
        case 0u: { out[i] = v; }
        case 1u: { out[i] = out[i] + v; }
        default: { out[i] = out[i] - v; }
    }
}
