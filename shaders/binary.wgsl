// Elementwise binary operations with broadcasting: out[i] = a[ia] OP b[ib], where the output
// has up to 4 dimensions and each operand has its own strides (0 along a broadcast dimension).
// The host merges adjacent dimensions first, so most launches use 1 or 2 of the 4.
//   OP: 0 add   1 sub   2 mul   3 div   4 max   5 min
// BROADCAST = false compiles the same-shape fast path (no index arithmetic).

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    dims: vec4<u32>,
    a_strides: vec4<u32>,
    b_strides: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

override OP: u32 = 0u;
override BROADCAST: bool = true;

fn apply(x: f32, y: f32) -> f32 {
    switch OP {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return max(x, y); }
        default: { return min(x, y); }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n) {
        return;
    }
    if (!BROADCAST) {
        out[i] = apply(a[i], b[i]);
        return;
    }
    // Split i into coordinates, innermost dimension last.
    var rest = i;
    let i3 = rest % p.dims.w;
    rest = rest / p.dims.w;
    let i2 = rest % p.dims.z;
    rest = rest / p.dims.z;
    let i1 = rest % p.dims.y;
    let i0 = rest / p.dims.y;
    let ia = dot(vec4<u32>(i0, i1, i2, i3), p.a_strides);
    let ib = dot(vec4<u32>(i0, i1, i2, i3), p.b_strides);
    out[i] = apply(a[ia], b[ib]);
}
