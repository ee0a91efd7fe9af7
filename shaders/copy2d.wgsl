// Strided 2-D copy, batched: out[z][r][c] = in[z * in_batch + r * in_row + c * in_col] for
// r < in_rows and c < in_cols, and 0 elsewhere in the [rows, cols] output. One kernel covers
// transpose (swap the input strides), padding (output larger than the input) and cropping
// (output smaller).

struct Params {
    rows: u32,
    cols: u32,
    batch: u32,
    _pad0: u32,
    in_rows: u32,
    in_cols: u32,
    in_row: u32,
    in_col: u32,
    in_batch: u32,
    _pad1: u32,
    _pad2: u32,
    _pad3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    let per_batch = p.rows * p.cols;
    if (i >= per_batch * p.batch) {
        return;
    }
    let z = i / per_batch;
    let rc = i % per_batch;
    let r = rc / p.cols;
    let c = rc % p.cols;
    var v = 0.0;
    if (r < p.in_rows && c < p.in_cols) {
        v = src[z * p.in_batch + r * p.in_row + c * p.in_col];
    }
    dst[i] = v;
}
