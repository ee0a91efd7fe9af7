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
    /// Every value the engine gives each override constant. The pipeline cache refuses, in
    /// debug builds, a value not listed here, so the back-end translation tests
    /// (engine/tests/shader_backends.rs), which compile every listed combination, cover every
    /// variant the engine can run.
    pub overrides: &'static [Override],
}

/// An override constant of a shader and the values the engine sets it to.
#[derive(Debug)]
pub struct Override {
    /// The constant's name in the WGSL source.
    pub name: &'static str,
    /// Every value the engine passes (booleans as 0 and 1).
    pub values: &'static [f64],
}

impl Override {
    /// An override that takes the values `0..count` (an enumeration or, with 2, a boolean).
    pub const fn codes(name: &'static str, count: usize) -> Self {
        Self {
            name,
            values: CODES.split_at(count).0,
        }
    }
}

/// The codes 0, 1, 2, ... that [`Override::codes`] hands out.
const CODES: [f64; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
];

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

/// Declares a [`Shader`] from a file below the workspace's `shaders/` folder, with optional
/// `includes: [..]` and `overrides: [..]` (of [`Override`]s).
#[macro_export]
#[doc(hidden)]
macro_rules! wgsl {
    ($path:literal $(, includes: [$($inc:expr),* $(,)?])? $(, overrides: [$($ov:expr),* $(,)?])?) => {
        $crate::gpu::Shader {
            name: $path,
            source: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../shaders/", $path)),
            includes: &[$($(&$inc),*)?],
            overrides: &[$($($ov),*)?],
        }
    };
}
