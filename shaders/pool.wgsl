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
    dst[i] = best;
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

// The output element whose window covers input (n, ih, iw, c) at offset (kh, kw), or -1.
fn covering_output(n: u32, ih: u32, iw: u32, c: u32, kh: u32, kw: u32) -> i32 {
    if (ih < kh || (ih - kh) % p.stride != 0u || (ih - kh) / p.stride >= p.oh) {
        return -1;
    }
    if (iw < kw || (iw - kw) % p.stride != 0u || (iw - kw) / p.stride >= p.ow) {
        return -1;
    }
    return i32(((n * p.oh + (ih - kh) / p.stride) * p.ow + (iw - kw) / p.stride) * p.c + c);
}

// (n, ih, iw, c) of input element i.
fn input_coords(i: u32) -> vec4<u32> {
    let c = i % p.c;
    var t = i / p.c;
    let iw = t % p.w;
    t = t / p.w;
    return vec4<u32>(t / p.h, t % p.h, iw, c);
}

@compute @workgroup_size(256)
fn max_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n * p.h * p.w * p.c) {
        return;
    }
    let q = input_coords(i);
    var acc = 0.0;
    for (var kh = 0u; kh < p.k; kh++) {
        for (var kw = 0u; kw < p.k; kw++) {
            let o = covering_output(q.x, q.y, q.z, q.w, kh, kw);
            if (o >= 0 && argmax[u32(o)] == i) {
                acc += src[u32(o)];
            }
        }
    }
    dst[i] = acc;
}

@compute @workgroup_size(256)
fn avg_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n * p.h * p.w * p.c) {
        return;
    }
    let q = input_coords(i);
    var acc = 0.0;
    for (var kh = 0u; kh < p.k; kh++) {
        for (var kw = 0u; kw < p.k; kw++) {
            let o = covering_output(q.x, q.y, q.z, q.w, kh, kw);
            if (o >= 0) {
                acc += src[u32(o)];
            }
        }
    }
    dst[i] = acc / f32(p.k * p.k);
}
