// Reductions of a tensor viewed as [outer, len, inner] over its middle axis, into
// [outer, inner] (or [outer, chunks, inner] for the first of two passes over a long axis).
// Every output is summed in a fixed order, so results are the same bits on every run.
//   OP: 0 sum   1 max   2 min
// `scale` multiplies the result (1/len for a mean).
//
// `per_thread`: one invocation per output walks the axis; used when there are many outputs or
//   the axis is short (bias gradients: sum over a batch for every feature).
// `per_workgroup`: 256 invocations share one output (or one chunk of the axis), then combine
//   their partial results as a binary tree in workgroup memory; used for long axes.
// `argmax`: index of the first largest element of each row of [rows, len], as u32.

struct Params {
    outer: u32,
    len: u32,
    inner: u32,
    // Elements of the axis handled by one workgroup in `per_workgroup` (>= len: one chunk).
    chunk: u32,
    chunks: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

override OP: u32 = 0u;

fn identity() -> f32 {
    switch OP {
        case 0u: { return 0.0; }
        case 1u: { return bitcast<f32>(0xff800000u); } // -inf
        default: { return bitcast<f32>(0x7f800000u); } // +inf
    }
}

fn combine(acc: f32, v: f32) -> f32 {
    switch OP {
        case 0u: { return acc + v; }
        case 1u: { return max(acc, v); }
        default: { return min(acc, v); }
    }
}

@compute @workgroup_size(256)
fn per_thread(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = flat_index(wid, nwg, lid);
    if (o >= p.outer * p.inner) {
        return;
    }
    let outer = o / p.inner;
    let inner = o % p.inner;
    let base = outer * p.len * p.inner + inner;
    var acc = identity();
    for (var j = 0u; j < p.len; j++) {
        acc = combine(acc, x[base + j * p.inner]);
    }
    out[o] = acc * p.scale;
}

var<workgroup> partial: array<f32, 256>;

// Workgroup (wid.x + wid.y * nwg.x) handles output (outer, inner) for chunk `c` of the axis:
// id = (outer * chunks + c) * inner + inner_index.
@compute @workgroup_size(256)
fn per_workgroup(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let id = wid.y * nwg.x + wid.x;
    let total = p.outer * p.chunks * p.inner;
    // Uniform per workgroup, so the early exit keeps barriers in uniform control flow.
    if (id >= total) {
        return;
    }
    let inner = id % p.inner;
    let oc = id / p.inner;
    let c = oc % p.chunks;
    let outer = oc / p.chunks;
    let start = c * p.chunk;
    let end = min(start + p.chunk, p.len);
    let base = outer * p.len * p.inner + inner;
    var acc = identity();
    for (var j = start + lid; j < end; j += 256u) {
        acc = combine(acc, x[base + j * p.inner]);
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var width = 128u; width > 0u; width = width / 2u) {
        if (lid < width) {
            partial[lid] = combine(partial[lid], partial[lid + width]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[id] = partial[0] * p.scale;
    }
}

@group(0) @binding(2) var<storage, read_write> index_out: array<u32>;

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = flat_index(wid, nwg, lid);
    if (r >= p.outer) {
        return;
    }
    // This launch looks at [p.chunk, p.chunk + LOOP_SPAN) and goes on from the index the
    // previous span chose (see grid.wgsl, LOOP_SPAN).
    var best_j = 0u;
    if (p.chunk > 0u) {
        best_j = index_out[r];
    }
    var best = x[r * p.len + best_j];
    for (var j = max(p.chunk, 1u); j < min(p.chunk + LOOP_SPAN, p.len); j++) {
        let v = x[r * p.len + j];
        if (v > best) {
            best = v;
            best_j = j;
        }
    }
    index_out[r] = best_j;
}
