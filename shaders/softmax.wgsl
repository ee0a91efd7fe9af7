// Row-wise softmax, and softmax fused with cross-entropy, over the last axis of [rows, cols].
// One workgroup per row; 64 invocations stride over the columns and combine partial maxima and
// sums as a fixed binary tree, so the bits do not depend on scheduling (the CPU reference,
// kernels/softmax.rs, sums in the same order and uses the same exp and log from
// common/math.wgsl). Subtracting the row maximum before exp keeps every step finite.
//
// xent_forward:  loss[r] = log(sum_j exp(x[r,j] - m)) + m - x[r, label[r]]  and
//                probs[r,j] = softmax(x[r])_j, kept for the backward pass.
// xent_backward: dx[r,j] = (probs[r,j] - [j == label[r]]) * dloss[r].
// softmax_forward / softmax_backward: y = softmax(x); dx = y * (dy - sum_j dy_j y_j).
// A label >= cols contributes no target term (the host validates labels before upload).
// causal (softmax_forward only): rows are the query rows of square [.., T, T] score
// matrices; row r attends to columns j <= r % T, the rest get probability 0 (the causal mask
// of self-attention). softmax_backward needs no mask: y = 0 there gives dx = 0.

struct Params {
    rows: u32,
    cols: u32,
    causal: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> labels: array<u32>;
@group(0) @binding(3) var<storage, read_write> loss: array<f32>;
@group(0) @binding(4) var<storage, read_write> probs: array<f32>;

// The maximum m and sum of exp(x - m) of a row's first `len` columns.
fn max_and_sum(lid: u32, base: u32, len: u32) -> vec2<f32> {
    var m = bitcast<f32>(0xff800000u);
    for (var j = lid; j < len; j += ROW_LANES) {
        m = max(m, x[base + j]);
    }
    m = tree_max(lid, m);
    var s = 0.0;
    for (var j = lid; j < len; j += ROW_LANES) {
        s += det_exp(x[base + j] - m);
    }
    return vec2<f32>(m, tree_sum(lid, s));
}

@compute @workgroup_size(ROW_LANES)
fn xent_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = row_id(wid, nwg);
    if (r >= p.rows) {
        return;
    }
    let base = r * p.cols;
    let ms = max_and_sum(lid, base, p.cols);
    let m = ms.x;
    let s = ms.y;
    let inv = 1.0 / s;
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        probs[base + j] = det_exp(x[base + j] - m) * inv;
    }
    if (lid == 0u) {
        let label = labels[r];
        var target_logit = m + det_log(s);
        if (label < p.cols) {
            target_logit = x[base + label];
        }
        loss[r] = det_log(s) + m - target_logit;
    }
}

@group(0) @binding(1) var<storage, read> probs_in: array<f32>;
@group(0) @binding(3) var<storage, read> dloss: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256)
fn xent_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= p.rows * p.cols) {
        return;
    }
    let r = i / p.cols;
    let j = i % p.cols;
    let onehot = select(0.0, 1.0, labels[r] == j);
    dx[i] = (probs_in[i] - onehot) * dloss[r];
}

@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(ROW_LANES)
fn softmax_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = row_id(wid, nwg);
    if (r >= p.rows) {
        return;
    }
    let base = r * p.cols;
    var len = p.cols;
    if (p.causal != 0u) {
        len = r % p.cols + 1u;
    }
    let ms = max_and_sum(lid, base, len);
    let m = ms.x;
    let s = ms.y;
    let inv = 1.0 / s;
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        var v = 0.0;
        if (j < len) {
            v = det_exp(x[base + j] - m) * inv;
        }
        y[base + j] = v;
    }
}

// softmax_backward binds y at 1, dy at 2, dx at 3.
@group(0) @binding(1) var<storage, read> y_in: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx_soft: array<f32>;

@compute @workgroup_size(ROW_LANES)
fn softmax_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = row_id(wid, nwg);
    if (r >= p.rows) {
        return;
    }
    let base = r * p.cols;
    var s = 0.0;
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        s += dy[base + j] * y_in[base + j];
    }
    s = tree_sum(lid, s);
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        dx_soft[base + j] = y_in[base + j] * (dy[base + j] - s);
    }
}
