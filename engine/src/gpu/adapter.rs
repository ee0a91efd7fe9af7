//! Adapter choice: which of the machine's GPUs (or software rasterisers) murmur runs on.
//!
//! Default: the best compute-capable adapter of the primary backends (Vulkan, Metal, DX12),
//! discrete GPUs first, software adapters (lavapipe, WARP) last. Two environment variables
//! override it:
//! - `MURMUR_ADAPTER=<substring>`: the first adapter whose name contains it (case-insensitive);
//! - `MURMUR_BACKEND=vulkan|metal|dx12|gl`: only adapters of that backend (`gl` is never used
//!   unless asked for: its compute support is too uneven).

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

/// Picks the index of the adapter to use among `infos`, or `None` if nothing matches.
/// Only adapters with compute support should be passed in.
pub fn choose(infos: &[wgpu::AdapterInfo], pref: &AdapterPreference) -> Option<usize> {
    let wanted_name = pref.name.as_ref().map(|n| n.to_lowercase());
    infos
        .iter()
        .enumerate()
        .filter(|(_, i)| pref.backend.is_none_or(|b| i.backend == b))
        .filter(|(_, i)| {
            wanted_name
                .as_ref()
                .is_none_or(|n| i.name.to_lowercase().contains(n.as_str()))
        })
        // Stable order among equals: the instance's own enumeration order.
        .min_by_key(|(idx, i)| (type_rank(i.device_type), *idx))
        .map(|(idx, _)| idx)
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
    let infos: Vec<_> = adapters.iter().map(|a| a.get_info()).collect();
    match choose(&infos, pref) {
        Some(i) => Ok(adapters
            .into_iter()
            .nth(i)
            .expect("index from choose is in range")),
        None if adapters.is_empty() => Err(Error::NoAdapter(NO_ADAPTER_HELP.to_string())),
        None => {
            let seen: Vec<String> = infos
                .iter()
                .map(|i| format!("{} ({:?})", i.name, i.backend))
                .collect();
            Err(Error::NoAdapter(format!(
                "no adapter matches MURMUR_ADAPTER={:?} MURMUR_BACKEND={:?}; adapters seen: {}",
                pref.name.as_deref().unwrap_or(""),
                pref.backend,
                seen.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, t: wgpu::DeviceType, b: wgpu::Backend) -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
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
        }
    }

    #[test]
    fn prefers_discrete_then_respects_overrides() {
        use wgpu::{Backend::*, DeviceType::*};
        let infos = [
            info("llvmpipe (LLVM 15)", Cpu, Vulkan),
            info("Intel UHD 630", IntegratedGpu, Vulkan),
            info("NVIDIA H100", DiscreteGpu, Vulkan),
            info("NVIDIA H100", DiscreteGpu, Gl),
        ];
        assert_eq!(choose(&infos, &AdapterPreference::default()), Some(2));
        let by_name = AdapterPreference {
            name: Some("LLVMPIPE".into()),
            backend: None,
        };
        assert_eq!(choose(&infos, &by_name), Some(0));
        let by_backend = AdapterPreference {
            name: None,
            backend: Some(Gl),
        };
        assert_eq!(choose(&infos, &by_backend), Some(3));
        let nothing = AdapterPreference {
            name: Some("radeon".into()),
            backend: None,
        };
        assert_eq!(choose(&infos, &nothing), None);
        assert_eq!(choose(&[], &AdapterPreference::default()), None);
    }

    #[test]
    fn backend_names_parse_and_bad_ones_explain() {
        assert_eq!(parse_backend("Vulkan").unwrap(), wgpu::Backend::Vulkan);
        assert_eq!(parse_backend("dx12").unwrap(), wgpu::Backend::Dx12);
        let err = parse_backend("cuda").unwrap_err().to_string();
        assert!(err.contains("vulkan, metal, dx12 or gl"), "{err}");
    }
}
