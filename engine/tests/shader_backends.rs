//! Every shader through every back end that wgpu uses: each registered module, with every
//! combination of the override values its declaration lists (the pipeline cache refuses
//! others in debug builds), is translated by naga to SPIR-V (Vulkan), MSL (Metal), HLSL
//! (DX12, shader models 5.1 and 6.0) and GLSL (OpenGL 4.3 and OpenGL ES 3.1, per entry
//! point, as wgpu's GL back end compiles them). Any translation error fails the test.
//!
//! Where Debian's validators are installed (`spirv-val` from spirv-tools, `glslangValidator`
//! from glslang-tools; scripts/test.sh installs both), their verdict on the output counts too.
//! With `MURMUR_REQUIRE_VALIDATORS=1` (set by scripts/test.sh) a missing validator fails the
//! test instead of being skipped.
//!
//! The same pass measures what each entry point asks of an adapter (workgroup size, workgroup
//! storage, storage buffers). `docs/kernel-limits.md` carries that table; the test fails when
//! the file and the shaders disagree (`MURMUR_WRITE_DOCS=1` rewrites it), and when
//! `KERNEL_NEEDS`, which the runtime checks adapters against, is not the table's maximum.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use murmur_engine::gpu::{KernelNeeds, Shader, KERNEL_NEEDS};
use murmur_engine::shaders::all_shaders;
use naga::back::{glsl, hlsl, msl, spv};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
use naga::{AddressSpace, Module, ShaderStage};

/// One override assignment: (name, value) pairs.
type Assignment = Vec<(&'static str, f64)>;

/// Every combination of the shader's declared override values (one empty one if it has none).
fn assignments(shader: &Shader) -> Vec<Assignment> {
    let mut all: Vec<Assignment> = vec![vec![]];
    for o in shader.overrides {
        all = all
            .iter()
            .flat_map(|a| {
                o.values.iter().map(move |&v| {
                    let mut next = a.clone();
                    next.push((o.name, v));
                    next
                })
            })
            .collect();
    }
    all
}

fn describe(a: &Assignment) -> String {
    if a.is_empty() {
        return "no overrides".into();
    }
    a.iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The module with its overrides fixed, validated again.
fn specialise(
    shader: &Shader,
    module: &Module,
    info: &ModuleInfo,
    a: &Assignment,
) -> (Module, ModuleInfo) {
    let mut constants = naga::back::PipelineConstants::default();
    for (name, value) in a {
        constants.insert(name.to_string(), *value);
    }
    let (m, i) = naga::back::pipeline_constants::process_overrides(module, info, None, &constants)
        .unwrap_or_else(|e| panic!("{} ({}): overrides: {e}", shader.name, describe(a)));
    (m.into_owned(), i.into_owned())
}

/// What one entry point asks of the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct EntryNeeds {
    size: [u32; 3],
    workgroup_storage: u32,
    storage_buffers: u32,
}

fn entry_needs(module: &Module, info: &ModuleInfo, index: usize) -> EntryNeeds {
    let ep = &module.entry_points[index];
    let uses = info.get_entry_point(index);
    let mut needs = EntryNeeds {
        size: ep.workgroup_size,
        ..Default::default()
    };
    for (handle, var) in module.global_variables.iter() {
        if uses[handle].is_empty() {
            continue;
        }
        match var.space {
            AddressSpace::WorkGroup => {
                needs.workgroup_storage += module.types[var.ty].inner.size(module.to_ctx());
            }
            AddressSpace::Storage { .. } => needs.storage_buffers += 1,
            _ => {}
        }
    }
    needs
}

/// Output files for the external validators, and where they go.
struct Outputs {
    dir: PathBuf,
    spirv: Vec<PathBuf>,
    glsl: Vec<PathBuf>,
    seen: BTreeSet<u64>,
}

impl Outputs {
    /// Writes `bytes` unless an identical output was written already (most override values
    /// leave most entry points unchanged).
    fn keep(&mut self, name: String, bytes: &[u8], spirv: bool) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        if !self.seen.insert(h.finish()) {
            return;
        }
        let path = self.dir.join(name);
        std::fs::write(&path, bytes).expect("temp dir is writable");
        if spirv {
            self.spirv.push(path);
        } else {
            self.glsl.push(path);
        }
    }
}

fn translate_everywhere(
    shader: &Shader,
    module: &Module,
    info: &ModuleInfo,
    a: &Assignment,
    tag: &str,
    out: &mut Outputs,
) {
    let what = || format!("{} ({})", shader.name, describe(a));

    let words = spv::write_vec(module, info, &spv::Options::default(), None)
        .unwrap_or_else(|e| panic!("{}: SPIR-V: {e}", what()));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    out.keep(format!("{tag}.spv"), &bytes, true);

    let msl_options = msl::Options {
        lang_version: (2, 0),
        ..Default::default()
    };
    msl::write_string(module, info, &msl_options, &msl::PipelineOptions::default())
        .unwrap_or_else(|e| panic!("{}: MSL: {e}", what()));

    for model in [hlsl::ShaderModel::V5_1, hlsl::ShaderModel::V6_0] {
        let options = hlsl::Options {
            shader_model: model,
            ..Default::default()
        };
        let mut text = String::new();
        hlsl::Writer::new(&mut text, &options, &hlsl::PipelineOptions::default())
            .write(module, info, None)
            .unwrap_or_else(|e| panic!("{}: HLSL {model:?}: {e}", what()));
    }

    for (ep_index, ep) in module.entry_points.iter().enumerate() {
        assert_eq!(
            ep.stage,
            ShaderStage::Compute,
            "{}: {} is not a compute entry",
            what(),
            ep.name
        );
        for (version, suffix) in [
            (glsl::Version::Desktop(430), "gl430"),
            (glsl::Version::new_gles(310), "es310"),
        ] {
            let options = glsl::Options {
                version,
                ..Default::default()
            };
            let pipeline = glsl::PipelineOptions {
                shader_stage: ShaderStage::Compute,
                entry_point: ep.name.clone(),
                multiview: None,
            };
            let mut text = String::new();
            glsl::Writer::new(
                &mut text,
                module,
                info,
                &options,
                &pipeline,
                Default::default(),
            )
            .and_then(|mut w| w.write())
            .unwrap_or_else(|e| panic!("{}: GLSL {suffix} {}: {e:?}", what(), ep.name));
            out.keep(
                format!("{tag}.{ep_index}.{suffix}.comp"),
                text.as_bytes(),
                false,
            );
        }
    }
}

/// Runs `tool` on each file (or on all at once), failing with its output on any rejection.
fn validate_with(tool: &str, args: &[&str], files: &[PathBuf], batch: bool) -> Option<usize> {
    if Command::new(tool).arg("--version").output().is_err() {
        let required = std::env::var("MURMUR_REQUIRE_VALIDATORS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{tool} is not installed (scripts/test.sh installs it)"
        );
        eprintln!("{tool} is not installed: its check is skipped");
        return None;
    }
    let groups: Vec<&[PathBuf]> = if batch {
        files.chunks(200).collect()
    } else {
        files.chunks(1).collect()
    };
    for group in groups {
        let result = Command::new(tool)
            .args(args)
            .args(group)
            .output()
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        assert!(
            result.status.success(),
            "{tool} rejects {}:\n{}{}",
            group
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
    }
    Some(files.len())
}

/// The limits table as docs/kernel-limits.md carries it.
fn limits_table(rows: &BTreeMap<(String, String), EntryNeeds>) -> String {
    let webgpu = wgpu::Limits::default();
    let downlevel = wgpu::Limits::downlevel_defaults();
    let mut s = String::from(
        "| shader | entry point | workgroup size | invocations | workgroup storage (bytes) | storage buffers | fits downlevel |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for ((shader, entry), n) in rows {
        let fits = KernelNeeds::of(n.size, n.workgroup_storage, n.storage_buffers)
            .shortfalls(&downlevel)
            .is_empty();
        assert!(
            KernelNeeds::of(n.size, n.workgroup_storage, n.storage_buffers)
                .shortfalls(&webgpu)
                .is_empty(),
            "{shader}:{entry} needs more than WebGPU's default limits: {n:?}"
        );
        s.push_str(&format!(
            "| {shader} | {entry} | {} × {} × {} | {} | {} | {} | {} |\n",
            n.size[0],
            n.size[1],
            n.size[2],
            n.size.iter().product::<u32>(),
            n.workgroup_storage,
            n.storage_buffers,
            if fits { "yes" } else { "no" }
        ));
    }
    s
}

const TABLE_START: &str = "<!-- kernel table: written by engine/tests/shader_backends.rs -->\n";
const TABLE_END: &str = "<!-- end of kernel table -->\n";

#[test]
fn every_entry_point_translates_to_every_back_end() {
    let dir = std::env::temp_dir().join(format!("murmur-shader-backends-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut out = Outputs {
        dir: dir.clone(),
        spirv: vec![],
        glsl: vec![],
        seen: BTreeSet::new(),
    };
    // Per (shader, entry): the largest needs over its variants.
    let mut needs: BTreeMap<(String, String), EntryNeeds> = BTreeMap::new();
    let mut variants = 0;
    for (s_index, shader) in all_shaders().into_iter().enumerate() {
        let source = shader.full_source();
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{}: {}", shader.name, e.emit_to_string(&source)));
        let info = Validator::new(ValidationFlags::all(), Capabilities::default())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {}", shader.name, e.emit_to_string(&source)));
        if module.entry_points.is_empty() {
            // An include (helpers only): it is translated as part of every shader using it.
            continue;
        }
        let declared: BTreeSet<&str> = shader.overrides.iter().map(|o| o.name).collect();
        for o in module
            .overrides
            .iter()
            .map(|(_, o)| o.name.as_deref().unwrap_or("?"))
        {
            assert!(
                declared.contains(o),
                "{}: override {o} has no declared values in its wgsl! declaration",
                shader.name
            );
        }
        for (a_index, a) in assignments(shader).iter().enumerate() {
            let (m, i) = specialise(shader, &module, &info, a);
            translate_everywhere(shader, &m, &i, a, &format!("{s_index}-{a_index}"), &mut out);
            for (e_index, ep) in m.entry_points.iter().enumerate() {
                let n = entry_needs(&m, &i, e_index);
                let slot = needs
                    .entry((shader.name.to_string(), ep.name.clone()))
                    .or_default();
                for d in 0..3 {
                    slot.size[d] = slot.size[d].max(n.size[d]);
                }
                slot.workgroup_storage = slot.workgroup_storage.max(n.workgroup_storage);
                slot.storage_buffers = slot.storage_buffers.max(n.storage_buffers);
            }
            variants += 1;
        }
    }
    let spirv = validate_with(
        "spirv-val",
        &["--target-env", "vulkan1.0"],
        &out.spirv,
        false,
    );
    let glsl = validate_with("glslangValidator", &["-S", "comp"], &out.glsl, true);
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "{} entry points of {} shaders, {variants} override variants, each to SPIR-V, MSL 2.0, \
         HLSL SM 5.1 and 6.0, GLSL 430 and ES 310; validated: {} SPIR-V modules by spirv-val, \
         {} GLSL shaders by glslangValidator",
        needs.len(),
        all_shaders().len(),
        spirv.map_or("no".to_string(), |n| n.to_string()),
        glsl.map_or("no".to_string(), |n| n.to_string()),
    );
    for (shader, entry) in needs.keys() {
        println!("  {shader}:{entry}");
    }

    // What the runtime demands of adapters is exactly what the kernels use.
    let most = needs
        .values()
        .fold(EntryNeeds::default(), |m, n| EntryNeeds {
            size: [0, 1, 2].map(|d| m.size[d].max(n.size[d])),
            workgroup_storage: m.workgroup_storage.max(n.workgroup_storage),
            storage_buffers: m.storage_buffers.max(n.storage_buffers),
        });
    let invocations = needs
        .values()
        .map(|n| n.size.iter().product::<u32>())
        .max()
        .unwrap();
    assert_eq!(
        (
            most.size,
            invocations,
            most.workgroup_storage,
            most.storage_buffers
        ),
        (
            KERNEL_NEEDS.workgroup_size,
            KERNEL_NEEDS.invocations,
            KERNEL_NEEDS.workgroup_storage,
            KERNEL_NEEDS.storage_buffers
        ),
        "gpu::KERNEL_NEEDS must be the kernels' maximum (size, invocations, storage, buffers)"
    );

    // docs/kernel-limits.md carries the table.
    let table = limits_table(&needs);
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/kernel-limits.md");
    let text = std::fs::read_to_string(&doc).unwrap_or_default();
    let (before, rest) = text.split_once(TABLE_START).unwrap_or((&text, ""));
    let after = rest.split_once(TABLE_END).map_or("", |(_, a)| a);
    let current = rest.split_once(TABLE_END).map_or("", |(t, _)| t);
    if std::env::var("MURMUR_WRITE_DOCS").is_ok_and(|v| v == "1") {
        std::fs::write(
            &doc,
            format!("{before}{TABLE_START}{table}{TABLE_END}{after}"),
        )
        .expect("docs/ is writable");
    } else {
        assert_eq!(
            current, table,
            "docs/kernel-limits.md is out of date: rerun this test with MURMUR_WRITE_DOCS=1"
        );
    }
}
