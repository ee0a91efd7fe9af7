//! `murmur info`: adapters, limits, features, subgroup sizes.

use clap::Args;
use murmur_engine::gpu::{list_adapters, AdapterPreference, Gpu};
use murmur_engine::kernels::matmul::MatmulKernel;

#[derive(Args)]
pub struct InfoArgs {}

pub fn run(_: InfoArgs) -> anyhow::Result<()> {
    let pref = AdapterPreference::from_env()?;
    let all = list_adapters(&AdapterPreference {
        name: None,
        backend: pref.backend,
    });
    println!("adapters with compute shaders: {}", all.len());
    for a in &all {
        let i = &a.adapter;
        println!(
            "  - {} ({:?}, {:?}, driver {} {})",
            i.name, i.backend, i.device_type, i.driver, i.driver_info
        );
    }
    let gpu = Gpu::with_preference(&pref)?;
    let info = gpu.info();
    let (a, l) = (&info.adapter, &info.limits);
    println!("selected: {}", gpu.describe());
    println!("  device type: {:?}", a.device_type);
    println!(
        "  subgroup size: {}..{}",
        a.subgroup_min_size, a.subgroup_max_size
    );
    println!("  matmul kernel: {:?}", MatmulKernel::for_gpu(&gpu)?);
    println!("  limits:");
    println!("    max_buffer_size: {}", l.max_buffer_size);
    println!(
        "    max_storage_buffer_binding_size: {}",
        l.max_storage_buffer_binding_size
    );
    println!(
        "    max_storage_buffers_per_shader_stage: {}",
        l.max_storage_buffers_per_shader_stage
    );
    println!(
        "    max_compute_workgroup_storage_size: {}",
        l.max_compute_workgroup_storage_size
    );
    println!(
        "    max_compute_invocations_per_workgroup: {}",
        l.max_compute_invocations_per_workgroup
    );
    println!(
        "    max_compute_workgroup_size: {} x {} x {}",
        l.max_compute_workgroup_size_x,
        l.max_compute_workgroup_size_y,
        l.max_compute_workgroup_size_z
    );
    println!(
        "    max_compute_workgroups_per_dimension: {}",
        l.max_compute_workgroups_per_dimension
    );
    println!(
        "    min_uniform_buffer_offset_alignment: {}",
        l.min_uniform_buffer_offset_alignment
    );
    println!("  features enabled: {:?}", info.features);
    println!(
        "override with MURMUR_ADAPTER=<name substring> and MURMUR_BACKEND=vulkan|metal|dx12|gl"
    );
    Ok(())
}
