// Batched matrix product for GPUs: C[z] = op(A[z]) * op(B[z]), op = transpose when TRANS_A /
// TRANS_B. A is [M, K] (or [K, M] when transposed), B is [K, N] (or [N, K]), C is [M, N], all
// row-major; z is the batch index (dispatch z), each operand with its own batch stride (0
// broadcasts one matrix to every batch).
//
// Each 16x16 workgroup computes a 64x64 tile of C, each thread a 4x4 block held in registers.
// K advances 16 at a time through workgroup memory; tile loads fill out-of-range elements with
// zeros, so any shape is correct (1, primes, non-multiples of the tile). Tiles are stored with
// the reduction dimension outermost, so that the inner loop reads a vec4 of A rows and a vec4
// of B columns per step.

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
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

override TRANS_A: bool = false;
override TRANS_B: bool = false;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;
const THREADS: u32 = 256u;

// [BK][BM] and [BK][BN], as scalars: threads store single elements, and a store to one lane
// of a vec4 in workgroup memory may write the whole vector (WGSL leaves it to the back end;
// MSL and HLSL compilers may emit a read-modify-write), which would race with the threads
// storing its other lanes. The compute loop reads them back as vec4s of 4 scalars.
var<workgroup> a_tile: array<f32, 1024>;
var<workgroup> b_tile: array<f32, 1024>;

fn a4(at: u32) -> vec4<f32> {
    return vec4<f32>(a_tile[at], a_tile[at + 1u], a_tile[at + 2u], a_tile[at + 3u]);
}

fn b4(at: u32) -> vec4<f32> {
    return vec4<f32>(b_tile[at], b_tile[at + 1u], b_tile[at + 2u], b_tile[at + 3u]);
}

// Logical A[row][kk] of batch `base`, zero outside the matrix.
fn load_a(base: u32, row: u32, kk: u32) -> f32 {
    if (row >= p.m || kk >= p.k) {
        return 0.0;
    }
    if (TRANS_A) {
        return a[base + kk * p.m + row];
    }
    return a[base + row * p.k + kk];
}

// Logical B[kk][col] of batch `base`, zero outside the matrix.
fn load_b(base: u32, kk: u32, col: u32) -> f32 {
    if (kk >= p.k || col >= p.n) {
        return 0.0;
    }
    if (TRANS_B) {
        return b[base + col * p.k + kk];
    }
    return b[base + kk * p.n + col];
}

@compute @workgroup_size(16, 16)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let z = wid.z + p.batch_offset;
    let row0 = (wid.y + p.row_group_offset) * BM;
    let col0 = (wid.x + p.col_group_offset) * BN;
    let a_base = z * p.a_batch_stride;
    let b_base = z * p.b_batch_stride;

    let c_base = z * p.c_batch_stride;
    let col = col0 + lid.x * 4u;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
        let row = row0 + lid.y * 4u + i;
        if (p.k_start > 0u && row < p.m) {
            for (var j = 0u; j < 4u; j++) {
                if (col + j < p.n) {
                    acc[i][j] = c[c_base + row * p.n + col + j];
                }
            }
        }
    }

    for (var k0 = p.k_start; k0 < p.k_stop; k0 += BK) {
        // 1024 elements per tile, 4 per thread. Consecutive threads walk the operand's
        // contiguous dimension so that global reads coalesce.
        for (var s = 0u; s < 4u; s++) {
            let t = li + s * THREADS;
            var r: u32;
            var kk: u32;
            if (TRANS_A) {
                kk = t / BM;
                r = t % BM;
            } else {
                r = t / BK;
                kk = t % BK;
            }
            a_tile[kk * BM + r] = load_a(a_base, row0 + r, k0 + kk);

            var cc: u32;
            var kb: u32;
            if (TRANS_B) {
                cc = t / BK;
                kb = t % BK;
            } else {
                kb = t / BN;
                cc = t % BN;
            }
            b_tile[kb * BN + cc] = load_b(b_base, k0 + kb, col0 + cc);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let av = a4(kk * BM + 4u * lid.y);
            let bv = b4(kk * BN + 4u * lid.x);
            acc[0] = fma(vec4<f32>(av.x), bv, acc[0]);
            acc[1] = fma(vec4<f32>(av.y), bv, acc[1]);
            acc[2] = fma(vec4<f32>(av.z), bv, acc[2]);
            acc[3] = fma(vec4<f32>(av.w), bv, acc[3]);
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < 4u; i++) {
        let row = row0 + lid.y * 4u + i;
        if (row < p.m) {
            for (var j = 0u; j < 4u; j++) {
                if (col + j < p.n) {
                    c[c_base + row * p.n + col + j] = acc[i][j];
                }
            }
        }
    }
}
