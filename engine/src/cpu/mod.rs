//! The fast CPU path: kernels that give the CPU references' bits (and so the WGSL kernels'
//! bits on lavapipe) at a speed that makes the CPU a training device of its own, for the
//! nodes and CI machines that have no GPU.

pub mod adamw;
pub mod attention;
pub mod chunks;
pub mod conv;
pub mod conv_pool;
pub mod elementwise;
pub mod gemm;
pub mod layernorm;
pub mod norm_pool;
pub mod output;
mod padded_image;
pub mod planar_conv;
pub mod pool;
pub mod rows;
pub mod strided_product;
pub mod transposed_conv;
pub mod vector_unit;
