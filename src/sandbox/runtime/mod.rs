//! Agent runtimes: each harness's runtime (a Python venv with its PyPI packages) is built **once**
//! into a Docker named volume and mounted **read-only** at [`RUNTIME_DIR`] into trial containers, so
//! task images never contain harnesses and one task image serves every harness.
//!
//! Why a volume: Docker 20.10 has no image mounts, and copying a venv into every trial costs seconds
//! and hundreds of MB per trial; a named volume is built once and bound `:ro` in milliseconds.
//!
//! Build recipe (on a cache miss), all through the engine API so remote engines and Podman work:
//! 1. A short-lived build container from the base image (network `none`) with the new, empty volume
//!    mounted read-write at [`RUNTIME_DIR`]. It reports the base image's Python version, glibc and
//!    architecture; the harness's `[runtime] python` minimum is checked against them.
//! 2. Wheels are downloaded **on the host** (`pip download --only-binary=:all:` for that Python, ABI
//!    and manylinux platform set), because trial and build containers may have no network. A
//!    dependency published only as an sdist is built into a wheel on the host (`pip wheel --no-deps`)
//!    and accepted only when the result is pure Python. Downloads are cached under
//!    `<cache_dir>/runtime-wheels/<key>` (key = requirements + Python + platform) and reused offline.
//! 3. The wheels are uploaded into the build container and installed offline (`--no-index
//!    --find-links`) into a venv at [`RUNTIME_DIR`] (`python3 -m venv --without-pip`, pip run from its
//!    own wheel, so the base image needs neither `python3-venv` nor pip). Bytecode is compiled at
//!    install time because the mount is read-only at run time. `[runtime] links` become symlinks in
//!    `{runtime}/bin` (Claude Code's `claude` binary bundled in the claude-agent-sdk wheel).
//! 4. A marker file `.lego-rl-runtime.json` (hash, base image id, `pip freeze`) is written **last**;
//!    a volume without a matching marker is incomplete and is rebuilt.
//!
//! Cache key: the volume is named `lego-rl-runtime-<harness>-<hash>`, hash = sha256 of (recipe
//! version, base image id, the `[runtime]` section). The venv's interpreter is the base image's
//! `/usr/bin/python3.X`, so trial containers must come from images built `FROM` that base (task
//! images are). An existing volume whose marker matches is a cache hit (checked with one
//! throw-away container, about a second). Builds of the same runtime are serialised across processes
//! on one host by a lock file in `<cache_dir>/runtimes/`.
//!
//! Volumes are caches: they carry `lego-rl.runtime*` labels but **not** `lego-rl.run-id` /
//! `lego-rl.trial`, so the per-run cleanup sweep never removes them. The build and check containers
//! do carry `lego-rl.run-id = runtime-<hash>` and are removed on every normal and error path.
//!
//! Pin versions in the harness files: the hash covers the requirement strings, not what they resolve
//! to, so an unpinned transitive dependency is whatever the first build downloaded.

mod build;
mod volume;
mod wheels;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bollard::models::VolumeCreateOptions;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::images::slug;
use super::{Engine, SandboxError};
use crate::harness::{Harness, Runtime};
use build::Build;
use volume::{lock, read_marker, remove_volume, volume_exists};

/// Where agent runtimes are mounted inside trial containers (`{runtime}` in harness files).
pub const RUNTIME_DIR: &str = "/opt/lego-agent";
/// Label on runtime volumes: the harness name.
pub const LABEL_RUNTIME: &str = "lego-rl.runtime";
/// Label on runtime volumes: the runtime's content hash.
pub const LABEL_RUNTIME_HASH: &str = "lego-rl.runtime-hash";
/// Label on runtime volumes: the id of the base image the venv was built on.
pub const LABEL_RUNTIME_BASE: &str = "lego-rl.runtime-base-image";
/// Version of the build recipe below; part of every hash, so changing the recipe rebuilds.
const RECIPE: &str = "lego-rl/runtime/v1";
/// Written last into a complete runtime volume.
const MARKER: &str = ".lego-rl-runtime.json";
/// Where wheels are uploaded inside the build container.
const WHEELS_IN_CONTAINER: &str = "/tmp/lego-wheels";
/// Upper bound of the offline install (byte-compiling litellm alone takes a while on 2 cores).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Upper bound of one host-side `pip download` / `pip wheel`.
const PIP_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A ready agent runtime volume.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeVolume {
    /// Docker volume name (`lego-rl-runtime-<harness>-<hash>`).
    pub name: String,
    /// The harness the runtime belongs to.
    pub harness: String,
    /// Content hash (recipe, base image id, `[runtime]` section).
    pub hash: String,
    /// True when an existing complete volume was reused.
    pub cache_hit: bool,
    /// Seconds `ensure_runtime` took.
    pub seconds: f64,
    /// `pip freeze --all` of the runtime venv (`name==version`).
    pub packages: Vec<String>,
}

impl RuntimeVolume {
    /// The read-only bind for a trial container: `<name>:/opt/lego-agent:ro`.
    pub fn bind(&self) -> String {
        format!("{}:{RUNTIME_DIR}:ro", self.name)
    }
}

/// The marker file's contents.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Marker {
    schema: String,
    harness: String,
    hash: String,
    base_image_id: String,
    python: String,
    packages: Vec<String>,
}

/// The cache directory: `$LEGO_RL_CACHE`, else `~/.cache/lego-rl`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(crate::env::CACHE).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("lego-rl")
}

/// Content hash of a runtime built on `base_image_id` (hex, 16 characters).
pub fn runtime_hash(runtime: &Runtime, base_image_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(RECIPE.as_bytes());
    h.update([0]);
    h.update(base_image_id.as_bytes());
    h.update([0]);
    h.update(runtime.python.as_deref().unwrap_or("").as_bytes());
    for p in &runtime.pip {
        h.update([0]);
        h.update(p.as_bytes());
    }
    for (name, target) in &runtime.links {
        h.update([1]);
        h.update(name.as_bytes());
        h.update([0]);
        h.update(target.as_bytes());
    }
    hex::encode(h.finalize())[..16].to_string()
}

/// The volume name of a harness's runtime.
pub fn volume_name(harness: &str, hash: &str) -> String {
    format!("lego-rl-runtime-{}-{hash}", slug(harness))
}

/// Makes sure the harness's runtime volume exists for `base_image` (building it on a miss) and
/// returns it. `cache_dir` holds downloaded wheels, build logs and locks (see
/// [`default_cache_dir`]). Errors that come from the harness file name the file.
pub async fn ensure_runtime(
    engine: &Engine,
    harness: &Harness,
    base_image: &str,
    cache_dir: &Path,
) -> Result<RuntimeVolume, SandboxError> {
    let started = Instant::now();
    let rt = &harness.config.runtime;
    let fail = |message: String| SandboxError::Runtime {
        harness: harness.path.clone(),
        message,
    };
    check_spec(rt).map_err(fail)?;
    let base_id = engine
        .image_id(base_image)
        .await?
        .ok_or_else(|| SandboxError::ImageMissing {
            image: base_image.to_string(),
        })?;
    let hash = runtime_hash(rt, &base_id);
    let name = volume_name(&harness.config.name, &hash);
    // The engine's own connection (`sandbox::client` is the one place that connects to Docker).
    let docker = &engine.docker;
    let dir = cache_dir.join("runtimes");
    std::fs::create_dir_all(&dir).map_err(|source| SandboxError::ReadFile {
        path: dir.clone(),
        source,
    })?;
    let _lock = lock(&dir.join(format!("{name}.lock"))).await?;
    let volume = |cache_hit: bool, m: Marker| RuntimeVolume {
        name: name.clone(),
        harness: harness.config.name.clone(),
        hash: hash.clone(),
        cache_hit,
        seconds: started.elapsed().as_secs_f64(),
        packages: m.packages,
    };

    if volume_exists(docker, &name).await? {
        match read_marker(engine, &name, base_image, &hash).await? {
            Some(m) if m.hash == hash => return Ok(volume(true, m)),
            _ => {
                tracing::warn!("runtime volume {name} is incomplete; rebuilding it");
                // We hold the build lock, so a build container of this runtime that still
                // exists belongs to a builder that was killed; it pins the volume (409 on
                // removal) until it is gone.
                engine.sweep(Some(&format!("runtime-{hash}"))).await?;
                remove_volume(docker, &name).await?;
            }
        }
    }
    let log_path = dir.join(format!("{name}.log"));
    let mut log = std::fs::File::create(&log_path).map_err(|source| SandboxError::ReadFile {
        path: log_path.clone(),
        source,
    })?;
    tracing::info!(
        "building agent runtime {name} for {} (log: {})",
        harness.path.display(),
        log_path.display()
    );
    let labels = HashMap::from([
        (LABEL_RUNTIME.to_string(), harness.config.name.clone()),
        (LABEL_RUNTIME_HASH.to_string(), hash.clone()),
        (LABEL_RUNTIME_BASE.to_string(), base_id.clone()),
    ]);
    docker
        .create_volume(VolumeCreateOptions {
            name: Some(name.clone()),
            labels: Some(labels),
            ..Default::default()
        })
        .await
        .map_err(|source| SandboxError::Volume {
            name: name.clone(),
            source,
        })?;
    let build = Build {
        engine,
        harness,
        base_image,
        base_id: &base_id,
        hash: &hash,
        volume: &name,
        cache_dir,
    };
    match build.run(&mut log).await {
        Ok(m) => Ok(volume(false, m)),
        Err(e) => {
            use std::io::Write as _;
            let _ = writeln!(log, "ERROR: {e}");
            // Never leave a half-built volume behind: the next call would find it.
            let _ = remove_volume(docker, &name).await;
            Err(e)
        }
    }
}

/// [`ensure_runtime`] for several harnesses, one after another (each build is CPU- and
/// disk-heavy); one failure does not stop the others. Results are in input order.
pub async fn ensure_runtimes(
    engine: &Engine,
    harnesses: &[Harness],
    base_image: &str,
    cache_dir: &Path,
    on_done: &(dyn Fn(&Harness, &Result<RuntimeVolume, SandboxError>) + Sync),
) -> Vec<Result<RuntimeVolume, SandboxError>> {
    let mut out = Vec::with_capacity(harnesses.len());
    for h in harnesses {
        let r = ensure_runtime(engine, h, base_image, cache_dir).await;
        on_done(h, &r);
        out.push(r);
    }
    out
}

/// Checks the `[runtime]` section before any work: installable, non-empty, sane link names.
fn check_spec(rt: &Runtime) -> Result<(), String> {
    if let Some(why) = &rt.unavailable {
        return Err(format!("runtime unavailable: {why}"));
    }
    if rt.pip.is_empty() {
        return Err("`[runtime] pip` lists no packages".into());
    }
    if let Some(p) = &rt.python {
        parse_version(p).ok_or_else(|| format!("`[runtime] python = \"{p}\"` is not MAJOR.MINOR"))?;
    }
    for (name, target) in &rt.links {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(format!("`[runtime] links`: bad executable name `{name}`"));
        }
        if target.is_empty() || target.starts_with('/') || target.split('/').any(|c| c == "..") {
            return Err(format!(
                "`[runtime] links.{name}`: `{target}` must be a path relative to site-packages"
            ));
        }
    }
    Ok(())
}

fn parse_version(s: &str) -> Option<(u32, u32)> {
    let mut it = s.trim().split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `[runtime]` section with these pip requirements (shared with the submodules' tests).
    pub(super) fn rt(pip: &[&str]) -> Runtime {
        Runtime {
            python: None,
            pip: pip.iter().map(|s| s.to_string()).collect(),
            links: Default::default(),
            unavailable: None,
        }
    }

    #[test]
    fn hash_covers_base_and_spec() {
        let a = runtime_hash(&rt(&["x==1"]), "sha256:1");
        assert_eq!(a.len(), 16);
        assert_eq!(a, runtime_hash(&rt(&["x==1"]), "sha256:1"));
        assert_ne!(a, runtime_hash(&rt(&["x==1"]), "sha256:2"));
        assert_ne!(a, runtime_hash(&rt(&["x==2"]), "sha256:1"));
        let mut l = rt(&["x==1"]);
        l.links.insert("x".into(), "x/bin".into());
        assert_ne!(a, runtime_hash(&l, "sha256:1"));
        assert_eq!(
            volume_name("Mini SWE", &a),
            format!("lego-rl-runtime-mini-swe-{a}")
        );
    }

    #[test]
    fn bind_is_read_only() {
        let v = RuntimeVolume {
            name: "lego-rl-runtime-x-0123".into(),
            harness: "x".into(),
            hash: "0123".into(),
            cache_hit: true,
            seconds: 0.0,
            packages: vec![],
        };
        assert_eq!(v.bind(), "lego-rl-runtime-x-0123:/opt/lego-agent:ro");
    }

    #[test]
    fn spec_errors_are_specific() {
        let mut u = rt(&[]);
        u.unavailable = Some("npm only".into());
        assert!(check_spec(&u).unwrap_err().contains("npm only"));
        assert!(check_spec(&rt(&[])).unwrap_err().contains("no packages"));
        let mut l = rt(&["x"]);
        l.links.insert("claude".into(), "../etc/passwd".into());
        assert!(check_spec(&l).unwrap_err().contains("relative to site-packages"));
        let mut p = rt(&["x"]);
        p.python = Some("three".into());
        assert!(check_spec(&p).is_err());
    }
}
