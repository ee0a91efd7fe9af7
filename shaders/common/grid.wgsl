// Shared by the elementwise kernels: a flat element index from a 2-D grid of 256-wide
// workgroups. The host spreads large launches over y because a dimension holds at most 65535
// workgroups (see `kernels::grid_1d`).

const WG: u32 = 256u;

fn flat_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid;
}

// Most iterations of a data-dependent loop in one launch (kernels::LOOP_SPAN): llvmpipe
// (lavapipe) ends an invocation's loops after 65535 iterations in all, silently, so kernels
// that walk a whole axis per invocation (layer norm's parameter gradients, embedding's
// scatter-add, argmax) take one launch per span and carry their partial result in memory.
const LOOP_SPAN: u32 = 16384u;
