//! Embedding lookup and its scatter-add gradient (embedding.wgsl).

use bytemuck::{Pod, Zeroable};

use super::{grid_1d, span_starts, EMBEDDING, LOOP_SPAN, MAX_GROUPS};
use crate::error::{shape_err, Error, Result};
use crate::tensor::{DType, Device, Tensor};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    tokens: u32,
    dim: u32,
    vocab: u32,
    /// First token of this launch of `scatter_add` (see [`LOOP_SPAN`]).
    span_start: u32,
}

/// CPU reference of the lookup.
pub fn embedding_ref(table: &[f32], ids: &[u32], dim: usize) -> Vec<f32> {
    ids.iter()
        .flat_map(|&id| table[id as usize * dim..][..dim].iter().copied())
        .collect()
}

/// CPU reference of the gradient: rows of `dout` summed into the rows their ids name, in
/// token order.
pub fn embedding_backward_ref(ids: &[u32], dout: &[f32], vocab: usize, dim: usize) -> Vec<f32> {
    let mut dtable = vec![0.0; vocab * dim];
    for (t, &id) in ids.iter().enumerate() {
        for d in 0..dim {
            dtable[id as usize * dim + d] += dout[t * dim + d];
        }
    }
    dtable
}

fn check_ids(ids: &Tensor, vocab: usize) -> Result<()> {
    ids.expect_dtype("embedding", DType::U32)?;
    if let Some(v) = ids.cpu_u32() {
        if let Some(&bad) = v.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::Data(format!(
                "token id {bad} is out of range for a vocabulary of {vocab}"
            )));
        }
    }
    Ok(())
}

/// Rows of `table [vocab, dim]` picked by `ids [...]`: output `[..., dim]`. Ids must be below
/// `vocab` (checked on the CPU; on the GPU a larger id reads as a zero row).
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    table.expect_dtype("embedding", DType::F32)?;
    table.same_device("embedding", ids)?;
    let &[vocab, dim] = table.shape() else {
        return shape_err(
            "embedding",
            format!("table must be [vocab, dim], is {:?}", table.shape()),
        );
    };
    check_ids(ids, vocab)?;
    let mut out_shape = ids.shape().to_vec();
    out_shape.push(dim);
    let tokens = ids.numel();
    match table.device() {
        Device::Cpu => Tensor::from_vec(
            table.device(),
            &out_shape,
            embedding_ref(
                table.cpu_f32().expect("cpu"),
                ids.cpu_u32().expect("cpu"),
                dim,
            ),
        ),
        Device::Gpu(gpu) => {
            let out = gpu.alloc(4 * (tokens * dim) as u64)?;
            let pipeline = gpu.pipeline(&EMBEDDING, "gather", &[]);
            let params = Params {
                tokens: tokens as u32,
                dim: dim as u32,
                vocab: vocab as u32,
                span_start: 0,
            };
            gpu.launch(
                &pipeline,
                &params,
                &[
                    ids.gpu_buf().expect("gpu"),
                    table.gpu_buf().expect("gpu"),
                    &out,
                ],
                grid_1d(tokens * dim),
            );
            Ok(Tensor::from_gpu(gpu, &out_shape, DType::F32, out))
        }
    }
}

/// Gradient of [`embedding`] with respect to the table: `[vocab, dim]`.
pub fn embedding_backward(ids: &Tensor, dout: &Tensor, vocab: usize) -> Result<Tensor> {
    dout.expect_dtype("embedding_backward", DType::F32)?;
    ids.same_device("embedding_backward", dout)?;
    check_ids(ids, vocab)?;
    let tokens = ids.numel();
    let dim = *dout.shape().last().unwrap_or(&0);
    if dout.numel() != tokens * dim || dout.shape().last() != Some(&dim) {
        return shape_err(
            "embedding_backward",
            format!(
                "dout {:?} does not match ids {:?}",
                dout.shape(),
                ids.shape()
            ),
        );
    }
    match dout.device() {
        Device::Cpu => Tensor::from_vec(
            dout.device(),
            &[vocab, dim],
            embedding_backward_ref(
                ids.cpu_u32().expect("cpu"),
                dout.cpu_f32().expect("cpu"),
                vocab,
                dim,
            ),
        ),
        Device::Gpu(gpu) => {
            let out = gpu.alloc(4 * (vocab * dim) as u64)?;
            let pipeline = gpu.pipeline(&EMBEDDING, "scatter_add", &[]);
            let params = Params {
                tokens: tokens as u32,
                dim: dim as u32,
                vocab: vocab as u32,
                span_start: 0,
            };
            let (y, z) = if vocab <= MAX_GROUPS {
                (vocab, 1)
            } else {
                (MAX_GROUPS, vocab.div_ceil(MAX_GROUPS))
            };
            let grid = [dim.div_ceil(64) as u32, y as u32, z as u32];
            for span_start in span_starts(tokens, LOOP_SPAN) {
                gpu.launch(
                    &pipeline,
                    &Params {
                        span_start: span_start as u32,
                        ..params
                    },
                    &[
                        ids.gpu_buf().expect("gpu"),
                        dout.gpu_buf().expect("gpu"),
                        &out,
                    ],
                    grid,
                );
            }
            Ok(Tensor::from_gpu(gpu, &[vocab, dim], DType::F32, out))
        }
    }
}
