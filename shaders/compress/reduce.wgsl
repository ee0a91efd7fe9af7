// Reductions that produce codec scales, in the canonical order of
// compress::support::canonical_sum: each workgroup folds one chunk of 4096 values, lane t
// taking values t, t + 256, ... in order, then the 256 lanes combine as a tree; levels repeat
// over the chunk results until one value is left.
//
// `max_abs`: LEVEL 0 takes max |clean(x)| of each chunk, LEVEL 1 the max of the chunk
//   results of the level below.
// `twins`: the l2 norm's two sums in one pass, in the same order per component: LEVEL 0 sums
//   (clean(x)^2, (clean(x) * 2^-64)^2), LEVEL 1 sums the pairs (x[2i], x[2i + 1]) of the level
//   below; each chunk writes its pair to out[2c], out[2c + 1].
// `finish`: writes the final value into payload word `dst`: FINISH 0 copies, 1 takes the
//   square root of x[0], or where that sum overflowed, of x[1] times 2^64
//   (compress::support::l2_norm); results past f32's range saturate.
// `group_max`: blockq's per-group scales, max|v| * 2^(1-bits) (or 1 for an all-zero group),
//   one invocation per group walking it in order.
// (The sign codec's mean magnitude has kernels of its own, in sign.wgsl.)

struct Params {
    n: u32,
    dst: u32,
    group: u32,
    bits: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

override FINISH: u32 = 0u;

const LANES: u32 = 256u;
// 2^-64 and 2^64 (compress::support::L2_DOWNSCALE and its inverse).
const L2_DOWNSCALE: f32 = 5.42101086242752217004e-20;
const L2_UPSCALE: f32 = 18446744073709551616.0;
const CHUNK: u32 = 4096u;

override LEVEL: u32 = 0u;
var<workgroup> lanes: array<f32, 256>;

@compute @workgroup_size(256)
fn max_abs(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.y * nwg.x + wid.x;
    let start = c * CHUNK;
    if (start >= p.n && c > 0u) {
        return;
    }
    let end = min(start + CHUNK, p.n);
    var acc = 0.0;
    for (var i = start + lid; i < end; i += LANES) {
        if (LEVEL == 0u) {
            acc = max(acc, abs(clean(x[i])));
        } else {
            acc = max(acc, x[i]);
        }
    }
    lanes[lid] = acc;
    workgroupBarrier();
    for (var w = LANES / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            lanes[lid] = max(lanes[lid], lanes[lid + w]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[c] = lanes[0];
    }
}

var<workgroup> twin_lanes: array<vec2<f32>, 256>;

@compute @workgroup_size(256)
fn twins(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.y * nwg.x + wid.x;
    let start = c * CHUNK;
    if (start >= p.n && c > 0u) {
        return;
    }
    let end = min(start + CHUNK, p.n);
    var acc = vec2<f32>(0.0, 0.0);
    for (var i = start + lid; i < end; i += LANES) {
        if (LEVEL == 0u) {
            let v = clean(x[i]);
            let s = v * L2_DOWNSCALE;
            acc = acc + vec2<f32>(v * v, s * s);
        } else {
            acc = acc + vec2<f32>(x[2u * i], x[2u * i + 1u]);
        }
    }
    twin_lanes[lid] = acc;
    workgroupBarrier();
    for (var w = LANES / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            twin_lanes[lid] = twin_lanes[lid] + twin_lanes[lid + w];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[2u * c] = twin_lanes[0].x;
        out[2u * c + 1u] = twin_lanes[0].y;
    }
}

@compute @workgroup_size(1)
fn finish() {
    let v = x[0];
    switch FINISH {
        // A quantizer's scale stops at 2^127 (compress::support::MAX_SCALE), so that its
        // largest value stays finite; sums past f32's range saturate too.
        case 0u: { out[p.dst] = min(v, MAX_SCALE); }
        case 1u: {
            if ((bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u) { // finite
                out[p.dst] = min(sqrt(v), MAX_SCALE);
            } else {
                out[p.dst] = min(sqrt(x[1]) * L2_UPSCALE, MAX_SCALE);
            }
        }
        default: {}
    }
}

@compute @workgroup_size(256)
fn group_max(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = flat_index(wid, nwg, lid);
    let groups = (p.n + p.group - 1u) / p.group;
    if (g >= groups) {
        return;
    }
    var m = 0.0;
    for (var i = g * p.group; i < min((g + 1u) * p.group, p.n); i++) {
        m = max(m, abs(clean(x[i])));
    }
    if (m == 0.0) {
        out[g] = 1.0;
    } else {
        out[g] = m * pow2(1 - i32(p.bits));
    }
}
