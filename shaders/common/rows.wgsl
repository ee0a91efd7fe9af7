// Row reductions by one workgroup of ROW_LANES invocations: each lane folds a strided part of
// the row, then the lanes combine as a binary tree in workgroup memory, always in the same
// order (the CPU references reproduce it with kernels::math::workgroup_sum). Call from
// uniform control flow: the functions contain barriers.

const ROW_LANES: u32 = 64u;
var<workgroup> row_scratch: array<f32, 64>;

// The row a workgroup owns in a 2-D grid of workgroups.
fn row_id(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

fn tree_max(lid: u32, v: f32) -> f32 {
    row_scratch[lid] = v;
    workgroupBarrier();
    for (var w = ROW_LANES / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            row_scratch[lid] = max(row_scratch[lid], row_scratch[lid + w]);
        }
        workgroupBarrier();
    }
    let r = row_scratch[0];
    workgroupBarrier();
    return r;
}

fn tree_sum(lid: u32, v: f32) -> f32 {
    row_scratch[lid] = v;
    workgroupBarrier();
    for (var w = ROW_LANES / 2u; w > 0u; w = w / 2u) {
        if (lid < w) {
            row_scratch[lid] = row_scratch[lid] + row_scratch[lid + w];
        }
        workgroupBarrier();
    }
    let r = row_scratch[0];
    workgroupBarrier();
    return r;
}
