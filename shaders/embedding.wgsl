// Embedding lookup and its gradient.
// `gather`:      out[t, d] = table[ids[t], d]    (an id >= vocab gives a zero row; the host
//                validates ids before upload).
// `scatter_add`: dtable[v, d] = sum over t with ids[t] == v of dout[t, d], in order of t.
//   No atomics: each workgroup owns one row v (so the id test is uniform across its lanes) and
//   64 of its columns, and walks all tokens. Cost O(vocab * tokens) id reads plus the matches,
//   right for byte-level vocabularies; large vocabularies want a sort by id first.

struct Params {
    tokens: u32,
    dim: u32,
    vocab: u32,
    // scatter_add: this launch walks tokens [span_start, span_start + LOOP_SPAN), adding to
    // the partial sums already in dtable when span_start > 0.
    span_start: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;

@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.tokens * p.dim) {
        return;
    }
    let t = i / p.dim;
    let d = i % p.dim;
    let id = ids[t];
    var v = 0.0;
    if (id < p.vocab) {
        v = table[id * p.dim + d];
    }
    out[i] = v;
}

@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read_write> dtable: array<f32>;

// Dispatch: x = ceil(dim / 64) column blocks, y = vocab rows (the host splits y over z when
// vocab exceeds 65535).
@compute @workgroup_size(64)
fn scatter_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let v = wid.z * nwg.y + wid.y;
    let d = wid.x * 64u + lid;
    if (v >= p.vocab) {
        return;
    }
    let dd = min(d, p.dim - 1u);
    var acc = 0.0;
    if (p.span_start > 0u) {
        acc = dtable[v * p.dim + dd];
    }
    for (var t = p.span_start; t < min(p.span_start + LOOP_SPAN, p.tokens); t++) {
        if (ids[t] == v) {
            acc += dout[t * p.dim + dd];
        }
    }
    if (d < p.dim) {
        dtable[v * p.dim + d] = acc;
    }
}
