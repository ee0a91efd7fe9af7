//! Optimizer update kernels over flat parameter buffers (optim.wgsl), in place.

use bytemuck::{Pod, Zeroable};
use rayon::prelude::*;

use super::{grid_1d, OPTIM};
use crate::cpu::adamw::{self, AdamWConstants};
use crate::cpu::vector_unit::widest;
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

/// One SGD update, PyTorch semantics (see optim.wgsl).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor (0: plain SGD, no momentum buffer).
    pub momentum: f32,
    /// Dampening of the gradient in the momentum update.
    pub dampening: f32,
    /// L2 penalty added to the gradient, `g + weight_decay * w`.
    pub weight_decay: f32,
    /// Whether to use Nesterov momentum, `g + momentum * buf`.
    pub nesterov: bool,
    /// First step: the momentum buffer starts as the gradient.
    pub first: bool,
}

/// One AdamW update, PyTorch semantics; `step` counts from 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first-moment (mean) estimate.
    pub beta1: f32,
    /// Decay of the second-moment (uncentred variance) estimate.
    pub beta2: f32,
    /// Added to the denominator for numerical stability.
    pub eps: f32,
    /// Decoupled weight decay: the weights are scaled by `1 - lr * weight_decay` before the update.
    pub weight_decay: f32,
    /// The update's number, counting from 1, for the bias corrections.
    pub step: u64,
}

impl AdamWStep {
    /// Bias corrections `1 - beta1^t` and `sqrt(1 - beta2^t)`, computed in f64.
    fn corrections(&self) -> (f32, f32) {
        let t = self.step.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - (self.beta1 as f64).powi(t);
        let bc2 = 1.0 - (self.beta2 as f64).powi(t);
        (bc1 as f32, bc2.sqrt() as f32)
    }
}

/// CPU reference of one SGD update.
pub fn sgd_ref(w: &mut [f32], grad: &[f32], buf: &mut [f32], s: &SgdStep) {
    for i in 0..w.len() {
        let mut g = grad[i] + s.weight_decay * w[i];
        if s.momentum != 0.0 {
            let b = if s.first {
                g
            } else {
                s.momentum * buf[i] + (1.0 - s.dampening) * g
            };
            buf[i] = b;
            g = if s.nesterov { g + s.momentum * b } else { b };
        }
        w[i] -= s.lr * g;
    }
}

/// CPU reference of one AdamW update (`cpu::adamw::element` on each element); each
/// element's update depends on that element alone, so it runs over rayon in chunks (the same
/// bits as one pass), and blocks near the subnormal numbers take f64 (the same bits again,
/// without the microcode assists that subnormals cost, `cpu::adamw`).
pub fn adamw_ref(w: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWStep) {
    assert!(grad.len() == w.len() && m.len() == w.len() && v.len() == w.len());
    let k = AdamWConstants::new(
        s.lr,
        (s.beta1, s.beta2),
        s.eps,
        s.weight_decay,
        s.corrections(),
    );
    // On the widest vector unit (square roots and divisions ran 4 lanes at a time on the
    // baseline's SSE2).
    let chunk = |w: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]| {
        widest(
            #[inline(always)]
            || adamw::update(w, grad, m, v, &k),
        )
    };
    const CHUNK: usize = crate::cpu::elementwise::CHUNK;
    if w.len() <= CHUNK {
        chunk(w, grad, m, v);
    } else {
        w.par_chunks_mut(CHUNK)
            .zip(grad.par_chunks(CHUNK))
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .for_each(|(((w, g), m), v)| chunk(w, g, m, v));
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SgdParams {
    n: u32,
    lr: f32,
    momentum: f32,
    dampening: f32,
    weight_decay: f32,
    nesterov: u32,
    first: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
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

fn check(op: &'static str, w: &Tensor, others: &[&Tensor]) -> Result<()> {
    w.expect_dtype(op, DType::F32)?;
    for t in others {
        t.expect_dtype(op, DType::F32)?;
        w.same_device(op, t)?;
        if t.shape() != w.shape() {
            return shape_err(
                op,
                format!("parameter {:?} and state {:?}", w.shape(), t.shape()),
            );
        }
    }
    Ok(())
}

/// Updates `w` and the momentum buffer `buf` in place.
pub fn sgd_step(w: &mut Tensor, grad: &Tensor, buf: &mut Tensor, s: &SgdStep) -> Result<()> {
    check("sgd", w, &[grad, buf])?;
    match w.device().clone() {
        Device::Cpu => {
            let g = grad.cpu_f32().expect("cpu");
            sgd_ref(
                w.cpu_f32_mut().expect("cpu"),
                g,
                buf.cpu_f32_mut().expect("cpu"),
                s,
            );
        }
        Device::Gpu(gpu) => {
            let n = w.numel();
            let params = SgdParams {
                n: n as u32,
                lr: s.lr,
                momentum: s.momentum,
                dampening: s.dampening,
                weight_decay: s.weight_decay,
                nesterov: s.nesterov as u32,
                first: s.first as u32,
                _pad: 0,
            };
            let pipeline = gpu.pipeline(&OPTIM, "sgd", &[]);
            w.make_unique()?;
            let wb = w.gpu_buf().expect("gpu");
            buf.make_unique()?;
            let bb = buf.gpu_buf().expect("gpu");
            gpu.launch(
                &pipeline,
                &params,
                &[wb, grad.gpu_buf().expect("gpu"), bb],
                grid_1d(n),
            );
        }
    }
    Ok(())
}

/// Updates `w` and the moments `m`, `v` in place.
pub fn adamw_step(
    w: &mut Tensor,
    grad: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    s: &AdamWStep,
) -> Result<()> {
    check("adamw", w, &[grad, m, v])?;
    match w.device().clone() {
        Device::Cpu => {
            let g = grad.cpu_f32().expect("cpu");
            adamw_ref(
                w.cpu_f32_mut().expect("cpu"),
                g,
                m.cpu_f32_mut().expect("cpu"),
                v.cpu_f32_mut().expect("cpu"),
                s,
            );
        }
        Device::Gpu(gpu) => {
            let n = w.numel();
            let (bc1, bc2_sqrt) = s.corrections();
            let params = AdamParams {
                n: n as u32,
                lr: s.lr,
                beta1: s.beta1,
                beta2: s.beta2,
                eps: s.eps,
                weight_decay: s.weight_decay,
                bc1,
                bc2_sqrt,
            };
            let pipeline = gpu.pipeline(&OPTIM, "adamw", &[]);
            w.make_unique()?;
            let wb = w.gpu_buf().expect("gpu");
            m.make_unique()?;
            let mb = m.gpu_buf().expect("gpu");
            v.make_unique()?;
            let vb = v.gpu_buf().expect("gpu");
            gpu.launch(
                &pipeline,
                &params,
                &[wb, grad.gpu_buf().expect("gpu"), mb, vb],
                grid_1d(n),
            );
        }
    }
    Ok(())
}
