//! WGSL sources compiled into the binary, and the tiny include mechanism they share.

/// One `.wgsl` file from `shaders/`, with the files it builds on.
///
/// WGSL has no `#include`; a shader that needs shared helpers (the counter-based random
/// generator, index helpers) lists them in `includes`, and they are prepended in order.
#[derive(Debug)]
pub struct Shader {
    /// Path below `shaders/`, unique; the pipeline cache keys on it.
    pub name: &'static str,
    /// The file's WGSL text, without its includes.
    pub source: &'static str,
    /// Shaders prepended to this one, in order, each with its own includes first.
    pub includes: &'static [&'static Shader],
}

impl Shader {
    /// The full source handed to the compiler.
    pub fn full_source(&self) -> String {
        let mut out = String::new();
        for inc in self.includes {
            out.push_str(&inc.full_source());
            out.push('\n');
        }
        out.push_str(self.source);
        out
    }
}

/// Declares a [`Shader`] from a file below the workspace's `shaders/` folder.
#[macro_export]
#[doc(hidden)]
macro_rules! wgsl {
    ($path:literal) => {
        $crate::gpu::Shader { name: $path, source: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../shaders/", $path)), includes: &[] }
    };
    ($path:literal, includes: [$($inc:expr),* $(,)?]) => {
        $crate::gpu::Shader { name: $path, source: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../shaders/", $path)), includes: &[$(&$inc),*] }
    };
}
