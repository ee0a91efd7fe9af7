//! The list of every shader the engine compiles, for the validation tests.
//!
//! It gathers the kernels', the codecs' and error feedback's lists, so it stands above all
//! three and none of them has to import another upward.

use crate::gpu::Shader;
use crate::{compress, feedback, kernels};

/// Every shader the engine compiles.
pub fn all_shaders() -> Vec<&'static Shader> {
    let mut all = compress::gpu_shaders();
    all.push(&feedback::FEEDBACK);
    all.extend(kernels::shaders());
    all
}
