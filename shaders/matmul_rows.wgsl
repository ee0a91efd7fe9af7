// Batched matrix product for CPU adapters (lavapipe, WARP): C[z] = A[z] * B[z] with A [M, K],
// B [K, N], C [M, N] row-major, K a multiple of 4 and N a multiple of 8 (the host pads other
// shapes and transposes first; see kernels/matmul.rs).
//
// Why a second kernel: a software rasteriser runs a subgroup of invocations as SIMD lanes, so a
// load whose address is the same in every lane is one scalar load and a broadcast, while a load
// that differs per lane becomes a loop over the lanes. The shared-memory tiled kernel is
// nearly all per-lane loads; here every workgroup owns TM rows, so all A loads are uniform
// (vec4 along K), and each lane loads 8 consecutive columns of B per k, each reused for TM
// rows. Measured on a 2-core AVX2 machine through lavapipe: 4 GFLOPS for the tiled kernel, 30
// for this one (docs/benchmarks.md).

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // Added to the dispatch's z, y and x: grids beyond the adapter's workgroups per dimension
    // take several launches (kernels/matmul.rs, launch_split).
    batch_offset: u32,
    a_batch_stride: u32,
    b_batch_stride: u32,
    c_batch_stride: u32,
    row_group_offset: u32,
    col_group_offset: u32,
    // This launch sums k in [k_start, k_stop), continuing from C when k_start > 0 (the same
    // accumulation, carried through memory exactly): llvmpipe ends any invocation's loops
    // after 65535 iterations in all, so long products take several launches
    // (kernels/matmul.rs, K_SPAN).
    k_start: u32,
    k_stop: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c: array<vec4<f32>>;

// Rows per workgroup (uniform across its lanes) and lanes per workgroup (8 columns each).
// LANES shrinks for narrow outputs (a convolution's 16 or 32 channels, an attention head's
// width): lanes past the last column would only compute clamped copies, and a software
// rasteriser runs a workgroup as SIMD passes of its lanes, so fewer lanes is fewer passes.
const TM: u32 = 32u;
override LANES: u32 = 16u;

@compute @workgroup_size(LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let z = wid.z + p.batch_offset;
    let n4 = p.n / 4u;
    let k4 = p.k / 4u;
    let row0 = (wid.y + p.row_group_offset) * TM;
    // First of this lane's two vec4 columns; lanes past the edge compute a clamped copy and
    // do not store.
    let c4 = ((wid.x + p.col_group_offset) * LANES + lid.x) * 2u;
    let cc = min(c4, n4 - 2u);
    let a_base = z * (p.a_batch_stride / 4u);
    let b_base = z * (p.b_batch_stride / 4u) + cc;

    var lo: array<vec4<f32>, TM>;
    var hi: array<vec4<f32>, TM>;
    var rows: array<u32, TM>;
    let c_read = z * (p.c_batch_stride / 4u) + cc;
    for (var i = 0u; i < TM; i++) {
        // Rows past M repeat the last row: still uniform, never stored.
        let row = min(row0 + i, p.m - 1u);
        rows[i] = a_base + row * k4;
        if (p.k_start == 0u) {
            lo[i] = vec4<f32>(0.0);
            hi[i] = vec4<f32>(0.0);
        } else {
            lo[i] = c[c_read + row * n4];
            hi[i] = c[c_read + row * n4 + 1u];
        }
    }

    for (var k = p.k_start / 4u; k < p.k_stop / 4u; k++) {
        let r = b_base + 4u * k * n4;
        let b0 = b[r];
        let b1 = b[r + n4];
        let b2 = b[r + 2u * n4];
        let b3 = b[r + 3u * n4];
        let d0 = b[r + 1u];
        let d1 = b[r + n4 + 1u];
        let d2 = b[r + 2u * n4 + 1u];
        let d3 = b[r + 3u * n4 + 1u];
        for (var i = 0u; i < TM; i++) {
            let av = a[rows[i] + k];
            lo[i] = fma(vec4<f32>(av.x), b0, lo[i]);
            lo[i] = fma(vec4<f32>(av.y), b1, lo[i]);
            lo[i] = fma(vec4<f32>(av.z), b2, lo[i]);
            lo[i] = fma(vec4<f32>(av.w), b3, lo[i]);
            hi[i] = fma(vec4<f32>(av.x), d0, hi[i]);
            hi[i] = fma(vec4<f32>(av.y), d1, hi[i]);
            hi[i] = fma(vec4<f32>(av.z), d2, hi[i]);
            hi[i] = fma(vec4<f32>(av.w), d3, hi[i]);
        }
    }

    if (c4 < n4) {
        let c_base = z * (p.c_batch_stride / 4u) + c4;
        for (var i = 0u; i < TM; i++) {
            if (row0 + i < p.m) {
                c[c_base + (row0 + i) * n4] = lo[i];
                c[c_base + (row0 + i) * n4 + 1u] = hi[i];
            }
        }
    }
}
