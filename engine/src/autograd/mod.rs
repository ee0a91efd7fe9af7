//! Reverse-mode automatic differentiation over a tape.
//!
//! A [`Graph`] records every operation as a node holding its output value and an `Op`
//! naming its inputs. Nodes are appended in execution order, so the tape is already
//! topologically sorted: [`Graph::backward`] walks it once in reverse, applying one backward
//! rule per op (`backward.rs`, a single `match`), and accumulates gradients.
//!
//! Parameters enter with [`Graph::param`]; the graph recognises a tensor it has seen
//! (by its storage), so a parameter used twice (weight tying) gets both gradient
//! contributions. Data enters with [`Graph::input`] and gets no gradient.

mod backward;
pub mod gradcheck;

use std::cell::RefCell;
use std::collections::HashMap;

use crate::error::{shape_err, Result};
use crate::kernels::attention;
use crate::kernels::binary::{binary, Binary};
use crate::kernels::conv;
use crate::kernels::conv_geometry::ConvGeometry;
use crate::kernels::conv_pool;
use crate::kernels::dropout::{self, DropoutMask};
use crate::kernels::image_norm;
use crate::kernels::norm_pool;
use crate::kernels::permute;
use crate::kernels::pool::{self, Pool, PoolGeometry};
use crate::kernels::unary::{unary, Unary};
use crate::kernels::{copy, embedding, layernorm, linear, matmul, reduce, softmax};
use crate::tensor::{DType, Device, Tensor};

/// A value in a [`Graph`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Var(usize);

/// The closed set of differentiable operations; each has one rule in `backward.rs`.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// A parameter or an input.
    Leaf,
    MatMul {
        a: Var,
        b: Var,
        trans_a: bool,
        trans_b: bool,
    },
    /// `f(x weight + bias)` (`kernels::linear`); keeps `x weight + bias` where `f`'s
    /// derivative needs it, or the derivative itself where the CPU path kept it (GELU).
    Linear {
        x: Var,
        weight: Var,
        bias: Option<Var>,
        activation: Option<Unary>,
        pre_activation: Option<Tensor>,
        derivative: Option<Tensor>,
        /// The residual stream the layer's output was added onto (no activation then).
        residual: Option<Var>,
    },
    /// Add, Sub, Mul or Div with broadcasting.
    Binary {
        a: Var,
        b: Var,
        op: Binary,
    },
    Unary {
        x: Var,
        op: Unary,
    },
    SumAxis {
        x: Var,
        axis: usize,
        keepdim: bool,
    },
    MeanAxis {
        x: Var,
        axis: usize,
        keepdim: bool,
    },
    SumAll {
        x: Var,
    },
    MeanAll {
        x: Var,
    },
    Softmax {
        x: Var,
    },
    /// Causal self-attention over `heads` (`kernels::attention`); keeps the attention
    /// weights before dropout for the backward pass, which recomputes the mask.
    Attention {
        q: Var,
        k: Var,
        v: Var,
        heads: usize,
        mask: Option<DropoutMask>,
        weights: Tensor,
    },
    /// Per-row losses; keeps the probabilities for the backward pass.
    CrossEntropy {
        logits: Var,
        labels: Tensor,
        probs: Tensor,
    },
    LayerNorm {
        x: Var,
        gamma: Var,
        beta: Var,
        stats: Tensor,
    },
    /// `kernels::image_norm`; keeps each image's statistics (the backward pass recomputes
    /// the normalized images from them).
    ImageNorm {
        x: Var,
        gamma: Var,
        beta: Var,
        stats: Tensor,
        eps: f32,
    },
    /// An image norm, then max pooling over its output in windows that do not overlap
    /// (`kernels::norm_pool`), `[n, ph, pw, c]`.
    ImageNormMaxPool {
        x: Var,
        gamma: Var,
        beta: Var,
        saved: norm_pool::Saved,
    },
    Embedding {
        table: Var,
        ids: Tensor,
    },
    Transpose {
        x: Var,
    },
    Reshape {
        x: Var,
    },
    /// A convolution's product of `x`'s im2col columns and `weight`, plus `bias`, `[n * oh *
    /// ow, oc]`; keeps the columns for the weight's gradient where
    /// `kernels::conv::keeps_columns` says so (else the CPU path builds them again in cache).
    Conv2d {
        x: Var,
        weight: Var,
        bias: Option<Var>,
        geometry: ConvGeometry,
        cols: Option<Tensor>,
    },
    /// A convolution, then max pooling over its output in windows that do not overlap
    /// (`kernels::conv_pool`), `[n, ph, pw, oc]`.
    ConvMaxPool {
        x: Var,
        weight: Var,
        bias: Option<Var>,
        geometry: ConvGeometry,
        saved: conv_pool::Saved,
    },
    Pool {
        x: Var,
        geometry: PoolGeometry,
        kind: Pool,
        /// Max pooling's winners, for the backward pass.
        argmax: Option<Tensor>,
    },
    /// The backward pass recomputes the mask from its counter.
    Dropout {
        x: Var,
        mask: DropoutMask,
    },
    Permute {
        x: Var,
        perm: Vec<usize>,
    },
}

struct Node {
    value: Tensor,
    op: Op,
    /// Whether any parameter feeds this node (otherwise its gradient is never computed).
    needs_grad: bool,
    /// How many times later nodes read this one (a node reading it twice counts twice): with
    /// one reader, that reader's gradient for it is its whole gradient.
    readers: usize,
}

/// The tape of one forward pass.
pub struct Graph {
    device: Device,
    nodes: RefCell<Vec<Node>>,
    params: RefCell<HashMap<usize, Var>>,
}

/// Gradients of the parameters, looked up by the parameter tensor.
pub struct Grads {
    by_storage: HashMap<usize, Tensor>,
}

impl Grads {
    /// The gradient of `param`, or `None` when the loss does not depend on it.
    pub fn of(&self, param: &Tensor) -> Option<&Tensor> {
        self.by_storage.get(&param.storage_id())
    }

    /// Gradients in the order of `params`, zeros for the ones the loss does not reach.
    pub fn for_params(&self, params: &[&Tensor]) -> Result<Vec<Tensor>> {
        params
            .iter()
            .map(|p| match self.of(p) {
                Some(g) => Ok(g.clone()),
                None => Tensor::zeros(p.device(), p.shape()),
            })
            .collect()
    }
}

impl Graph {
    /// An empty graph whose operations run on `device`.
    pub fn new(device: &Device) -> Self {
        Graph {
            device: device.clone(),
            nodes: RefCell::default(),
            params: RefCell::default(),
        }
    }

    /// The device every value of this graph lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn push(&self, value: Tensor, op: Op, needs_grad: bool) -> Var {
        let mut nodes = self.nodes.borrow_mut();
        nodes.push(Node {
            value,
            op,
            needs_grad,
            readers: 0,
        });
        Var(nodes.len() - 1)
    }

    fn needs(&self, vars: &[Var]) -> bool {
        let nodes = self.nodes.borrow();
        vars.iter().any(|v| nodes[v.0].needs_grad)
    }

    /// The value of a node (a cheap handle).
    pub fn value(&self, v: Var) -> Tensor {
        self.nodes.borrow()[v.0].value.clone()
    }

    /// The shape of `v`'s value.
    pub fn shape(&self, v: Var) -> Vec<usize> {
        self.nodes.borrow()[v.0].value.shape().to_vec()
    }

    /// Data that gets no gradient.
    pub fn input(&self, t: &Tensor) -> Var {
        self.push(t.clone(), Op::Leaf, false)
    }

    /// A trainable parameter; the same tensor twice gives the same node.
    pub fn param(&self, t: &Tensor) -> Var {
        if let Some(&v) = self.params.borrow().get(&t.storage_id()) {
            return v;
        }
        let v = self.push(t.clone(), Op::Leaf, true);
        self.params.borrow_mut().insert(t.storage_id(), v);
        v
    }

    /// A node of `op` computed from `inputs`: every node it reads, each time it reads it.
    fn record(&self, value: Tensor, op: Op, inputs: &[Var]) -> Var {
        let needs = self.needs(inputs);
        let mut nodes = self.nodes.borrow_mut();
        for v in inputs {
            nodes[v.0].readers += 1;
        }
        drop(nodes);
        self.push(value, op, needs)
    }

    /// Matrix product `a @ b` of the last two dimensions, batched over the leading ones.
    pub fn matmul(&self, a: Var, b: Var) -> Result<Var> {
        self.matmul_t(a, b, false, false)
    }

    /// `op(a) * op(b)`, op transposing when asked.
    pub fn matmul_t(&self, a: Var, b: Var, trans_a: bool, trans_b: bool) -> Result<Var> {
        let y = matmul::matmul(&self.value(a), &self.value(b), trans_a, trans_b)?;
        Ok(self.record(
            y,
            Op::MatMul {
                a,
                b,
                trans_a,
                trans_b,
            },
            &[a, b],
        ))
    }

    /// A layer: `activation(x weight + bias)` for `x [.., inputs]`, `weight [inputs,
    /// outputs]`, `bias [outputs]`, as one operation. The same values and gradients as the
    /// product, the addition and the activation in sequence; the CPU path adds the bias and
    /// applies a ReLU or affine activation while each row of the product is in cache.
    pub fn linear(
        &self,
        x: Var,
        weight: Var,
        bias: Option<Var>,
        activation: Option<Unary>,
    ) -> Result<Var> {
        let bias_value = bias.map(|b| self.value(b));
        let out = linear::forward(
            &self.value(x),
            &self.value(weight),
            bias_value.as_ref(),
            activation,
        )?;
        Ok(self.record_linear((x, weight, bias), activation, out, None))
    }

    /// `residual + (x weight + bias)`: a layer added onto a residual stream as one operation
    /// (`kernels::linear::forward_onto`), the same values and gradients as [`Graph::linear`]
    /// and an addition.
    pub fn linear_onto(
        &self,
        x: Var,
        weight: Var,
        bias: Option<Var>,
        residual: Var,
    ) -> Result<Var> {
        let bias_value = bias.map(|b| self.value(b));
        let y = linear::forward_onto(
            &self.value(x),
            &self.value(weight),
            bias_value.as_ref(),
            &self.value(residual),
        )?;
        let out = linear::Affine {
            y,
            pre_activation: None,
            derivative: None,
        };
        Ok(self.record_linear((x, weight, bias), None, out, Some(residual)))
    }

    /// The node of a layer's output, `out`, with what its gradient reads.
    fn record_linear(
        &self,
        (x, weight, bias): (Var, Var, Option<Var>),
        activation: Option<Unary>,
        out: linear::Affine,
        residual: Option<Var>,
    ) -> Var {
        let op = Op::Linear {
            x,
            weight,
            bias,
            activation,
            pre_activation: out.pre_activation,
            derivative: out.derivative,
            residual,
        };
        let inputs: Vec<Var> = [x, weight]
            .into_iter()
            .chain(residual)
            .chain(bias)
            .collect();
        self.record(out.y, op, &inputs)
    }

    fn binary(&self, a: Var, b: Var, op: Binary) -> Result<Var> {
        let y = binary(&self.value(a), &self.value(b), op)?;
        Ok(self.record(y, Op::Binary { a, b, op }, &[a, b]))
    }

    /// Element-wise `a + b`, with broadcasting.
    pub fn add(&self, a: Var, b: Var) -> Result<Var> {
        self.binary(a, b, Binary::Add)
    }

    /// Element-wise `a - b`, with broadcasting.
    pub fn sub(&self, a: Var, b: Var) -> Result<Var> {
        self.binary(a, b, Binary::Sub)
    }

    /// Element-wise `a * b`, with broadcasting.
    pub fn mul(&self, a: Var, b: Var) -> Result<Var> {
        self.binary(a, b, Binary::Mul)
    }

    /// Element-wise `a / b`, with broadcasting.
    pub fn div(&self, a: Var, b: Var) -> Result<Var> {
        self.binary(a, b, Binary::Div)
    }

    /// Applies the element-wise function `op` to `x`.
    pub fn unary(&self, x: Var, op: Unary) -> Result<Var> {
        let y = unary(&self.value(x), op)?;
        Ok(self.record(y, Op::Unary { x, op }, &[x]))
    }

    /// Element-wise `max(x, 0)`.
    pub fn relu(&self, x: Var) -> Result<Var> {
        self.unary(x, Unary::Relu)
    }

    /// Element-wise GELU of `x`.
    pub fn gelu(&self, x: Var) -> Result<Var> {
        self.unary(x, Unary::Gelu)
    }

    /// Element-wise hyperbolic tangent of `x`.
    pub fn tanh(&self, x: Var) -> Result<Var> {
        self.unary(x, Unary::Tanh)
    }

    /// Element-wise logistic sigmoid `1 / (1 + e^-x)`.
    pub fn sigmoid(&self, x: Var) -> Result<Var> {
        self.unary(x, Unary::Sigmoid)
    }

    /// `alpha * x`.
    pub fn scale(&self, x: Var, alpha: f32) -> Result<Var> {
        self.unary(x, Unary::Affine { alpha, beta: 0.0 })
    }

    fn axis(&self, x: Var, axis: isize) -> Result<usize> {
        let rank = self.shape(x).len() as isize;
        let a = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&a) {
            return shape_err("axis", format!("axis {axis} out of range for rank {rank}"));
        }
        Ok(a as usize)
    }

    /// Sums `x` over `axis` (negative counts from the end), keeping it as size 1 when `keepdim`.
    pub fn sum_axis(&self, x: Var, axis: isize, keepdim: bool) -> Result<Var> {
        let axis = self.axis(x, axis)?;
        let y = reduce::sum_axis(&self.value(x), axis as isize, keepdim)?;
        Ok(self.record(y, Op::SumAxis { x, axis, keepdim }, &[x]))
    }

    /// Averages `x` over `axis` (negative counts from the end), keeping it as size 1 when
    /// `keepdim`.
    pub fn mean_axis(&self, x: Var, axis: isize, keepdim: bool) -> Result<Var> {
        let axis = self.axis(x, axis)?;
        let y = reduce::mean_axis(&self.value(x), axis as isize, keepdim)?;
        Ok(self.record(y, Op::MeanAxis { x, axis, keepdim }, &[x]))
    }

    /// The sum of every element of `x`, as a scalar.
    pub fn sum_all(&self, x: Var) -> Result<Var> {
        let y = reduce::sum_all(&self.value(x))?;
        Ok(self.record(y, Op::SumAll { x }, &[x]))
    }

    /// The mean of every element of `x`, as a scalar.
    pub fn mean_all(&self, x: Var) -> Result<Var> {
        let y = reduce::mean_all(&self.value(x))?;
        Ok(self.record(y, Op::MeanAll { x }, &[x]))
    }

    /// Softmax over the last axis.
    pub fn softmax(&self, x: Var) -> Result<Var> {
        let y = softmax::softmax(&self.value(x))?;
        Ok(self.record(y, Op::Softmax { x }, &[x]))
    }

    /// Per-row softmax cross-entropy of `logits [..., classes]` against u32 `labels [...]`.
    pub fn cross_entropy(&self, logits: Var, labels: &Tensor) -> Result<Var> {
        let (losses, probs) = softmax::cross_entropy(&self.value(logits), labels)?;
        Ok(self.record(
            losses,
            Op::CrossEntropy {
                logits,
                labels: labels.clone(),
                probs,
            },
            &[logits],
        ))
    }

    /// Mean softmax cross-entropy: the usual classification loss.
    pub fn cross_entropy_mean(&self, logits: Var, labels: &Tensor) -> Result<Var> {
        let per_row = self.cross_entropy(logits, labels)?;
        self.mean_all(per_row)
    }

    /// Layer normalization over the last axis.
    pub fn layer_norm(&self, x: Var, gamma: Var, beta: Var, eps: f32) -> Result<Var> {
        let (y, stats) =
            layernorm::layernorm(&self.value(x), &self.value(gamma), &self.value(beta), eps)?;
        Ok(self.record(
            y,
            Op::LayerNorm {
                x,
                gamma,
                beta,
                stats,
            },
            &[x, gamma, beta],
        ))
    }

    /// Rows of `table` picked by u32 `ids`.
    pub fn embedding(&self, table: Var, ids: &Tensor) -> Result<Var> {
        ids.expect_dtype("embedding", DType::U32)?;
        let y = embedding::embedding(&self.value(table), ids)?;
        Ok(self.record(
            y,
            Op::Embedding {
                table,
                ids: ids.clone(),
            },
            &[table],
        ))
    }

    /// Swaps the last two axes.
    pub fn transpose(&self, x: Var) -> Result<Var> {
        let y = copy::transpose(&self.value(x))?;
        Ok(self.record(y, Op::Transpose { x }, &[x]))
    }

    /// `x` with a new shape of the same number of elements; its gradient is reshaped back.
    pub fn reshape(&self, x: Var, shape: &[usize]) -> Result<Var> {
        let y = self.value(x).reshape(shape)?;
        Ok(self.record(y, Op::Reshape { x }, &[x]))
    }

    /// 2-D convolution of NHWC images `x [n, h, w, c]` with `weight [kh*kw*c, oc]` (rows in
    /// (kh, kw, c) order) and an optional `bias [oc]`: output `[n, oh, ow, oc]`.
    pub fn conv2d(
        &self,
        x: Var,
        weight: Var,
        bias: Option<Var>,
        kernel: (usize, usize),
        stride: usize,
        pad: usize,
    ) -> Result<Var> {
        let geometry = ConvGeometry::of(&self.shape(x), kernel.0, kernel.1, stride, pad)?;
        let oc = match self.shape(weight)[..] {
            [rows, oc] if rows == geometry.patch() => oc,
            ref other => {
                return shape_err(
                    "conv2d",
                    format!(
                        "weight must be [{}, out_channels] for a {}x{} window over {} channels, is {other:?}",
                        geometry.patch(),
                        kernel.0,
                        kernel.1,
                        geometry.c
                    ),
                )
            }
        };
        let [n, oh, ow, _] = geometry.cols_shape();
        // Lowered to im2col and a product (`conv::forward`); the input's gradient is col2im
        // of the product's (`conv::input_gradient`), the weight's the columns' product with
        // dy (`conv::weight_gradient`). The CPU path runs each an image or a span of pixels
        // at a time, the columns in cache; the bias is added as each row completes.
        let bias_value = bias.map(|b| self.value(b));
        let (y, cols) = conv::forward(
            &self.value(x),
            &self.value(weight),
            bias_value.as_ref(),
            &geometry,
        )?;
        let op = Op::Conv2d {
            x,
            weight,
            bias,
            geometry,
            cols,
        };
        let inputs: Vec<Var> = [x, weight].into_iter().chain(bias).collect();
        let y = self.record(y, op, &inputs);
        self.reshape(y, &[n, oh, ow, oc])
    }

    /// `max_pool2d(conv2d(x, weight, bias, kernel, stride, pad), pool, pool)` as one operation:
    /// the same values and gradients, bit for bit, with the convolution's output never in
    /// memory on the CPU path (`kernels::conv_pool`).
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d_max_pool2d(
        &self,
        x: Var,
        weight: Var,
        bias: Option<Var>,
        kernel: (usize, usize),
        stride: usize,
        pad: usize,
        pool: usize,
    ) -> Result<Var> {
        let geometry = ConvGeometry::of(&self.shape(x), kernel.0, kernel.1, stride, pad)?;
        let bias_value = bias.map(|b| self.value(b));
        let conv_pool::ConvPooled { y, saved } = conv_pool::forward(
            &self.value(x),
            &self.value(weight),
            bias_value.as_ref(),
            &geometry,
            pool,
        )?;
        let op = Op::ConvMaxPool {
            x,
            weight,
            bias,
            geometry,
            saved,
        };
        let inputs: Vec<Var> = [x, weight].into_iter().chain(bias).collect();
        Ok(self.record(y, op, &inputs))
    }

    fn pool(&self, x: Var, k: usize, stride: usize, kind: Pool) -> Result<Var> {
        let geometry = PoolGeometry::of(&self.shape(x), k, stride)?;
        let (y, argmax) = pool::pool(&self.value(x), &geometry, kind)?;
        let op = Op::Pool {
            x,
            geometry,
            kind,
            argmax,
        };
        Ok(self.record(y, op, &[x]))
    }

    /// Max pooling of NHWC images over `k x k` windows every `stride` pixels.
    pub fn max_pool2d(&self, x: Var, k: usize, stride: usize) -> Result<Var> {
        self.pool(x, k, stride, Pool::Max)
    }

    /// Average pooling of NHWC images over `k x k` windows every `stride` pixels.
    pub fn avg_pool2d(&self, x: Var, k: usize, stride: usize) -> Result<Var> {
        self.pool(x, k, stride, Pool::Avg)
    }

    /// Inverted dropout with a counter-based mask; rate 0 records nothing.
    pub fn dropout(&self, x: Var, mask: DropoutMask) -> Result<Var> {
        if mask.rate == 0.0 {
            return Ok(x);
        }
        let y = dropout::dropout(&self.value(x), &mask)?;
        Ok(self.record(y, Op::Dropout { x, mask }, &[x]))
    }

    /// Reorders axes (at most four): output axis `a` is input axis `perm[a]`.
    pub fn permute(&self, x: Var, perm: &[usize]) -> Result<Var> {
        let y = permute::permute(&self.value(x), perm)?;
        let perm = perm.to_vec();
        Ok(self.record(y, Op::Permute { x, perm }, &[x]))
    }

    /// Causal self-attention: for each of `heads` heads side by side in the features of
    /// `q`, `k` and `v` (`[batch, time, features]`), the causal softmax of `q kᵀ` (dropped
    /// out by `mask`, when given a rate above 0) times `v`; output `[batch, time, features]`.
    /// Scale the queries first.
    pub fn causal_attention(
        &self,
        q: Var,
        k: Var,
        v: Var,
        heads: usize,
        mask: Option<DropoutMask>,
    ) -> Result<Var> {
        let mask = mask.filter(|m| m.rate > 0.0);
        let (y, weights) = attention::causal_attention(
            &self.value(q),
            &self.value(k),
            &self.value(v),
            heads,
            mask.as_ref(),
        )?;
        let op = Op::Attention {
            q,
            k,
            v,
            heads,
            mask,
            weights,
        };
        Ok(self.record(y, op, &[q, k, v]))
    }

    /// Normalization of NHWC images over each sample's (h, w, c) together, with a per-channel
    /// scale and shift: GroupNorm with one group (PyTorch's `GroupNorm(1, C)`), the layer norm
    /// of images.
    pub fn image_norm(&self, x: Var, gamma: Var, beta: Var, eps: f32) -> Result<Var> {
        let out =
            image_norm::image_norm(&self.value(x), &self.value(gamma), &self.value(beta), eps)?;
        let op = Op::ImageNorm {
            x,
            gamma,
            beta,
            stats: out.stats,
            eps,
        };
        Ok(self.record(out.y, op, &[x, gamma, beta]))
    }

    /// `max_pool2d(image_norm(x, gamma, beta, eps), pool, pool)` as one operation: the same
    /// values and gradients, bit for bit, with the normalized images and their gradient never
    /// in memory on the CPU path (`kernels::norm_pool`).
    pub fn image_norm_max_pool2d(
        &self,
        x: Var,
        gamma: Var,
        beta: Var,
        eps: f32,
        pool: usize,
    ) -> Result<Var> {
        let norm_pool::NormPooled { y, saved } = norm_pool::forward(
            &self.value(x),
            &self.value(gamma),
            &self.value(beta),
            eps,
            pool,
        )?;
        let op = Op::ImageNormMaxPool {
            x,
            gamma,
            beta,
            saved,
        };
        Ok(self.record(y, op, &[x, gamma, beta]))
    }

    /// Gradients of the one-element `loss` with respect to every parameter. Consumes the
    /// graph so that parameters are no longer shared when the optimizer updates them in place.
    pub fn backward(self, loss: Var) -> Result<Grads> {
        backward::run(self, loss, None, None)
    }

    /// The value of a one-element `loss` and its gradients for `params` (zeros for those it
    /// does not reach), in their order; consuming the graph releases its handles on the
    /// parameters before an update.
    pub fn loss_and_grads(self, loss: Var, params: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
        let value = self.value(loss);
        Ok((value, self.backward(loss)?.for_params(params)?))
    }

    /// [`Graph::backward_as_ready`] that returns the loss's value.
    pub fn loss_as_ready(
        self,
        loss: Var,
        params: &[&Tensor],
        ready: &mut dyn FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        let value = self.value(loss);
        self.backward_as_ready(loss, params, ready)?;
        Ok(value)
    }

    /// Gradients of a one-element `loss` for `params`, each handed to `ready` with its
    /// position in `params` the moment the backward pass has finished it, while the pass
    /// goes on to earlier layers: the last layer's gradients come first, and can travel while
    /// the rest are computed (data parallelism's overlap of communication with the backward
    /// pass). Every parameter is handed over exactly once, zeros for one the loss does not
    /// reach (at the end). The gradients are the bits [`Graph::backward`] gives.
    pub fn backward_as_ready(
        self,
        loss: Var,
        params: &[&Tensor],
        ready: &mut dyn FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<()> {
        // A tensor listed twice (tied weights) is handed over at each of its positions.
        let mut positions: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, p) in params.iter().enumerate() {
            positions.entry(p.storage_id()).or_default().push(i);
        }
        let mut handed = vec![false; params.len()];
        backward::run(
            self,
            loss,
            None,
            Some(&mut |storage, grad| {
                // A parameter of the graph that the caller did not ask for is dropped.
                for &i in positions.get(&storage).into_iter().flatten() {
                    handed[i] = true;
                    ready(i, grad.clone())?;
                }
                Ok(())
            }),
        )?;
        for (i, p) in params.iter().enumerate() {
            if !handed[i] {
                ready(i, Tensor::zeros(p.device(), p.shape())?)?;
            }
        }
        Ok(())
    }

    /// Gradients of `sum(output ⊙ seed)`: the vector-Jacobian product a pipeline stage
    /// computes from the activation gradient its successor sent back (clapping.md §3.7).
    pub fn backward_with(self, output: Var, seed: Tensor) -> Result<Grads> {
        backward::run(self, output, Some(seed), None)
    }
}
