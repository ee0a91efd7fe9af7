// Error-feedback memories (engine/src/feedback/mod.rs is the definition; same operations in
// the same order).
// `residual_compensate`: q = clean(g + e).   `clean_copy`: out = clean(g).
// `loco_compensate`:     h = g + f32(e_q) * inv_se, e_q int8, four per word (LSB first).
// `loco_update`:         one invocation per word of four int8 codes:
//     prev = (REFERENCE ? et : f32(e_q) * inv_se)
//     et_new = prev * keep + r * beta           (keep = 1 - beta, from the host)
//     reset ? (e_q, et) = 0 : e_q = clamp(rne(et_new * se), -128, 127), et = et_new

struct Params {
    n: u32,
    reset: u32,
    inv_se: f32,
    se: f32,
    keep: f32,
    beta: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

override REFERENCE: bool = false;

fn code_of(word: u32, lane: u32) -> f32 {
    return f32(sign_extend((word >> (8u * lane)) & 0xffu, 8u));
}

@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> e: array<f32>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;

@compute @workgroup_size(256)
fn residual_compensate(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.n) {
        q[i] = clean(g[i] + e[i]);
    }
}

@group(0) @binding(2) var<storage, read_write> copy_out: array<f32>;

// out = clean(g): the start of a residual in the int8-memory path.
@compute @workgroup_size(256)
fn clean_copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.n) {
        copy_out[i] = clean(g[i]);
    }
}

@group(0) @binding(2) var<storage, read> eq_in: array<u32>;

@compute @workgroup_size(256)
fn loco_compensate(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.n) {
        q[i] = g[i] + code_of(eq_in[i / 4u], i % 4u) * p.inv_se;
    }
}

@group(0) @binding(1) var<storage, read> r: array<f32>;
@group(0) @binding(2) var<storage, read_write> eq: array<u32>;
@group(0) @binding(3) var<storage, read_write> et: array<f32>;

@compute @workgroup_size(256)
fn loco_update(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    _ = et[0];
    let w = flat_index(wid, nwg, lid);
    if (4u * w >= p.n) {
        return;
    }
    let old = eq[w];
    var word = 0u;
    for (var lane = 0u; lane < 4u; lane++) {
        let i = 4u * w + lane;
        if (i >= p.n) {
            break;
        }
        var prev = code_of(old, lane) * p.inv_se;
        if (REFERENCE) {
            prev = et[i];
        }
        let et_new = prev * p.keep + r[i] * p.beta;
        if (p.reset != 0u) {
            if (REFERENCE) {
                et[i] = 0.0;
            }
        } else {
            let c = i32(clamp(round(et_new * p.se), -128.0, 127.0));
            word = word | (to_pattern(c, 8u) << (8u * lane));
            if (REFERENCE) {
                et[i] = et_new;
            }
        }
    }
    eq[w] = word;
}
