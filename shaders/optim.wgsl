// Optimizer updates, in place over flat parameter buffers; the formulas follow PyTorch's
// torch.optim.SGD and torch.optim.AdamW so that runs can be compared with it.
//
// `sgd`:   g = grad + weight_decay * w
//          momentum == 0: w -= lr * g
//          otherwise:     buf = first ? g : momentum * buf + (1 - dampening) * g
//                         w -= lr * (nesterov ? g + momentum * buf : buf)
// `adamw`: w *= 1 - lr * weight_decay
//          m = b1 * m + (1 - b1) * grad;  v = b2 * v + (1 - b2) * grad^2
//          w -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc = 1 - beta^step (host).

struct SgdParams {
    n: u32,
    lr: f32,
    momentum: f32,
    dampening: f32,
    weight_decay: f32,
    nesterov: u32,
    first: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> sp: SgdParams;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> buf: array<f32>;

@compute @workgroup_size(256)
fn sgd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= sp.n) {
        return;
    }
    var g = grad[i] + sp.weight_decay * w[i];
    if (sp.momentum != 0.0) {
        var b = g;
        if (sp.first == 0u) {
            b = sp.momentum * buf[i] + (1.0 - sp.dampening) * g;
        }
        buf[i] = b;
        if (sp.nesterov != 0u) {
            g = g + sp.momentum * b;
        } else {
            g = b;
        }
    }
    w[i] = w[i] - sp.lr * g;
}

struct AdamParams {
    n: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    bc1: f32,
    bc2_sqrt: f32,
}

@group(0) @binding(0) var<uniform> ap: AdamParams;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;

@compute @workgroup_size(256)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if (i >= ap.n) {
        return;
    }
    let g = grad[i];
    let mi = ap.beta1 * m[i] + (1.0 - ap.beta1) * g;
    let vi = ap.beta2 * v[i] + (1.0 - ap.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    let decayed = w[i] * (1.0 - ap.lr * ap.weight_decay);
    w[i] = decayed - (ap.lr / ap.bc1) * mi / (sqrt(vi) / ap.bc2_sqrt + ap.eps);
}
