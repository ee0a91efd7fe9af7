// Inverted dropout driven by the counter-based generator: element i is kept when
// unit_f32(word(seed, step, key, offset + i)) >= rate and then scaled by 1 / (1 - rate), so the
// mask is a pure function of (seed, step, key, global element): the backward pass recomputes it
// instead of storing it, and every device and peer draws the same one. `offset` places the
// tensor's first sample in the step's global batch (kernels/dropout.rs is the CPU reference;
// rng::element_u32 the generator).

struct Params {
    n: u32,
    step: u32,
    key: u32,
    rate: f32,
    scale: f32,
    seed_lo: u32,
    seed_hi: u32,
    offset: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

// Forward and backward are the same map: x -> x * mask * scale.
@compute @workgroup_size(256)
fn apply_mask(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    let g = p.offset + i;
    let word = element_block(vec2<u32>(p.seed_lo, p.seed_hi), p.step, p.key, g / 4u)[g % 4u];
    var v = 0.0;
    if (unit_f32(word) >= p.rate) {
        v = src[i] * p.scale;
    }
    dst[i] = v;
}
