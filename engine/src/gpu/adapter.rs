//! Adapter choice: which of the machine's GPUs (or software rasterisers) murmur runs on.
//!
//! Default: the best compute-capable adapter of the primary backends (Vulkan, Metal, DX12),
//! discrete GPUs first, software adapters (lavapipe, WARP) last. Two environment variables
//! override it:
//! - `MURMUR_ADAPTER=<substring>`: the first adapter whose name contains it (case-insensitive);
//! - `MURMUR_BACKEND=vulkan|metal|dx12|gl`: only adapters of that backend (`gl` is never used
//!   unless asked for: its compute support is too uneven).

use super::needs::KERNEL_NEEDS;
use crate::error::{Error, Result};

/// How to obtain an adapter when none is found; shown to users verbatim.
pub const NO_ADAPTER_HELP: &str = "no GPU adapter with compute shaders was found. \
Install your GPU's Vulkan, Metal or DX12 driver; on Linux without a GPU, install Mesa's \
software Vulkan driver (lavapipe) with `sudo apt-get install mesa-vulkan-drivers` \
(Debian/Ubuntu) or `sudo dnf install mesa-vulkan-drivers` (Fedora). \
`murmur info` lists the adapters murmur can see.";

/// The user's adapter preferences, read from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdapterPreference {
    /// Case-insensitive substring of the adapter name.
    pub name: Option<String>,
    /// Restrict to one backend.
    pub backend: Option<wgpu::Backend>,
}

impl AdapterPreference {
    /// Reads `MURMUR_ADAPTER` and `MURMUR_BACKEND`.
    pub fn from_env() -> Result<Self> {
        let name = std::env::var("MURMUR_ADAPTER")
            .ok()
            .filter(|s| !s.is_empty());
        let backend = match std::env::var("MURMUR_BACKEND") {
            Ok(s) if !s.is_empty() => Some(parse_backend(&s)?),
            _ => None,
        };
        Ok(Self { name, backend })
    }

    /// The backends worth asking the instance for.
    pub fn backends(&self) -> wgpu::Backends {
        match self.backend {
            Some(b) => wgpu::Backends::from(b),
            None => wgpu::Backends::PRIMARY,
        }
    }
}

/// Parses a backend name as users type it.
pub fn parse_backend(s: &str) -> Result<wgpu::Backend> {
    match s.to_ascii_lowercase().as_str() {
        "vulkan" | "vk" => Ok(wgpu::Backend::Vulkan),
        "metal" | "mtl" => Ok(wgpu::Backend::Metal),
        "dx12" | "d3d12" => Ok(wgpu::Backend::Dx12),
        "gl" | "gles" | "opengl" => Ok(wgpu::Backend::Gl),
        other => Err(Error::Config(format!(
            "MURMUR_BACKEND={other} is not a backend; use vulkan, metal, dx12 or gl"
        ))),
    }
}

/// Lower is better: discrete GPUs first, CPUs (lavapipe, WARP) last.
fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// An adapter as the choice sees it: what it is and the limits it grants.
pub struct Candidate {
    /// Name, backend, device type.
    pub info: wgpu::AdapterInfo,
    /// The limits the adapter can grant.
    pub limits: wgpu::Limits,
}

/// Picks the index of the adapter to use among `candidates`: the best one that matches the
/// preferences and grants what the kernels need ([`KERNEL_NEEDS`]). `Err` says why none
/// does. Only adapters with compute support should be passed in.
pub fn choose(candidates: &[Candidate], pref: &AdapterPreference) -> Result<usize> {
    let wanted_name = pref.name.as_ref().map(|n| n.to_lowercase());
    let matching: Vec<(usize, &Candidate)> = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| pref.backend.is_none_or(|b| c.info.backend == b))
        .filter(|(_, c)| {
            wanted_name
                .as_ref()
                .is_none_or(|n| c.info.name.to_lowercase().contains(n.as_str()))
        })
        .collect();
    let best = matching
        .iter()
        .filter(|(_, c)| KERNEL_NEEDS.shortfalls(&c.limits).is_empty())
        // Stable order among equals: the instance's own enumeration order.
        .min_by_key(|(idx, c)| (type_rank(c.info.device_type), *idx))
        .map(|(idx, _)| *idx);
    if let Some(i) = best {
        return Ok(i);
    }
    if candidates.is_empty() {
        return Err(Error::NoAdapter(NO_ADAPTER_HELP.to_string()));
    }
    if !matching.is_empty() {
        let refused: Vec<String> = matching
            .iter()
            .map(|(_, c)| {
                format!(
                    "{} ({:?}) grants too little: {}",
                    c.info.name,
                    c.info.backend,
                    KERNEL_NEEDS.shortfalls(&c.limits).join("; ")
                )
            })
            .collect();
        return Err(Error::NoAdapter(format!(
            "no adapter can run murmur's kernels: {}. docs/kernel-limits.md lists what each \
             kernel needs",
            refused.join("; ")
        )));
    }
    let seen: Vec<String> = candidates
        .iter()
        .map(|c| format!("{} ({:?})", c.info.name, c.info.backend))
        .collect();
    Err(Error::NoAdapter(format!(
        "no adapter matches MURMUR_ADAPTER={:?} MURMUR_BACKEND={:?}; adapters seen: {}",
        pref.name.as_deref().unwrap_or(""),
        pref.backend,
        seen.join(", ")
    )))
}

/// Every compute-capable adapter the instance can see, with its info.
pub fn enumerate(instance: &wgpu::Instance, backends: wgpu::Backends) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(backends))
        .into_iter()
        .filter(|a| {
            a.get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
        })
        .collect()
}

/// Finds the adapter the preferences ask for.
pub fn select(instance: &wgpu::Instance, pref: &AdapterPreference) -> Result<wgpu::Adapter> {
    let adapters = enumerate(instance, pref.backends());
    let candidates: Vec<Candidate> = adapters
        .iter()
        .map(|a| Candidate {
            info: a.get_info(),
            limits: a.limits(),
        })
        .collect();
    let i = choose(&candidates, pref)?;
    Ok(adapters
        .into_iter()
        .nth(i)
        .expect("index from choose is in range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(name: &str, t: wgpu::DeviceType, b: wgpu::Backend) -> Candidate {
        Candidate {
            info: wgpu::AdapterInfo {
                name: name.into(),
                vendor: 0,
                device: 0,
                device_type: t,
                device_pci_bus_id: String::new(),
                driver: String::new(),
                driver_info: String::new(),
                backend: b,
                subgroup_min_size: 8,
                subgroup_max_size: 8,
                transient_saves_memory: None,
                limit_bucket: None,
            },
            limits: wgpu::Limits::default(),
        }
    }

    fn chosen(candidates: &[Candidate], pref: &AdapterPreference) -> Option<usize> {
        choose(candidates, pref).ok()
    }

    #[test]
    fn prefers_discrete_then_respects_overrides() {
        use wgpu::{Backend::*, DeviceType::*};
        let all = [
            candidate("llvmpipe (LLVM 15)", Cpu, Vulkan),
            candidate("Intel UHD 630", IntegratedGpu, Vulkan),
            candidate("NVIDIA H100", DiscreteGpu, Vulkan),
            candidate("NVIDIA H100", DiscreteGpu, Gl),
        ];
        assert_eq!(chosen(&all, &AdapterPreference::default()), Some(2));
        let by_name = AdapterPreference {
            name: Some("LLVMPIPE".into()),
            backend: None,
        };
        assert_eq!(chosen(&all, &by_name), Some(0));
        let by_backend = AdapterPreference {
            name: None,
            backend: Some(Gl),
        };
        assert_eq!(chosen(&all, &by_backend), Some(3));
        let nothing = AdapterPreference {
            name: Some("radeon".into()),
            backend: None,
        };
        let err = choose(&all, &nothing).unwrap_err().to_string();
        assert!(err.contains("adapters seen: llvmpipe"), "{err}");
        let err = choose(&[], &AdapterPreference::default()).unwrap_err();
        assert!(err.to_string().contains("mesa-vulkan-drivers"), "{err}");
    }

    #[test]
    fn an_adapter_below_the_kernels_needs_is_passed_over_or_refused_by_name() {
        use wgpu::{Backend::*, DeviceType::*};
        let mut small = candidate("Tiny iGPU", IntegratedGpu, Vulkan);
        small.limits = wgpu::Limits::downlevel_defaults();
        let all = [candidate("llvmpipe (LLVM 15)", Cpu, Vulkan), small];
        // The better-ranked adapter is too small: the next one that fits is taken.
        assert_eq!(chosen(&all, &AdapterPreference::default()), Some(0));
        // Asked for by name, it is refused with the limit that falls short.
        let tiny = AdapterPreference {
            name: Some("tiny".into()),
            backend: None,
        };
        let err = choose(&all, &tiny).unwrap_err().to_string();
        assert!(
            err.contains("Tiny iGPU (Vulkan) grants too little")
                && err.contains("max_storage_buffers_per_shader_stage is 4, kernels need 5"),
            "{err}"
        );
    }

    #[test]
    fn backend_names_parse_and_bad_ones_explain() {
        assert_eq!(parse_backend("Vulkan").unwrap(), wgpu::Backend::Vulkan);
        assert_eq!(parse_backend("dx12").unwrap(), wgpu::Backend::Dx12);
        let err = parse_backend("cuda").unwrap_err().to_string();
        assert!(err.contains("vulkan, metal, dx12 or gl"), "{err}");
    }
}
