//! What murmur's kernels ask of an adapter, and the check that refuses an adapter granting
//! less, with a message that names the limit, before any kernel fails on it.
//!
//! `KERNEL_NEEDS` is the maximum over every entry point and override variant; the back-end
//! test (engine/tests/shader_backends.rs) measures the kernels with naga and fails when this
//! constant differs, and docs/kernel-limits.md lists each kernel.

/// Resources one kernel, or all of them, need from an adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelNeeds {
    /// Largest workgroup size along x, y and z.
    pub workgroup_size: [u32; 3],
    /// Most invocations in one workgroup.
    pub invocations: u32,
    /// Most bytes of workgroup memory one kernel declares.
    pub workgroup_storage: u32,
    /// Most storage buffers one kernel binds.
    pub storage_buffers: u32,
}

/// What the engine's kernels need together (see the module docs).
pub const KERNEL_NEEDS: KernelNeeds = KernelNeeds {
    workgroup_size: [256, 16, 1],
    invocations: 256,
    workgroup_storage: 8192,
    storage_buffers: 5,
};

/// Workgroups per dispatch dimension that the launch helpers assume (WebGPU's default):
/// larger grids are split into several dimensions or launches below this.
pub const WORKGROUPS_PER_DIMENSION: u32 = 65535;

impl KernelNeeds {
    /// The needs of one kernel with this workgroup size, storage and buffer count.
    pub fn of(workgroup_size: [u32; 3], workgroup_storage: u32, storage_buffers: u32) -> Self {
        Self {
            workgroup_size,
            invocations: workgroup_size.iter().product(),
            workgroup_storage,
            storage_buffers,
        }
    }

    /// Each limit of `limits` below what these kernels need, as `name: granted, needed`.
    /// Empty when the adapter is large enough.
    pub fn shortfalls(&self, limits: &wgpu::Limits) -> Vec<String> {
        let checks = [
            (
                "max_compute_workgroup_size_x",
                limits.max_compute_workgroup_size_x,
                self.workgroup_size[0],
            ),
            (
                "max_compute_workgroup_size_y",
                limits.max_compute_workgroup_size_y,
                self.workgroup_size[1],
            ),
            (
                "max_compute_workgroup_size_z",
                limits.max_compute_workgroup_size_z,
                self.workgroup_size[2],
            ),
            (
                "max_compute_invocations_per_workgroup",
                limits.max_compute_invocations_per_workgroup,
                self.invocations,
            ),
            (
                "max_compute_workgroup_storage_size",
                limits.max_compute_workgroup_storage_size,
                self.workgroup_storage,
            ),
            (
                "max_storage_buffers_per_shader_stage",
                limits.max_storage_buffers_per_shader_stage,
                self.storage_buffers,
            ),
            (
                "max_uniform_buffers_per_shader_stage",
                limits.max_uniform_buffers_per_shader_stage,
                1,
            ),
            ("max_bind_groups", limits.max_bind_groups, 1),
            (
                "max_compute_workgroups_per_dimension",
                limits.max_compute_workgroups_per_dimension,
                WORKGROUPS_PER_DIMENSION,
            ),
        ];
        checks
            .into_iter()
            .filter(|(_, granted, needed)| granted < needed)
            .map(|(name, granted, needed)| format!("{name} is {granted}, kernels need {needed}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webgpu_defaults_suffice_and_smaller_limits_are_named() {
        assert_eq!(
            KERNEL_NEEDS.shortfalls(&wgpu::Limits::default()),
            Vec::<String>::new()
        );
        let small = wgpu::Limits {
            max_storage_buffers_per_shader_stage: 4,
            max_compute_workgroup_storage_size: 4096,
            ..wgpu::Limits::default()
        };
        let short = KERNEL_NEEDS.shortfalls(&small);
        assert_eq!(short.len(), 2, "{short:?}");
        assert!(short[0].contains("max_compute_workgroup_storage_size is 4096, kernels need 8192"));
        assert!(short[1].contains("max_storage_buffers_per_shader_stage is 4, kernels need 5"));
        // WebGL2's downlevel limits have no compute at all.
        assert!(!KERNEL_NEEDS
            .shortfalls(&wgpu::Limits::downlevel_webgl2_defaults())
            .is_empty());
    }
}
