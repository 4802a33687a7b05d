//! Bakes a run-time library path (RUNPATH) for libtorch into the binaries, so that
//! `target/release/lego-rl` runs without LD_LIBRARY_PATH. libtorch comes from the PyPI torch wheel
//! (scripts/setup.sh): its `torch/lib` plus the `nvidia/*/lib` folders of the CUDA wheels beside it.
//! RUNPATH (not RPATH) is used on purpose: LD_LIBRARY_PATH still takes precedence, so the same
//! binary can be pointed at another torch 2.11 install on a GPU box.
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        return;
    };
    let torch = std::fs::canonicalize(&libtorch).unwrap_or_else(|_| PathBuf::from(&libtorch));
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
