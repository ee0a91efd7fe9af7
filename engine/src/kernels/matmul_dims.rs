//! The sizes of one batched matrix product, derived from its operands' shapes: what the GPU
//! kernels, the CPU reference and the CPU path's blocked product all take.

use crate::error::{shape_err, Result};

/// Sizes of one product, derived from operand shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulDims {
    /// Number of matrix products, the product of the leading batch axes (1 for plain matrices).
    pub batch: usize,
    /// Rows of the output and of `op(A)`.
    pub m: usize,
    /// Columns of the output and of `op(B)`.
    pub n: usize,
    /// The contracted dimension: columns of `op(A)`, rows of `op(B)`.
    pub k: usize,
    /// Whether A is stored transposed, `[..., K, M]`.
    pub trans_a: bool,
    /// Whether B is stored transposed, `[..., N, K]`.
    pub trans_b: bool,
    /// Whether A (B) has its own matrix per batch entry, or one shared by all.
    pub a_batched: bool,
    /// Whether B has its own matrix per batch entry, or one shared by all.
    pub b_batched: bool,
}

impl MatmulDims {
    /// A is `[..., M, K]` (`[..., K, M]` when `trans_a`), B is `[..., K, N]` (`[..., N, K]`).
    /// Leading batch axes must match, or one operand must be a plain matrix (broadcast).
    pub fn infer(
        a: &[usize],
        b: &[usize],
        trans_a: bool,
        trans_b: bool,
    ) -> Result<(Self, Vec<usize>)> {
        if a.len() < 2 || b.len() < 2 {
            return shape_err(
                "matmul",
                format!("operands need at least 2 axes, got {a:?} and {b:?}"),
            );
        }
        let (ar, ac) = (a[a.len() - 2], a[a.len() - 1]);
        let (br, bc) = (b[b.len() - 2], b[b.len() - 1]);
        let (m, ka) = if trans_a { (ac, ar) } else { (ar, ac) };
        let (kb, n) = if trans_b { (bc, br) } else { (br, bc) };
        if ka != kb {
            return shape_err(
                "matmul",
                format!(
                    "inner sizes differ: {a:?}{} x {b:?}{}",
                    if trans_a { "^T" } else { "" },
                    if trans_b { "^T" } else { "" }
                ),
            );
        }
        let (a_lead, b_lead) = (&a[..a.len() - 2], &b[..b.len() - 2]);
        let lead = match (a_lead.is_empty(), b_lead.is_empty()) {
            (_, true) => a_lead.to_vec(),
            (true, false) => b_lead.to_vec(),
            (false, false) if a_lead == b_lead => a_lead.to_vec(),
            _ => return shape_err("matmul", format!("batch axes differ: {a:?} and {b:?}")),
        };
        let batch = lead.iter().product();
        let mut out = lead;
        out.extend([m, n]);
        let dims = MatmulDims {
            batch,
            m,
            n,
            k: ka,
            trans_a,
            trans_b,
            a_batched: !a_lead.is_empty(),
            b_batched: !b_lead.is_empty(),
        };
        Ok((dims, out))
    }

    /// One `n`×`n` by `n`×`n` product, neither operand transposed (benchmarks, tuning).
    pub fn square(n: usize) -> MatmulDims {
        MatmulDims {
            batch: 1,
            m: n,
            n,
            k: n,
            trans_a: false,
            trans_b: false,
            a_batched: true,
            b_batched: true,
        }
    }

    /// Floating-point operations of the product, `2 * batch * m * n * k`, for throughput reports.
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
}
