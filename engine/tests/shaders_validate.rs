//! Parses and validates every `.wgsl` file in `shaders/` with naga, and checks that each one
//! is registered with the engine (so none is dead or silently untested).

use std::path::{Path, PathBuf};

use murmur_engine::shaders::all_shaders;

fn wgsl_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("shaders/ is readable") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            wgsl_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "wgsl") {
            out.push(path);
        }
    }
}

#[test]
fn every_shader_file_parses_validates_and_is_registered() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
    let mut files = vec![];
    wgsl_files(&root, &mut files);
    assert!(
        files.len() >= 10,
        "found only {} shaders under {}",
        files.len(),
        root.display()
    );
    let registered = all_shaders();
    for file in files {
        let name = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let shader = registered
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| {
                panic!("shaders/{name} is not registered in engine/src/kernels/mod.rs")
            });
        let source = shader.full_source();
        let module = naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| {
            panic!(
                "shaders/{name} does not parse:\n{}",
                e.emit_to_string(&source)
            )
        });
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::default(),
        )
        .validate(&module)
        .unwrap_or_else(|e| {
            panic!(
                "shaders/{name} does not validate:\n{}",
                e.emit_to_string(&source)
            )
        });
    }
}
