// Elementwise unary functions and their derivatives. OP selects the function at pipeline
// creation, so each variant compiles to a branch-free kernel:
//   0 relu   1 gelu (tanh approximation, written as x * sigmoid(2u), which has no
//   cancellation for negative x)   2 tanh   3 sigmoid   4 exp   5 log
//   6 sqrt   7 square   8 abs   9 affine (alpha * x + beta)
// `forward` writes y = f(x); `backward` writes dx = dy * f'(x), recomputing f from x.
// The CPU reference is kernels/unary.rs; keep the formulas identical.

struct Params {
    n: u32,
    alpha: f32,
    beta: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

override OP: u32 = 0u;

const GELU_C: f32 = 0.7978845608028654; // sqrt(2 / pi)
const GELU_A: f32 = 0.044715;

// tanh that stays finite: some drivers compute tanh through exp(2x) and return NaN for |x| > 44.
fn safe_tanh(x: f32) -> f32 {
    return tanh(clamp(x, -15.0, 15.0));
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn f(x: f32) -> f32 {
    switch OP {
        case 0u: { return max(x, 0.0); }
        case 1u: { return x * sigmoid(2.0 * GELU_C * (x + GELU_A * x * x * x)); }
        case 2u: { return safe_tanh(x); }
        case 3u: { return sigmoid(x); }
        case 4u: { return exp(x); }
        case 5u: { return log(x); }
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
            let s = sigmoid(2.0 * GELU_C * (x + GELU_A * x * x * x));
            return s + 2.0 * x * s * (1.0 - s) * GELU_C * (1.0 + 3.0 * GELU_A * x * x);
        }
        case 2u: { let t = safe_tanh(x); return 1.0 - t * t; }
        case 3u: { let s = sigmoid(x); return s * (1.0 - s); }
        case 4u: { return exp(x); }
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
