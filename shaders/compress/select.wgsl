// Exact top-k selection by u32 keys, ties to the lower index (engine/src/compress/select.rs is
// the definition). Counting is integer, so every order of atomic increments gives the same
// result. Kernels, in launch order:
//   hist_high, find_high   the 16-bit bin holding the k-th largest key
//   hist_low, find_low     the exact threshold key T and how many keys equal to T to take
//   block_counts           per block of 4096 elements: keys > T and keys == T
//   block_offsets          one invocation walks the blocks: equal-before and selected-before
//   compact                the selected indices, in increasing order, into `out`
// KEY: 0 = |x| bits (top-k), 1 = a random word of (seed, step, key, i) (random-k),
//      2 = bit i of the mask words src[mask_offset..] (support of a hybrid payload; the host
//      sets T = 1 and take_equal = k itself and skips the threshold kernels).
//
// Every entry binds the same five buffers (touching unused ones with phony assignments), so
// the host passes one list: src, state, hist, blocks, out.

struct Params {
    n: u32,
    k: u32,
    step: u32,
    key: u32,
    seed: vec2<u32>,
    mask_offset: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
// [0] high bin, [1] count above it, [2] threshold T, [3] equal keys to take
@group(0) @binding(2) var<storage, read_write> state: array<u32>;
@group(0) @binding(3) var<storage, read_write> hist: array<atomic<u32>>;
// Per block: [4b] keys > T, [4b + 1] keys == T, [4b + 2] equal before, [4b + 3] selected before
@group(0) @binding(4) var<storage, read_write> blocks: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;

override KEY: u32 = 0u;

const BLOCK: u32 = 4096u;
const PER_THREAD: u32 = 16u;

fn key_of(i: u32) -> u32 {
    switch KEY {
        case 0u: { return bitcast<u32>(clean(bitcast<f32>(src[i]))) & 0x7fffffffu; }
        case 1u: { return element_block(p.seed, p.step, p.key, i / 4u)[i % 4u]; }
        default: { return (src[p.mask_offset + i / 32u] >> (i % 32u)) & 1u; }
    }
}

fn touch_all() {
    _ = src[0];
    _ = state[0];
    _ = atomicLoad(&hist[0]);
    _ = blocks[0];
    _ = out[0];
}

@compute @workgroup_size(256)
fn hist_high(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let i = flat_index(wid, nwg, lid);
    if (i < p.n) {
        atomicAdd(&hist[key_of(i) >> 16u], 1u);
    }
}

@compute @workgroup_size(256)
fn hist_low(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let i = flat_index(wid, nwg, lid);
    if (i < p.n) {
        let k = key_of(i);
        if ((k >> 16u) == state[0]) {
            atomicAdd(&hist[k & 0xffffu], 1u);
        }
    }
}

var<workgroup> lane_sums: array<u32, 256>;

// Finds, walking 65536 bins from the top, the bin where the count reaches `want`: lane t sums
// bins 65535 - 256t down to 65280 - 256t, then one invocation walks lanes and bins in order.
fn find_bin(lid: u32, want: u32) -> vec2<u32> {
    var s = 0u;
    for (var j = 0u; j < 256u; j++) {
        s += atomicLoad(&hist[65535u - 256u * lid - j]);
    }
    lane_sums[lid] = s;
    workgroupBarrier();
    var result = vec2<u32>(0u, 0u);
    if (lid == 0u) {
        var above = 0u;
        var lane = 0u;
        while (lane < 255u && above + lane_sums[lane] < want) {
            above += lane_sums[lane];
            lane++;
        }
        var bin = 65535u - 256u * lane;
        for (var j = 0u; j < 255u; j++) {
            let c = atomicLoad(&hist[bin]);
            if (above + c >= want) {
                break;
            }
            above += c;
            bin--;
        }
        result = vec2<u32>(bin, above);
    }
    return result;
}

@compute @workgroup_size(256)
fn find_high(@builtin(local_invocation_index) lid: u32) {
    touch_all();
    let r = find_bin(lid, p.k);
    if (lid == 0u) {
        state[0] = r.x;
        state[1] = r.y;
    }
}

@compute @workgroup_size(256)
fn find_low(@builtin(local_invocation_index) lid: u32) {
    touch_all();
    let above_high = state[1];
    let r = find_bin(lid, p.k - above_high);
    if (lid == 0u) {
        state[2] = (state[0] << 16u) | r.x;
        state[3] = p.k - above_high - r.y;
    }
}

var<workgroup> counts: array<u32, 512>;

@compute @workgroup_size(256)
fn block_counts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let b = wid.y * nwg.x + wid.x;
    if (b * BLOCK >= max(p.n, 1u)) {
        return;
    }
    let t = state[2];
    var gt = 0u;
    var eq = 0u;
    let first = b * BLOCK + lid * PER_THREAD;
    for (var j = 0u; j < PER_THREAD; j++) {
        let i = first + j;
        if (i < p.n) {
            let k = key_of(i);
            gt += u32(k > t);
            eq += u32(k == t);
        }
    }
    counts[lid] = gt;
    counts[256u + lid] = eq;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w / 2u) {
        if (lid < w) {
            counts[lid] += counts[lid + w];
            counts[256u + lid] += counts[256u + lid + w];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        blocks[4u * b] = counts[0];
        blocks[4u * b + 1u] = counts[256];
    }
}

@compute @workgroup_size(1)
fn block_offsets() {
    touch_all();
    let nblocks = (p.n + BLOCK - 1u) / BLOCK;
    let take = state[3];
    var eq_before = 0u;
    var sel_before = 0u;
    for (var b = 0u; b < nblocks; b++) {
        blocks[4u * b + 2u] = eq_before;
        blocks[4u * b + 3u] = sel_before;
        let eq = blocks[4u * b + 1u];
        var eq_taken = 0u;
        if (take > eq_before) {
            eq_taken = min(eq, take - eq_before);
        }
        sel_before += blocks[4u * b] + eq_taken;
        eq_before += eq;
    }
}

var<workgroup> eq_prefix: array<u32, 256>;
var<workgroup> sel_prefix: array<u32, 256>;

// Exclusive prefix sums over the 256 lanes, by one invocation (cheap beside the block's
// 4096 key evaluations). The last invocation runs it, not the first: lavapipe runs a
// workgroup's invocations in batches, in order, from barrier to barrier, so readers in
// earlier batches then come before the scan, and a missing barrier after it fails the tests
// there instead of passing by luck.
fn exclusive_scan(lid: u32, v: u32, which: u32) -> u32 {
    if (which == 0u) {
        eq_prefix[lid] = v;
    } else {
        sel_prefix[lid] = v;
    }
    workgroupBarrier();
    if (lid == 255u) {
        var run = 0u;
        for (var t = 0u; t < 256u; t++) {
            if (which == 0u) {
                let c = eq_prefix[t];
                eq_prefix[t] = run;
                run += c;
            } else {
                let c = sel_prefix[t];
                sel_prefix[t] = run;
                run += c;
            }
        }
    }
    workgroupBarrier();
    if (which == 0u) {
        return eq_prefix[lid];
    }
    return sel_prefix[lid];
}

@compute @workgroup_size(256)
fn compact(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let b = wid.y * nwg.x + wid.x;
    if (b * BLOCK >= p.n) {
        return;
    }
    let t = state[2];
    let take = state[3];
    let first = b * BLOCK + lid * PER_THREAD;
    var eq = 0u;
    for (var j = 0u; j < PER_THREAD; j++) {
        let i = first + j;
        if (i < p.n) {
            eq += u32(key_of(i) == t);
        }
    }
    var eq_seen = blocks[4u * b + 2u] + exclusive_scan(lid, eq, 0u);
    var sel = 0u;
    let eq_start = eq_seen;
    for (var j = 0u; j < PER_THREAD; j++) {
        let i = first + j;
        if (i < p.n) {
            let k = key_of(i);
            if (k > t || (k == t && eq_seen < take)) {
                sel++;
            }
            eq_seen += u32(k == t);
        }
    }
    var pos = blocks[4u * b + 3u] + exclusive_scan(lid, sel, 1u);
    eq_seen = eq_start;
    for (var j = 0u; j < PER_THREAD; j++) {
        let i = first + j;
        if (i < p.n) {
            let k = key_of(i);
            if (k > t || (k == t && eq_seen < take)) {
                if (pos < p.k) {
                    out[pos] = i;
                }
                pos++;
            }
            eq_seen += u32(k == t);
        }
    }
}
