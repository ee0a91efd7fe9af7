//! `murmur info`: the machine, the GPU adapters murmur can see, the one it picks with its
//! limits, features, subgroup sizes and matmul kernel; as text or (`--json`) one JSON object.

use clap::Args;
use murmur_engine::gpu::{list_adapters, AdapterPreference, Gpu, NO_ADAPTER_HELP};
use murmur_engine::Device;
use serde::Serialize;

use super::machine::Machine;

#[derive(Args)]
pub struct InfoArgs {
    /// Print one JSON object on stdout instead of text (for scripts and bug reports).
    #[arg(long)]
    json: bool,
}

/// Everything `murmur info` reports.
#[derive(Serialize)]
struct Info {
    murmur: &'static str,
    machine: Machine,
    adapters: Vec<Adapter>,
    /// What `--device auto` (the default) trains on, and why.
    device_auto: String,
    /// The CPU path's micro-kernel for this CPU.
    cpu_kernel: String,
    /// The adapter `--device gpu` opens; none where there is no adapter (auto then picks
    /// the CPU path).
    selected: Option<Selected>,
}

#[derive(Serialize)]
struct Adapter {
    name: String,
    backend: String,
    device_type: String,
    driver: String,
}

#[derive(Serialize)]
struct Selected {
    description: String,
    #[serde(flatten)]
    adapter: Adapter,
    subgroup_sizes: [u32; 2],
    /// The matmul kernel per shape class and where the choice came from (measured now, the
    /// cache, or MURMUR_MATMUL).
    matmul_kernels: String,
    limits: Limits,
    features: Vec<String>,
}

/// The limits murmur's kernels depend on.
#[derive(Serialize)]
struct Limits {
    max_buffer_size: u64,
    max_storage_buffer_binding_size: u64,
    max_storage_buffers_per_shader_stage: u32,
    max_compute_workgroup_storage_size: u32,
    max_compute_invocations_per_workgroup: u32,
    max_compute_workgroup_size: [u32; 3],
    max_compute_workgroups_per_dimension: u32,
    min_uniform_buffer_offset_alignment: u32,
}

fn adapter(i: &wgpu::AdapterInfo) -> Adapter {
    Adapter {
        name: i.name.clone(),
        backend: format!("{:?}", i.backend),
        device_type: format!("{:?}", i.device_type),
        driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
    }
}

fn gather() -> anyhow::Result<Info> {
    let pref = AdapterPreference::from_env()?;
    let adapters = list_adapters(&AdapterPreference {
        name: None,
        backend: pref.backend,
    })
    .iter()
    .map(|a| adapter(&a.adapter))
    .collect();
    let (auto, device_auto) = Device::auto()?;
    // Auto opened the preferred adapter if it is a hardware one; open it only where it did not.
    let gpu = match auto.as_gpu() {
        Some(gpu) => Ok(gpu.clone()),
        None => Gpu::with_preference(&pref),
    };
    let selected = match gpu {
        Ok(gpu) => Some(selected(&gpu)?),
        // Auto fell back to the CPU path without complaint: say so rather than fail.
        Err(murmur_engine::Error::NoAdapter(_)) if device_auto.starts_with("cpu") => None,
        Err(e) => return Err(e.into()),
    };
    Ok(Info {
        murmur: env!("CARGO_PKG_VERSION"),
        machine: Machine::detect(),
        adapters,
        device_auto,
        cpu_kernel: murmur_engine::cpu::gemm::describe(),
        selected,
    })
}

fn selected(gpu: &Gpu) -> anyhow::Result<Selected> {
    let info = gpu.info();
    let (a, l) = (&info.adapter, &info.limits);
    Ok(Selected {
        description: gpu.describe(),
        adapter: adapter(a),
        subgroup_sizes: [a.subgroup_min_size, a.subgroup_max_size],
        matmul_kernels: murmur_node::tune_matmul(gpu)?,
        limits: Limits {
            max_buffer_size: l.max_buffer_size,
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroup_size: [
                l.max_compute_workgroup_size_x,
                l.max_compute_workgroup_size_y,
                l.max_compute_workgroup_size_z,
            ],
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            min_uniform_buffer_offset_alignment: l.min_uniform_buffer_offset_alignment,
        },
        features: (info.features.features_wgpu.iter_names())
            .map(|(name, _)| name.to_string())
            .chain((info.features.features_webgpu.iter_names()).map(|(name, _)| name.to_string()))
            .collect(),
    })
}

pub fn run(a: InfoArgs) -> anyhow::Result<()> {
    let info = gather()?;
    if a.json {
        let json = serde_json::to_string_pretty(&info)? + "\n";
        return super::stdout::print(json.as_bytes());
    }
    println!("murmur {} on {}", info.murmur, info.machine);
    println!("adapters with compute shaders: {}", info.adapters.len());
    for a in &info.adapters {
        println!(
            "  - {} ({}, {}, driver {})",
            a.name, a.backend, a.device_type, a.driver
        );
    }
    println!("device auto (the default): {}", info.device_auto);
    println!(
        "CPU path (--device cpu): matmul micro-kernel {}",
        info.cpu_kernel
    );
    let Some(s) = &info.selected else {
        println!("no GPU adapter: {NO_ADAPTER_HELP}");
        return Ok(());
    };
    let l = &s.limits;
    println!("selected GPU adapter (--device gpu): {}", s.description);
    println!("  device type: {}", s.adapter.device_type);
    println!(
        "  subgroup size: {}..{}",
        s.subgroup_sizes[0], s.subgroup_sizes[1]
    );
    println!("  matmul kernels: {}", s.matmul_kernels);
    println!("  limits:");
    for (name, value) in [
        ("max_buffer_size", l.max_buffer_size.to_string()),
        (
            "max_storage_buffer_binding_size",
            l.max_storage_buffer_binding_size.to_string(),
        ),
        (
            "max_storage_buffers_per_shader_stage",
            l.max_storage_buffers_per_shader_stage.to_string(),
        ),
        (
            "max_compute_workgroup_storage_size",
            l.max_compute_workgroup_storage_size.to_string(),
        ),
        (
            "max_compute_invocations_per_workgroup",
            l.max_compute_invocations_per_workgroup.to_string(),
        ),
        (
            "max_compute_workgroup_size",
            format!(
                "{} x {} x {}",
                l.max_compute_workgroup_size[0],
                l.max_compute_workgroup_size[1],
                l.max_compute_workgroup_size[2]
            ),
        ),
        (
            "max_compute_workgroups_per_dimension",
            l.max_compute_workgroups_per_dimension.to_string(),
        ),
        (
            "min_uniform_buffer_offset_alignment",
            l.min_uniform_buffer_offset_alignment.to_string(),
        ),
    ] {
        println!("    {name}: {value}");
    }
    println!("  features enabled: {}", s.features.join(", "));
    println!(
        "override with --device gpu|cpu, MURMUR_ADAPTER=<name substring> and \
         MURMUR_BACKEND=vulkan|metal|dx12|gl"
    );
    Ok(())
}
