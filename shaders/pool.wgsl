// Max and average pooling over k x k windows with stride s, no padding, NHWC layout:
// out[n, oh, ow, c] pools x[n, oh*s + kh, ow*s + kw, c] over (kh, kw).
//
// max_forward keeps, per output, the flat input index of its maximum (the first in (kh, kw)
// order on ties) for the backward pass. Both backward passes are gathers over the windows
// that cover an input element, in (kh, kw) order, so they need no atomics and their sums do
// not depend on scheduling. The CPU references are in kernels/pool.rs.

struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    k: u32,
    stride: u32,
    oh: u32,
    ow: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<storage, read_write> argmax: array<u32>;

fn out_len() -> u32 {
    return p.n * p.oh * p.ow * p.c;
}

// (n, oh, ow, c) of output element i, as the flat input index of its window's corner and c.
fn window_base(i: u32) -> u32 {
    let c = i % p.c;
    var t = i / p.c;
    let ow = t % p.ow;
    t = t / p.ow;
    let oh = t % p.oh;
    let n = t / p.oh;
    return ((n * p.h + oh * p.stride) * p.w + ow * p.stride) * p.c + c;
}

@compute @workgroup_size(256)
fn max_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= out_len()) {
        return;
    }
    let base = window_base(i);
    var best = src[base];
    var at = base;
    for (var kh = 0u; kh < p.k; kh++) {
        for (var kw = 0u; kw < p.k; kw++) {
            let j = base + (kh * p.w + kw) * p.c;
            if (src[j] > best) {
                best = src[j];
                at = j;
            }
        }
    }
    // The value is read back at the chosen index, not taken from `best`: a compiler may turn
    // the compare-and-keep above into max(), which is free to return either zero of +0 and
    // -0 (Mesa's OpenGL path on x86 does), while the index is chosen by the comparison alone.
    dst[i] = src[at];
    argmax[i] = at;
}

@compute @workgroup_size(256)
fn avg_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= out_len()) {
        return;
    }
    let base = window_base(i);
    var acc = 0.0;
    for (var kh = 0u; kh < p.k; kh++) {
        for (var kw = 0u; kw < p.k; kw++) {
            acc += src[base + (kh * p.w + kw) * p.c];
        }
    }
    dst[i] = acc / f32(p.k * p.k);
}

// Backward: src is dy [n, oh, ow, c], dst is dx [n, h, w, c]; max_backward also reads argmax.
// Two entry points with twin loops rather than one with a flag: a binding an entry point
// mentions at all must be bound, and average pooling has no argmax buffer.

// The outputs along one axis whose windows cover input position x: [lo, hi], empty when
// lo > hi. Two divisions per axis instead of a division per candidate window: llvmpipe has no
// vector integer divide, so divisions dominated these kernels.
fn covering_range(x: u32, len: u32) -> vec2<u32> {
    var lo = 0u;
    if (x >= p.k) {
        lo = (x - p.k) / p.stride + 1u; // the first o with o * stride + k > x
    }
    return vec2<u32>(lo, min(x / p.stride, len - 1u));
}

// (n, ih, iw, c) of input element i.
fn input_coords(i: u32) -> vec4<u32> {
    let c = i % p.c;
    var t = i / p.c;
    let iw = t % p.w;
    t = t / p.w;
    return vec4<u32>(t / p.h, t % p.h, iw, c);
}

// Both backward passes sum dy over the windows covering input i, in the CPU reference's
// (kh, kw) order: kh = ih - oh * stride grows as oh falls, so the loops run from the last
// window down. Max pooling counts only the windows whose maximum was input i.
fn max_gather(i: u32) -> f32 {
    let q = input_coords(i);
    let rh = covering_range(q.y, p.oh);
    let rw = covering_range(q.z, p.ow);
    var acc = 0.0;
    if (rh.x > rh.y || rw.x > rw.y) {
        return acc;
    }
    for (var dh = 0u; dh <= rh.y - rh.x; dh++) {
        let row = (q.x * p.oh + rh.y - dh) * p.ow;
        for (var dw = 0u; dw <= rw.y - rw.x; dw++) {
            let o = (row + rw.y - dw) * p.c + q.w;
            if (argmax[o] == i) {
                acc += src[o];
            }
        }
    }
    return acc;
}

@compute @workgroup_size(256)
fn max_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n * p.h * p.w * p.c) {
        return;
    }
    dst[i] = max_gather(i);
}

@compute @workgroup_size(256)
fn avg_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n * p.h * p.w * p.c) {
        return;
    }
    let q = input_coords(i);
    let rh = covering_range(q.y, p.oh);
    let rw = covering_range(q.z, p.ow);
    var acc = 0.0;
    if (rh.x <= rh.y && rw.x <= rw.y) {
        for (var dh = 0u; dh <= rh.y - rh.x; dh++) {
            let row = (q.x * p.oh + rh.y - dh) * p.ow;
            for (var dw = 0u; dw <= rw.y - rw.x; dw++) {
                acc += src[(row + rw.y - dw) * p.c + q.w];
            }
        }
    }
    dst[i] = acc / f32(p.k * p.k);
}
