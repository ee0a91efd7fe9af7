// Elementwise unary functions and their derivatives. OP selects the function at pipeline
// creation, so each variant compiles to a branch-free kernel:
//   0 relu   1 gelu (tanh approximation, written as x * sigmoid(2u), which has no
//   cancellation for negative x)   2 tanh   3 sigmoid   4 exp   5 log
//   6 sqrt   7 square   8 abs   9 affine (alpha * x + beta)
// `forward` writes y = f(x); `backward` writes dx = dy * f'(x), recomputing f from x.
// exp, log, tanh and sigmoid come from common/math.wgsl, so results match the CPU reference
// (kernels/unary.rs, same formulas in the same order) bit for bit on non-contracting drivers.

struct Params {
    n: u32,
    alpha: f32,
    beta: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

override OP: u32 = 0u;

// sqrt(2 / pi). GELU's cubic coefficient A and 3 * A * GELU_C (rounded as f32 products) come
// in p.alpha and p.beta, not as constants: GLSL compilers may regroup a product chain with a
// constant factor (Mesa's OpenGL path makes A * x * x * x into A * (x * x * x)), and a value
// from the uniform block leaves them nothing to regroup (kernels/unary.rs, alpha_beta).
const GELU_C: f32 = 0.797884583473205566;

fn f(x: f32) -> f32 {
    switch OP {
        case 0u: { return max(x, 0.0); }
        case 1u: { return x * det_sigmoid(2.0 * GELU_C * (x + p.alpha * x * x * x)); }
        case 2u: { return det_tanh(x); }
        case 3u: { return det_sigmoid(x); }
        case 4u: { return det_exp(x); }
        case 5u: { return det_log(x); }
        case 6u: { return sqrt(x); }
        case 7u: { return x * x; }
        case 8u: { return abs(x); }
        default: { return p.alpha * x + p.beta; }
    }
}

fn df(x: f32) -> f32 {
    switch OP {
        case 0u: { return select(0.0, 1.0, x > 0.0); }
        case 1u: {
            // s + 2 x s (1 - s) u'(x) with u'(x) = GELU_C + 3 A GELU_C x^2 (p.beta = 3 A GELU_C).
            // The constants left are 2, whose regrouping is exact, and GELU_C, which stands
            // alone in its sum.
            let s = det_sigmoid(2.0 * GELU_C * (x + p.alpha * x * x * x));
            let du = GELU_C + p.beta * x * x;
            return s + 2.0 * x * s * (1.0 - s) * du;
        }
        case 2u: { let t = det_tanh(x); return 1.0 - t * t; }
        case 3u: { let s = det_sigmoid(x); return s * (1.0 - s); }
        case 4u: { return det_exp(x); }
        case 5u: { return 1.0 / x; }
        case 6u: { return 0.5 / sqrt(x); }
        case 7u: { return 2.0 * x; }
        case 8u: { return sign(x); }
        default: { return p.alpha; }
    }
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.n) {
        y[i] = f(x[i]);
    }
}

// `backward` binds x at 1, dy at 2 and dx at 3 (resources may share a binding number when no
// entry point uses both).
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i < p.n) {
        dx[i] = dy[i] * df(x[i]);
    }
}
