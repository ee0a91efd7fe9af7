//! Elementwise unary functions and their derivatives (unary.wgsl).

use bytemuck::{Pod, Zeroable};

use super::{grid_1d, UNARY};
use crate::error::{shape_err, Result};
use crate::tensor::{DType, Device, Tensor};

/// A unary function. GELU uses the tanh approximation (as GPT-2 does), computed as
/// `x * sigmoid(2u)` with `u = sqrt(2/pi) (x + 0.044715 x^3)`: the same function as
/// `0.5 x (1 + tanh u)` without its cancellation for negative x.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation.
    Gelu,
    /// Hyperbolic tangent.
    Tanh,
    /// Logistic sigmoid `1 / (1 + e^-x)`.
    Sigmoid,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `x^2`.
    Square,
    /// `|x|`.
    Abs,
    /// `alpha * x + beta`: scaling, shifting and negation.
    Affine {
        /// Factor applied to `x`.
        alpha: f32,
        /// Offset added after scaling.
        beta: f32,
    },
}

use super::math::{exp, ln, sigmoid, sigmoid_block, tanh, EXP_BLOCK};

/// sqrt(2 / pi) and the cubic coefficient; the WGSL spells out the same f32 values.
const GELU_C: f32 = f32::from_bits(0x3f4c_422a);
const GELU_A: f32 = f32::from_bits(0x3d37_2713);
/// 3 * GELU_A * GELU_C as f32 products.
const GELU_C3A: f32 = f32::from_bits(0x3ddb_33b5);

impl Unary {
    fn code(self) -> u32 {
        match self {
            Unary::Relu => 0,
            Unary::Gelu => 1,
            Unary::Tanh => 2,
            Unary::Sigmoid => 3,
            Unary::Exp => 4,
            Unary::Log => 5,
            Unary::Sqrt => 6,
            Unary::Square => 7,
            Unary::Abs => 8,
            Unary::Affine { .. } => 9,
        }
    }

    /// The kernel's two run-time coefficients: affine's alpha and beta, and GELU's cubic
    /// coefficients (A and 3AC). GELU's are not WGSL constants because a GLSL compiler may
    /// regroup a product chain that holds a constant factor (Mesa's OpenGL path turns
    /// `A * x * x * x` into `A * (x * x * x)`), which changes the bits; a value read from the
    /// uniform block gives it nothing to regroup.
    fn alpha_beta(self) -> (f32, f32) {
        match self {
            Unary::Affine { alpha, beta } => (alpha, beta),
            Unary::Gelu => (GELU_A, GELU_C3A),
            _ => (1.0, 0.0),
        }
    }

    /// CPU reference of `f(x)`.
    // Always inlined, so that `per_op!`'s constant variant folds the `match` away in the
    // CPU path's loops.
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Unary::Relu => x.max(0.0),
            Unary::Gelu => x * gelu_gate(x),
            Unary::Tanh => tanh(x),
            Unary::Sigmoid => sigmoid(x),
            Unary::Exp => exp(x),
            Unary::Log => ln(x),
            Unary::Sqrt => x.sqrt(),
            Unary::Square => x * x,
            Unary::Abs => x.abs(),
            Unary::Affine { alpha, beta } => AffineOp { alpha, beta }.apply(x),
        }
    }

    /// CPU reference of `f'(x)`.
    #[inline(always)]
    pub fn derivative(self, x: f32) -> f32 {
        match self {
            Unary::Relu => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Unary::Gelu => gelu_derivative(x, gelu_gate(x)),
            Unary::Tanh => {
                let t = tanh(x);
                1.0 - t * t
            }
            Unary::Sigmoid => {
                let s = sigmoid(x);
                s * (1.0 - s)
            }
            Unary::Exp => exp(x),
            Unary::Log => 1.0 / x,
            Unary::Sqrt => 0.5 / x.sqrt(),
            Unary::Square => 2.0 * x,
            // WGSL's sign(0) is 0.
            Unary::Abs => {
                if x == 0.0 {
                    0.0
                } else {
                    x.signum()
                }
            }
            Unary::Affine { alpha, beta } => AffineOp { alpha, beta }.derivative(x),
        }
    }
}

/// GELU's gate `sigmoid(2u)`: GELU is `x` times it, and its derivative reads it again.
#[inline(always)]
fn gelu_gate(x: f32) -> f32 {
    sigmoid(gelu_gate_argument(x))
}

/// `2u`, the gate's argument.
#[inline(always)]
fn gelu_gate_argument(x: f32) -> f32 {
    2.0 * GELU_C * (x + GELU_A * x * x * x)
}

/// GELU's derivative at `x`, whose gate is `s`.
#[inline(always)]
fn gelu_derivative(x: f32, s: f32) -> f32 {
    let du = GELU_C + GELU_C3A * x * x;
    s + 2.0 * x * s * (1.0 - s) * du
}

/// [`Unary::Affine`] as its own type, for `per_op!`: bound to the variant, a loop would match
/// on the enum it captured for every element; bound to this, it reads two coefficients.
#[derive(Clone, Copy)]
struct AffineOp {
    alpha: f32,
    beta: f32,
}

impl AffineOp {
    #[inline(always)]
    fn apply(self, x: f32) -> f32 {
        self.alpha * x + self.beta
    }

    #[inline(always)]
    fn derivative(self, _x: f32) -> f32 {
        self.alpha
    }
}

/// Runs `$body` with `$o` bound to `$op` as a constant variant in each arm, so that the CPU
/// path's loops are compiled once per function with the `match` of `apply`/`derivative`
/// folded away (a match per element is a branch per element, and keeps the compiler from
/// specialising the loop to the one function).
macro_rules! per_op {
    ($op:expr, |$o:ident| $body:expr) => {
        per_op!(@arms $op, $o, $body, Relu Gelu Tanh Sigmoid Exp Log Sqrt Square Abs)
    };
    (@arms $op:expr, $o:ident, $body:expr, $($unit:ident)*) => {
        match $op {
            $(Unary::$unit => {
                // A constant, not a local: a closure over a local captures it by reference,
                // and the loop it is handed to reads the variant from memory per element.
                #[allow(non_upper_case_globals)]
                const $o: Unary = Unary::$unit;
                $body
            })*
            Unary::Affine { alpha, beta } => {
                let $o = AffineOp { alpha, beta };
                $body
            }
        }
    };
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    n: u32,
    alpha: f32,
    beta: f32,
    _pad: u32,
}

fn params(op: Unary, n: usize) -> Params {
    let (alpha, beta) = op.alpha_beta();
    Params {
        n: n as u32,
        alpha,
        beta,
        _pad: 0,
    }
}

/// `y = f(x)` elementwise.
pub fn unary(x: &Tensor, op: Unary) -> Result<Tensor> {
    x.expect_dtype("unary", DType::F32)?;
    match x.device() {
        Device::Cpu => {
            let xs = x.cpu_f32().expect("cpu");
            let y = per_op!(op, |o| crate::cpu::elementwise::map(xs, |v| o.apply(v)));
            Tensor::from_vec(x.device(), x.shape(), y)
        }
        Device::Gpu(gpu) => {
            let n = x.numel();
            let out = gpu.alloc(4 * n as u64)?;
            let pipeline = gpu.pipeline(&UNARY, "forward", &[("OP", op.code() as f64)]);
            gpu.launch(
                &pipeline,
                &params(op, n),
                &[x.gpu_buf().expect("gpu"), &out],
                grid_1d(n),
            );
            Ok(Tensor::from_gpu(gpu, x.shape(), DType::F32, out))
        }
    }
}

/// GELU of a CPU tensor, and its derivative at each element ([`times_derivative`]'s
/// operand): the values of [`unary`] and the factors [`unary_backward`] multiplies by, for
/// GELU, with their bits.
///
/// The derivative is kept in place of the input: the backward pass reads one tensor, not
/// the input and the gate (GELU's exp and division) it computed the derivative from
/// (session 14 kept the gate: a GPT step's four GELU backward passes had taken 0.49 ms each
/// computing it). A GELU layer keeps two [2048, 256] tensors for the GPT, not three.
///
/// The exps run a stage at a time over blocks (`exp_block`): element by element a GELU of
/// [2048, 256] took 0.17 ms on 2 cores (Zen 5), 0.117 ms in blocks.
pub fn gelu_and_derivative(x: &Tensor) -> Result<(Tensor, Tensor)> {
    x.expect_dtype("gelu_and_derivative", DType::F32)?;
    let Some(xs) = x.cpu_f32() else {
        return shape_err(
            "gelu_and_derivative",
            "the derivative is kept on the CPU path only",
        );
    };
    let (y, derivative) = crate::cpu::elementwise::map_pair_in_blocks(
        xs,
        #[inline(always)]
        |x: &[f32; EXP_BLOCK], y, derivative| {
            // `gelu_gate` a block at a time, then GELU and its derivative from the gate.
            let mut gate = x.map(gelu_gate_argument);
            sigmoid_block(&mut gate);
            for (((&s, y), d), &v) in gate.iter().zip(y.iter_mut()).zip(derivative).zip(x) {
                *y = v * s;
                *d = gelu_derivative(v, s);
            }
        },
    );
    Ok((
        Tensor::from_vec(x.device(), x.shape(), y)?,
        Tensor::from_vec(x.device(), x.shape(), derivative)?,
    ))
}

/// `dx = dy * f'(x)` from the derivative an activation's forward pass kept
/// ([`gelu_and_derivative`]): the bits of [`unary_backward`].
pub fn times_derivative(derivative: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let (Some(fs), Some(ds)) = (derivative.cpu_f32(), dy.cpu_f32()) else {
        return shape_err("times_derivative", "CPU f32 tensors only");
    };
    if derivative.shape() != dy.shape() {
        return shape_err(
            "times_derivative",
            format!(
                "derivative {:?} and dy {:?}",
                derivative.shape(),
                dy.shape()
            ),
        );
    }
    let dx = crate::cpu::elementwise::zip_map(
        ds,
        fs,
        #[inline(always)]
        |d, f| d * f,
    );
    Tensor::from_vec(dy.device(), dy.shape(), dx)
}

/// `dx = dy * f'(x)` elementwise.
pub fn unary_backward(x: &Tensor, dy: &Tensor, op: Unary) -> Result<Tensor> {
    x.expect_dtype("unary_backward", DType::F32)?;
    dy.expect_dtype("unary_backward", DType::F32)?;
    x.same_device("unary_backward", dy)?;
    if x.shape() != dy.shape() {
        return shape_err(
            "unary_backward",
            format!("x {:?} and dy {:?}", x.shape(), dy.shape()),
        );
    }
    match x.device() {
        Device::Cpu => {
            let (xs, ds) = (x.cpu_f32().expect("cpu"), dy.cpu_f32().expect("cpu"));
            let dx = per_op!(op, |o| crate::cpu::elementwise::zip_map(xs, ds, |v, d| d
                * o.derivative(v)));
            Tensor::from_vec(x.device(), x.shape(), dx)
        }
        Device::Gpu(gpu) => {
            let n = x.numel();
            let out = gpu.alloc(4 * n as u64)?;
            let pipeline = gpu.pipeline(&UNARY, "backward", &[("OP", op.code() as f64)]);
            let bufs = [x.gpu_buf().expect("gpu"), dy.gpu_buf().expect("gpu"), &out];
            gpu.launch(&pipeline, &params(op, n), &bufs, grid_1d(n));
            Ok(Tensor::from_gpu(gpu, x.shape(), DType::F32, out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values_at_known_points() {
        assert_eq!(Unary::Relu.apply(-2.0), 0.0);
        assert_eq!(Unary::Relu.derivative(3.0), 1.0);
        assert!((Unary::Gelu.apply(1.0) - 0.841_192).abs() < 1e-5);
        assert!((Unary::Sigmoid.apply(0.0) - 0.5).abs() < 1e-7);
        assert_eq!(
            Unary::Tanh.apply(1e4),
            1.0,
            "large inputs saturate instead of NaN"
        );
        assert_eq!(
            Unary::Affine {
                alpha: -2.0,
                beta: 1.0
            }
            .apply(3.0),
            -5.0
        );
        assert_eq!(Unary::Abs.derivative(0.0), 0.0);
    }

    #[test]
    fn the_kept_derivative_gives_gelus_bits_forward_and_backward() {
        // One chunk and several (`cpu::elementwise::CHUNK`), with the edges: zeros of both
        // signs, infinities, NaN, subnormals, values where the gate's exp over- and
        // underflows.
        let edges = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -1e-40,
            30.0,
            -30.0,
            1e4,
            -1e4,
        ];
        for len in [11, 40_000] {
            let values: Vec<f32> = (0..len)
                .map(|i| match edges.get(i % 97) {
                    Some(&e) => e,
                    None => ((i * 7919 % 2003) as f32 - 1001.0) * 0.0071,
                })
                .collect();
            let dys: Vec<f32> = (0..len).map(|i| (i % 13) as f32 * 0.37 - 2.0).collect();
            let x = Tensor::from_vec(&Device::Cpu, &[len], values).unwrap();
            let dy = Tensor::from_vec(&Device::Cpu, &[len], dys).unwrap();
            // Bits, but any NaN as any NaN: a product of two NaNs gives its first operand's on
            // x86, and the compiler may swap a product's operands (Rust promises no NaN's sign
            // or payload). GELU of a NaN came out -NaN in blocks and +NaN element by element
            // in the suite's build (opt-level 1) after a change that left every other value
            // alone (session 22), as adamw's test saw before it.
            let bits = |t: &Tensor| {
                t.to_vec()
                    .unwrap()
                    .iter()
                    .map(|v| if v.is_nan() { f32::NAN } else { *v }.to_bits())
                    .collect::<Vec<_>>()
            };
            let (y, derivative) = gelu_and_derivative(&x).unwrap();
            assert_eq!(
                bits(&y),
                bits(&unary(&x, Unary::Gelu).unwrap()),
                "GELU, {len}"
            );
            assert_eq!(
                bits(&times_derivative(&derivative, &dy).unwrap()),
                bits(&unary_backward(&x, &dy, Unary::Gelu).unwrap()),
                "GELU's gradient, {len}"
            );
        }
        let short = Tensor::from_vec(&Device::Cpu, &[2], vec![1.0, 2.0]).unwrap();
        let x = Tensor::from_vec(&Device::Cpu, &[3], vec![1.0; 3]).unwrap();
        assert!(
            times_derivative(&short, &x).is_err(),
            "a derivative of another shape"
        );
    }
}
