//! Compute pipelines, compiled once per (shader, entry point, override constants).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::shader::Shader;

/// A compiled kernel and the layout of its single bind group.
pub struct Pipeline {
    /// The compiled compute pipeline.
    pub pipeline: wgpu::ComputePipeline,
    /// The layout of the kernel's bind group 0, which launches build their bind groups against.
    pub layout: wgpu::BindGroupLayout,
    /// `shader:entry`, used to label bind groups so that validation errors name the kernel.
    pub label: String,
}

/// Cache key: override constants are compared by their bits so that the key is `Eq + Hash`.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    shader: &'static str,
    entry: &'static str,
    constants: Vec<(&'static str, u64)>,
}

/// Compiles shader modules and pipelines on first use and keeps them.
pub struct PipelineCache {
    device: wgpu::Device,
    /// Whether modules keep naga's runtime bounds checks (debug builds) or not (release).
    checked: bool,
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<Key, Arc<Pipeline>>>,
}

impl PipelineCache {
    pub fn new(device: wgpu::Device, checked: bool) -> Self {
        Self {
            device,
            checked,
            modules: Mutex::default(),
            pipelines: Mutex::default(),
        }
    }

    /// The shaders compiled so far, by name, sorted.
    pub fn shaders(&self) -> Vec<&'static str> {
        let modules = self.modules.lock().expect("module cache lock");
        let mut names: Vec<&'static str> = modules.keys().copied().collect();
        names.sort_unstable();
        names
    }

    fn module(&self, shader: &'static Shader) -> wgpu::ShaderModule {
        let mut modules = self.modules.lock().expect("module cache lock");
        modules
            .entry(shader.name)
            .or_insert_with(|| {
                let source = shader.full_source();
                let desc = wgpu::ShaderModuleDescriptor {
                    label: Some(shader.name),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                };
                let checks = if self.checked {
                    wgpu::ShaderRuntimeChecks::checked()
                } else {
                    wgpu::ShaderRuntimeChecks::unchecked()
                };
                // SAFETY: every kernel in shaders/ guards its own indices against the lengths it
                // is given (see the `if (i >= n) { return; }` guards), and the kernel tests run
                // in debug builds, where `checked` keeps naga's bounds checks on.
                unsafe { self.device.create_shader_module_trusted(desc, checks) }
            })
            .clone()
    }

    /// The pipeline for `entry` of `shader` with the given override constants.
    pub fn get(
        &self,
        shader: &'static Shader,
        entry: &'static str,
        constants: &[(&'static str, f64)],
    ) -> Arc<Pipeline> {
        let key = Key {
            shader: shader.name,
            entry,
            constants: constants.iter().map(|(k, v)| (*k, v.to_bits())).collect(),
        };
        if let Some(p) = self
            .pipelines
            .lock()
            .expect("pipeline cache lock")
            .get(&key)
        {
            return p.clone();
        }
        debug_assert!(
            undeclared(shader, constants).is_none(),
            "{}: override {} is not declared among the shader's values in its wgsl! \
             declaration; declare it so that the back-end tests translate this variant",
            shader.name,
            undeclared(shader, constants).unwrap_or_default()
        );
        let module = self.module(shader);
        let label = format!("{}:{}", shader.name, entry);
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        let layout = pipeline.get_bind_group_layout(0);
        let compiled = Arc::new(Pipeline {
            pipeline,
            layout,
            label,
        });
        self.pipelines
            .lock()
            .expect("pipeline cache lock")
            .insert(key, compiled.clone());
        compiled
    }

    /// Number of distinct pipelines compiled so far.
    pub fn len(&self) -> usize {
        self.pipelines.lock().expect("pipeline cache lock").len()
    }
}

/// The first of `constants` that `shader` does not declare, as `NAME = value`.
fn undeclared(shader: &Shader, constants: &[(&'static str, f64)]) -> Option<String> {
    constants
        .iter()
        .find(|(name, value)| {
            !shader
                .overrides
                .iter()
                .any(|o| o.name == *name && o.values.contains(value))
        })
        .map(|(name, value)| format!("{name} = {value}"))
}
