// Axis permutation of a tensor of up to 4 axes: out[i0, i1, i2, i3] = src[i0*s0 + i1*s1 +
// i2*s2 + i3*s3], where (d0..d3) is the output's shape and s the input strides of the axes
// the output's axes come from. Attention uses it to split heads ([B, T, H, D] to
// [B, H, T, D]) and merge them back. kernels/permute.rs holds the CPU reference.

struct Params {
    d0: u32,
    d1: u32,
    d2: u32,
    d3: u32,
    s0: u32,
    s1: u32,
    s2: u32,
    s3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.d0 * p.d1 * p.d2 * p.d3) {
        return;
    }
    let i3 = i % p.d3;
    var t = i / p.d3;
    let i2 = t % p.d2;
    t = t / p.d2;
    let i1 = t % p.d1;
    let i0 = t / p.d1;
    dst[i] = src[i0 * p.s0 + i1 * p.s1 + i2 * p.s2 + i3 * p.s3];
}
