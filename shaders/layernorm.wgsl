// Layer normalization over the last axis of [rows, cols]:
//   y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(var + eps)  (biased variance).
// `forward`: one workgroup per row (64 invocations, fixed-order tree sums); keeps mean and
//   rstd per row for the backward pass. The CPU reference (kernels/layernorm.rs) computes
//   the same expressions in the same order.
// `backward_input`: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
// `backward_params`: one invocation per column sums over rows in order:
//   dgamma = sum_r dy * xhat,  dbeta = sum_r dy.

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    // backward_params: this launch sums rows [span_start, span_start + LOOP_SPAN), adding
    // to the partial sums already in dgamma and dbeta when span_start > 0.
    span_start: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> stats: array<f32>; // [rows][mean, rstd]

@compute @workgroup_size(ROW_LANES)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = row_id(wid, nwg);
    if (r >= p.rows) {
        return;
    }
    let base = r * p.cols;
    let n = f32(p.cols);
    var s = 0.0;
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        s += x[base + j];
    }
    let mean = tree_sum(lid, s) / n;
    var v = 0.0;
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        let d = x[base + j] - mean;
        v += d * d;
    }
    let rstd = 1.0 / sqrt(tree_sum(lid, v) / n + p.eps);
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        y[base + j] = (x[base + j] - mean) * rstd * gamma[j] + beta[j];
    }
    if (lid == 0u) {
        stats[2u * r] = mean;
        stats[2u * r + 1u] = rstd;
    }
}

// backward_input binds x 1, gamma 2, stats 3, dy 4, dx 5.
@group(0) @binding(3) var<storage, read> stats_in: array<f32>;
@group(0) @binding(4) var<storage, read> dy: array<f32>;
@group(0) @binding(5) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(ROW_LANES)
fn backward_input(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = row_id(wid, nwg);
    if (r >= p.rows) {
        return;
    }
    let base = r * p.cols;
    let n = f32(p.cols);
    let mean = stats_in[2u * r];
    let rstd = stats_in[2u * r + 1u];
    var sg = 0.0;
    var sgx = 0.0;
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        let xhat = (x[base + j] - mean) * rstd;
        let g = dy[base + j] * gamma[j];
        sg += g;
        sgx += g * xhat;
    }
    let mean_g = tree_sum(lid, sg) / n;
    let mean_gx = tree_sum(lid, sgx) / n;
    for (var j = lid; j < p.cols; j += ROW_LANES) {
        let xhat = (x[base + j] - mean) * rstd;
        let g = dy[base + j] * gamma[j];
        dx[base + j] = rstd * (g - mean_g - xhat * mean_gx);
    }
}

// backward_params binds x 1, stats 2, dy 3, dgamma 4, dbeta 5.
@group(0) @binding(2) var<storage, read> p_stats: array<f32>;
@group(0) @binding(3) var<storage, read> p_dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> dgamma: array<f32>;
@group(0) @binding(5) var<storage, read_write> dbeta: array<f32>;

@compute @workgroup_size(256)
fn backward_params(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let j = flat_index(wid, nwg, lid);
    if (j >= p.cols) {
        return;
    }
    var sg = 0.0;
    var sb = 0.0;
    if (p.span_start > 0u) {
        sg = dgamma[j];
        sb = dbeta[j];
    }
    for (var r = p.span_start; r < min(p.span_start + LOOP_SPAN, p.rows); r++) {
        let xhat = (x[r * p.cols + j] - p_stats[2u * r]) * p_stats[2u * r + 1u];
        let d = p_dy[r * p.cols + j];
        sg += d * xhat;
        sb += d;
    }
    dgamma[j] = sg;
    dbeta[j] = sb;
}
