//! Bakes a run-time library path (RUNPATH) for libtorch into the binaries, so that
//! `target/release/lego-rl` runs without LD_LIBRARY_PATH. libtorch comes from the PyPI torch wheel
//! (scripts/setup.sh): its `torch/lib` plus the `nvidia/*/lib` folders of the CUDA wheels beside it.
//! RUNPATH (not RPATH) is used on purpose: LD_LIBRARY_PATH still takes precedence, so the same
//! binary can be pointed at another torch 2.11 install on a GPU box.
//!
//! One binary for CPU and GPU: when the torch wheel has CUDA (`libtorch_cuda.so`, as PyPI's Linux
//! wheel does), libtorch_cuda is linked with `--no-as-needed` (torch-sys names it, but nothing in
//! the crate calls into it, so the default `--as-needed` drops it and CUDA is never registered);
//! when CUDA headers are also found (scripts/cuda-headers.sh, linked at `.cuda-headers` by setup)
//! the shim's NCCL path is compiled too. The binary still runs on a machine without a GPU. A CPU-only
//! wheel, or `LEGO_RL_NO_CUDA=1`, gives the CPU-only link. `lego-rl env` reports what was built.
//!
//! It also compiles the c10d shim (`src/c10d/shim.cpp`, see `src/c10d/mod.rs`) against the same
//! libtorch headers with torch-sys's flags (C++17, the CXX11 ABI flag, GLOG_USE_GLOG_EXPORT).
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LEGO_RL_NO_CUDA");
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        panic!(
            "LIBTORCH is not set: run scripts/setup.sh (it links .libtorch, which \
             .cargo/config.toml names), or export LIBTORCH=/path/to/site-packages/torch"
        );
    };
    let torch = std::fs::canonicalize(&libtorch).unwrap_or_else(|_| PathBuf::from(&libtorch));
    let no_cuda = std::env::var("LEGO_RL_NO_CUDA").is_ok_and(|v| v == "1");
    let torch_cuda = !no_cuda && torch.join("lib/libtorch_cuda.so").is_file();
    let nccl_includes = if torch_cuda { cuda_includes(&torch) } else { None };
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() && nccl_includes.is_none() {
        panic!(
            "the `nccl` feature needs a CUDA torch wheel and CUDA headers: run scripts/setup.sh \
             (it fetches them into .cuda-headers) or set CUDA_HOME to a CUDA 13 toolkit"
        );
    }
    println!("cargo:rustc-env=LEGO_RL_BUILT_CUDA={}", u8::from(torch_cuda));
    println!(
        "cargo:rustc-env=LEGO_RL_BUILT_NCCL={}",
        u8::from(nccl_includes.is_some())
    );
    compile_shim(&torch, nccl_includes.as_deref());
    if torch_cuda {
        println!("cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed,-ltorch_cuda,--pop-state");
    }
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

/// Compiles `src/c10d/shim.cpp` into a static library linked into the crate. The wheel ships
/// libtorch's c10d headers but not Gloo's, which ProcessGroupGloo.hpp includes: the five names it
/// includes are pointed at `src/c10d/gloo_decls.h` (why that is sound is explained there).
fn compile_shim(torch: &Path, nccl: Option<&[PathBuf]>) {
    for f in ["src/c10d/shim.cpp", "src/c10d/gloo_decls.h"] {
        println!("cargo:rerun-if-changed={f}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let decls = std::fs::canonicalize("src/c10d/gloo_decls.h").expect("src/c10d/gloo_decls.h exists");
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
        .file("src/c10d/shim.cpp");
    if let Some(includes) = nccl {
        build.includes(includes);
        build.define("USE_C10D_NCCL", None).define("LEGO_RL_NCCL", None);
    }
    build.compile("lego_rl_dist");
    // libtorch_cpu holds c10d (TCPStore, ProcessGroupGloo); torch-sys links it too, but the
    // order on the link line must put it after the shim.
    println!("cargo:rustc-link-search=native={}", torch.join("lib").display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}

/// The include folders the shim's NCCL path needs, when all are there: a CUDA toolkit's headers
/// (`CUDA_HOME`; else the PyPI headers setup.sh links at `.cuda-headers`; else /usr/local/cuda; the
/// runtime wheels alone lack crt/ and libcu++), CUDA 13's libcu++ under include/cccl (nvcc adds it
/// itself; a host compiler needs it named), and NCCL's from the nvidia-nccl wheel beside torch.
fn cuda_includes(torch: &Path) -> Option<Vec<PathBuf>> {
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=LEGO_RL_CUDA_HEADERS");
    let home = std::env::var_os("CUDA_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("LEGO_RL_CUDA_HEADERS")
                .map(PathBuf::from)
                .filter(|p| p.is_dir())
        })
        .unwrap_or_else(|| PathBuf::from("/usr/local/cuda"));
    let complete = home.join(".complete");
    if complete.is_file() {
        println!("cargo:rerun-if-changed={}", complete.display());
    }
    let include = home.join("include");
    if !include.join("cuda_runtime_api.h").is_file() || !include.join("crt").is_dir() {
        println!(
            "cargo:warning=no CUDA headers in {} (run scripts/setup.sh): the shim is built without NCCL",
            include.display()
        );
        return None;
    }
    let mut dirs = vec![include.clone()];
    if include.join("cccl").is_dir() {
        dirs.push(include.join("cccl"));
    }
    if let Some(site) = torch.parent() {
        for lib in nvidia_lib_dirs(&site.join("nvidia")) {
            let inc = lib.with_file_name("include");
            if inc.is_dir() {
                dirs.push(inc);
            }
        }
    }
    dirs.iter().any(|d| d.join("nccl.h").is_file()).then_some(dirs)
}
