//! Bakes a run-time library path (RUNPATH) for libtorch into the binaries, so that
//! `target/release/lego-rl` runs without LD_LIBRARY_PATH. libtorch comes from the PyPI torch wheel
//! (scripts/setup.sh): its `torch/lib` plus the `nvidia/*/lib` folders of the CUDA wheels beside it.
//! RUNPATH (not RPATH) is used on purpose: LD_LIBRARY_PATH still takes precedence, so the same
//! binary can be pointed at another torch 2.11 install on a GPU box.
//!
//! It also compiles the c10d shim (`src/dist/shim.cpp`, see `src/dist/mod.rs`) against the same
//! libtorch headers with torch-sys's flags (C++17, the CXX11 ABI flag, GLOG_USE_GLOG_EXPORT).
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        panic!(
            "LIBTORCH is not set: run scripts/setup.sh (it links .libtorch, which \
             .cargo/config.toml names), or export LIBTORCH=/path/to/site-packages/torch"
        );
    };
    let torch = std::fs::canonicalize(&libtorch).unwrap_or_else(|_| PathBuf::from(&libtorch));
    compile_shim(&torch);
    let mut dirs = vec![torch.join("lib")];
    if let Some(site) = torch.parent() {
        dirs.extend(nvidia_lib_dirs(&site.join("nvidia")));
    }
    let joined: Vec<String> = dirs
        .iter()
        .filter(|d| d.is_dir())
        .map(|d| d.display().to_string())
        .collect();
    if !joined.is_empty() {
        println!(
            "cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{}",
            joined.join(":")
        );
    }
}

fn nvidia_lib_dirs(nvidia: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(nvidia) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path().join("lib"))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Compiles `src/dist/shim.cpp` into a static library linked into the crate. The wheel ships
/// libtorch's c10d headers but not Gloo's, which ProcessGroupGloo.hpp includes: the five names it
/// includes are pointed at `src/dist/gloo_decls.h` (why that is sound is explained there).
fn compile_shim(torch: &Path) {
    for f in ["src/dist/shim.cpp", "src/dist/gloo_decls.h"] {
        println!("cargo:rerun-if-changed={f}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let decls = std::fs::canonicalize("src/dist/gloo_decls.h").expect("src/dist/gloo_decls.h exists");
    let gloo = out.join("gloo-include");
    for name in [
        "gloo/algorithm.h",
        "gloo/common/error.h",
        "gloo/context.h",
        "gloo/rendezvous/store.h",
        "gloo/transport/device.h",
    ] {
        let path = gloo.join(name);
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("create gloo-include");
        std::fs::write(&path, format!("#pragma once\n#include \"{}\"\n", decls.display()))
            .expect("write gloo-include header");
    }
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .include(&gloo)
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .define("USE_C10D_GLOO", None)
        .file("src/dist/shim.cpp");
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        // ProcessGroupNCCL.hpp needs CUDA's headers: a CUDA toolkit's (CUDA_HOME, default
        // /usr/local/cuda; the runtime wheels lack crt/ and libcu++), then NCCL's from the
        // nvidia-nccl wheel beside torch.
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        let cuda = std::env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".into());
        build.include(Path::new(&cuda).join("include"));
        // CUDA 13 keeps libcu++ under include/cccl (nvcc adds it itself; a host compiler needs it
        // named). scripts/check-nccl-build.sh makes such a CUDA_HOME from PyPI's header wheels.
        let cccl = Path::new(&cuda).join("include/cccl");
        if cccl.is_dir() {
            build.include(cccl);
        }
        if let Some(site) = torch.parent() {
            for inc in nvidia_lib_dirs(&site.join("nvidia")) {
                build.include(inc.with_file_name("include"));
            }
        }
        build.define("USE_C10D_NCCL", None).define("LEGO_RL_NCCL", None);
    }
    build.compile("lego_rl_dist");
    // libtorch_cpu holds c10d (TCPStore, ProcessGroupGloo); torch-sys links it too, but the
    // order on the link line must put it after the shim.
    println!("cargo:rustc-link-search=native={}", torch.join("lib").display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
    }
}
