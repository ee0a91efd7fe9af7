// 2-D convolution as im2col + matmul, images in NHWC layout (channels last, so a pixel's
// channels are contiguous and a column of the im2col matrix is a (kh, kw, c) triple).
//
// im2col: cols[(n, oh, ow), (kh, kw, c)] = x[n, oh*stride + kh - pad, ow*stride + kw - pad, c],
//         zero where that position falls in the padding.
// col2im: the adjoint, written as a gather so that it needs no atomics and sums in a fixed
//         order: dx[n, ih, iw, c] = sum over (kh, kw) ascending of dcols[(n, oh, ow), (kh, kw, c)]
//         for every (oh, ow) whose window covers (ih, iw) at (kh, kw).
// The CPU references (kernels/conv.rs) loop in the same order.

struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    kh: u32,
    kw: u32,
    stride: u32,
    pad: u32,
    oh: u32,
    ow: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn im2col(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n * p.oh * p.ow * p.kh * p.kw * p.c) {
        return;
    }
    let c = i % p.c;
    var t = i / p.c;
    let kw = t % p.kw;
    t = t / p.kw;
    let kh = t % p.kh;
    t = t / p.kh;
    let ow = t % p.ow;
    t = t / p.ow;
    let oh = t % p.oh;
    let n = t / p.oh;
    let ih = i32(oh * p.stride + kh) - i32(p.pad);
    let iw = i32(ow * p.stride + kw) - i32(p.pad);
    var v = 0.0;
    if (ih >= 0 && ih < i32(p.h) && iw >= 0 && iw < i32(p.w)) {
        v = src[((n * p.h + u32(ih)) * p.w + u32(iw)) * p.c + c];
    }
    dst[i] = v;
}

@compute @workgroup_size(256)
fn col2im(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.n * p.h * p.w * p.c) {
        return;
    }
    let c = i % p.c;
    var t = i / p.c;
    let iw = t % p.w;
    t = t / p.w;
    let ih = t % p.h;
    let n = t / p.h;
    var acc = 0.0;
    for (var kh = 0u; kh < p.kh; kh++) {
        let yh = i32(ih + p.pad) - i32(kh);
        if (yh < 0 || u32(yh) % p.stride != 0u || u32(yh) / p.stride >= p.oh) {
            continue;
        }
        let oh = u32(yh) / p.stride;
        for (var kw = 0u; kw < p.kw; kw++) {
            let yw = i32(iw + p.pad) - i32(kw);
            if (yw < 0 || u32(yw) % p.stride != 0u || u32(yw) / p.stride >= p.ow) {
                continue;
            }
            let ow = u32(yw) / p.stride;
            acc += src[((((n * p.oh + oh) * p.ow + ow) * p.kh + kh) * p.kw + kw) * p.c + c];
        }
    }
    dst[i] = acc;
}
