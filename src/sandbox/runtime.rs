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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bollard::models::VolumeCreateOptions;
use bollard::query_parameters::RemoveVolumeOptions;
use bollard::Docker;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::images::slug;
use super::tar::TarBuilder;
use super::{ContainerSpec, Engine, SandboxError, LABEL_RUN};
use crate::harness::{Harness, Runtime};
use crate::text::{sh_quote, tail_lines};

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
    let docker = Docker::connect_with_defaults().map_err(|source| SandboxError::Connect { source })?;
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

    if volume_exists(&docker, &name).await? {
        match read_marker(engine, &name, base_image, &hash).await? {
            Some(m) if m.hash == hash => return Ok(volume(true, m)),
            _ => {
                tracing::warn!("runtime volume {name} is incomplete; rebuilding it");
                // We hold the build lock, so a build container of this runtime that still
                // exists belongs to a builder that was killed; it pins the volume (409 on
                // removal) until it is gone.
                engine.sweep(Some(&format!("runtime-{hash}"))).await?;
                remove_volume(&docker, &name).await?;
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
            let _ = remove_volume(&docker, &name).await;
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

/// Takes an exclusive lock on `path` (blocking in a worker thread); released when dropped.
async fn lock(path: &Path) -> Result<std::fs::File, SandboxError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| SandboxError::ReadFile {
                path: path.clone(),
                source,
            })?;
        crate::io::lock_exclusive(&f, true).map_err(|source| SandboxError::ReadFile { path, source })?;
        Ok(f)
    })
    .await
    .map_err(|e| SandboxError::Stage {
        stage: "runtime",
        message: format!("lock task: {e}"),
    })?
}

async fn volume_exists(docker: &Docker, name: &str) -> Result<bool, SandboxError> {
    match docker.inspect_volume(name).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(false),
        Err(source) => Err(SandboxError::Volume {
            name: name.to_string(),
            source,
        }),
    }
}

async fn remove_volume(docker: &Docker, name: &str) -> Result<(), SandboxError> {
    match docker
        .remove_volume(name, Some(RemoveVolumeOptions { force: true }))
        .await
    {
        Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
        Err(source) => Err(SandboxError::Volume {
            name: name.to_string(),
            source,
        }),
    }
}

/// A started helper container (network `none`, labelled for the sweep) with `binds`.
async fn helper(
    engine: &Engine,
    image: &str,
    hash: &str,
    what: &str,
    binds: Vec<String>,
) -> Result<String, SandboxError> {
    let spec = ContainerSpec {
        name: format!("lego-rl-runtime-{what}-{hash}-{}", uuid::Uuid::new_v4().simple()),
        image: image.to_string(),
        labels: HashMap::from([(LABEL_RUN.to_string(), format!("runtime-{hash}"))]),
        network: "none".into(),
        binds,
        ..Default::default()
    };
    let id = engine.create_container(&spec).await?;
    if let Err(e) = engine.start_container(&id).await {
        let _ = engine.remove_container(&id).await;
        return Err(e);
    }
    Ok(id)
}

/// Reads the marker of an existing volume (mounted read-only); `None` when absent or unreadable.
async fn read_marker(
    engine: &Engine,
    volume: &str,
    base_image: &str,
    hash: &str,
) -> Result<Option<Marker>, SandboxError> {
    let id = helper(
        engine,
        base_image,
        hash,
        "check",
        vec![format!("{volume}:{RUNTIME_DIR}:ro")],
    )
    .await?;
    let out = engine
        .exec(
            &id,
            "root",
            "/",
            &[],
            &format!("cat {RUNTIME_DIR}/{MARKER}"),
            Duration::from_secs(60),
        )
        .await;
    engine.remove_container(&id).await?;
    let out = out?;
    Ok(out.ok().then(|| serde_json::from_str(&out.stdout).ok()).flatten())
}

/// What the base image's interpreter is.
#[derive(Debug, Clone, PartialEq)]
struct Interpreter {
    /// `3.13`
    version: String,
    /// glibc `2.41`
    glibc: String,
    /// `x86_64`
    machine: String,
}

/// One cache-miss build.
struct Build<'a> {
    engine: &'a Engine,
    harness: &'a Harness,
    base_image: &'a str,
    base_id: &'a str,
    hash: &'a str,
    volume: &'a str,
    cache_dir: &'a Path,
}

impl Build<'_> {
    fn fail(&self, message: String) -> SandboxError {
        SandboxError::Runtime {
            harness: self.harness.path.clone(),
            message,
        }
    }

    async fn run(&self, log: &mut std::fs::File) -> Result<Marker, SandboxError> {
        let id = helper(
            self.engine,
            self.base_image,
            self.hash,
            "build",
            vec![format!("{}:{RUNTIME_DIR}", self.volume)],
        )
        .await?;
        let r = self.in_container(&id, log).await;
        let removed = self.engine.remove_container(&id).await;
        let m = r?;
        removed?;
        Ok(m)
    }

    async fn exec(
        &self,
        id: &str,
        script: &str,
        timeout: Duration,
        log: &mut std::fs::File,
    ) -> Result<String, SandboxError> {
        use std::io::Write as _;
        let out = self.engine.exec(id, "root", "/", &[], script, timeout).await?;
        let _ = writeln!(log, "$ {script}\n{}{}", out.stdout, out.stderr);
        if !out.ok() {
            let tail: String = {
                let s = format!("{}{}", out.stdout, out.stderr);
                let lines: Vec<&str> = s.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            };
            let what = if out.timed_out {
                format!("timed out after {:.0}s", out.seconds)
            } else {
                format!("exit {:?}", out.exit_code)
            };
            return Err(self.fail(format!(
                "`{}` in the build container: {what}\n{tail}",
                first_line(script)
            )));
        }
        Ok(out.stdout)
    }

    async fn in_container(&self, id: &str, log: &mut std::fs::File) -> Result<Marker, SandboxError> {
        let rt = &self.harness.config.runtime;
        let probe = self
            .exec(
                id,
                "command -v python3 >/dev/null || { echo 'the base image has no python3' >&2; exit 3; }\n\
                 python3 -c 'import sys, platform; print(\"%d.%d\" % sys.version_info[:2]); \
                 print(platform.libc_ver()[0], platform.libc_ver()[1]); print(platform.machine())'",
                Duration::from_secs(120),
                log,
            )
            .await?;
        let interp = parse_probe(&probe).ok_or_else(|| {
            self.fail(format!(
                "base image {}: cannot read its Python version/glibc from {probe:?} (agent runtimes need a \
                 glibc-based image with python3)",
                self.base_image
            ))
        })?;
        if let Some(min) = &rt.python {
            let need = parse_version(min).expect("invariant: checked by check_spec");
            let have = parse_version(&interp.version).expect("invariant: parsed by parse_probe");
            if have < need {
                return Err(self.fail(format!(
                    "runtime needs Python >= {min}, base image {} has {}",
                    self.base_image, interp.version
                )));
            }
        }
        let wheels = download_wheels(rt, &interp, self.cache_dir, log)
            .await
            .map_err(|m| self.fail(m))?;
        let mut tar = TarBuilder::new();
        let prefix = WHEELS_IN_CONTAINER.trim_start_matches("/tmp/");
        tar.dir(prefix);
        tar.dir_tree(&wheels, prefix)
            .map_err(|source| SandboxError::ReadFile {
                path: wheels.clone(),
                source,
            })?;
        self.engine.upload(id, "/tmp", tar.finish()).await?;
        self.exec(id, &install_script(rt), INSTALL_TIMEOUT, log).await?;
        let freeze = self
            .exec(
                id,
                &format!("{RUNTIME_DIR}/bin/python -m pip freeze --all --disable-pip-version-check"),
                Duration::from_secs(120),
                log,
            )
            .await?;
        let marker = Marker {
            schema: RECIPE.to_string(),
            harness: self.harness.config.name.clone(),
            hash: self.hash.to_string(),
            base_image_id: self.base_id.to_string(),
            python: interp.version.clone(),
            packages: freeze
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
        };
        let json = serde_json::to_vec_pretty(&marker).map_err(|e| self.fail(format!("marker: {e}")))?;
        let mut tar = TarBuilder::new();
        tar.file(MARKER, &json, 0o644);
        self.engine.upload(id, RUNTIME_DIR, tar.finish()).await?;
        // The marker goes last; make sure it and everything before it reached the volume.
        self.exec(id, "sync", Duration::from_secs(120), log).await?;
        Ok(marker)
    }
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s).trim()
}

fn parse_probe(s: &str) -> Option<Interpreter> {
    let mut lines = s.lines();
    let version = lines.next()?.trim().to_string();
    parse_version(&version)?;
    let mut libc = lines.next()?.split_whitespace();
    if libc.next()? != "glibc" {
        return None;
    }
    let glibc = libc.next()?.to_string();
    parse_version(&glibc)?;
    let machine = lines.next()?.trim().to_string();
    (!machine.is_empty()).then_some(Interpreter {
        version,
        glibc,
        machine,
    })
}

/// The offline install, run as root in the build container.
fn install_script(rt: &Runtime) -> String {
    let reqs: Vec<String> = rt.pip.iter().map(|r| sh_quote(r)).collect();
    let mut s = format!(
        "set -eu\nW={WHEELS_IN_CONTAINER}\nR={RUNTIME_DIR}\n\
         python3 -m venv --without-pip \"$R\"\n\
         pipwhl=$(ls \"$W\"/pip-*.whl | head -n 1)\n\
         \"$R/bin/python\" \"$pipwhl/pip\" install --no-index --find-links \"$W\" --no-cache-dir \
         --disable-pip-version-check --root-user-action=ignore --no-warn-script-location pip {}\n\
         sp=$(\"$R/bin/python\" -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')\n",
        reqs.join(" ")
    );
    for (name, target) in &rt.links {
        let t = sh_quote(target);
        let n = sh_quote(name);
        s.push_str(&format!(
            "[ -f \"$sp\"/{t} ] || {{ echo \"link target $sp/\"{t}\" is not in the installed packages\" >&2; exit 3; }}\n\
             chmod a+rx \"$sp\"/{t}\nln -sfn \"$sp\"/{t} \"$R/bin/\"{n}\n"
        ));
    }
    s.push_str("rm -rf \"$W\"\nchmod -R a+rX \"$R\"\n");
    s
}

/// The `--platform` tags a glibc `major.minor` on `machine` accepts (manylinux_2_5 … that glibc,
/// plus the legacy aliases).
fn platforms(interp: &Interpreter) -> Vec<String> {
    let (_, minor) = parse_version(&interp.glibc).unwrap_or((2, 17));
    let m = &interp.machine;
    let mut out: Vec<String> = (5..=minor)
        .rev()
        .map(|i| format!("manylinux_2_{i}_{m}"))
        .collect();
    out.push(format!("manylinux2014_{m}"));
    if m == "x86_64" || m == "i686" {
        out.push(format!("manylinux2010_{m}"));
        out.push(format!("manylinux1_{m}"));
    }
    out
}

/// The host interpreter whose pip downloads wheels: `$LEGO_RL_VENV/bin/python`, else the project
/// venv `<cache_dir>/venv`, else `python3`.
fn host_python(cache_dir: &Path) -> PathBuf {
    if let Some(v) = std::env::var_os(crate::env::VENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(v).join("bin/python");
    }
    let venv = cache_dir.join("venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Runs `python -m pip args…` on the host, logging its output; Err(stderr tail) on failure.
async fn pip(python: &Path, args: &[String], log: &mut std::fs::File) -> Result<(), String> {
    use std::io::Write as _;
    let _ = writeln!(log, "$ {} -m pip {}", python.display(), args.join(" "));
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg("-m")
        .arg("pip")
        .args(args)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .kill_on_drop(true);
    let out = tokio::time::timeout(PIP_TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("`pip {}` timed out", args[0]))?
        .map_err(|e| format!("running {} -m pip: {e}", python.display()))?;
    let _ = log.write_all(&out.stdout);
    let _ = log.write_all(&out.stderr);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The requirement pip could not satisfy with a wheel, from its error output.
fn missing_requirement(stderr: &str) -> Option<String> {
    let line = stderr
        .lines()
        .find(|l| l.contains("No matching distribution found for "))?;
    let rest = line.split("No matching distribution found for ").nth(1)?;
    // "func-timeout>=4.3.5 (from openhands-tools)" → "func-timeout>=4.3.5"
    let req = rest.split(" (from").next()?.trim();
    (!req.is_empty()).then(|| req.to_string())
}

/// Downloads (or finds cached) every wheel the runtime needs for `interp`; returns the directory.
async fn download_wheels(
    rt: &Runtime,
    interp: &Interpreter,
    cache_dir: &Path,
    log: &mut std::fs::File,
) -> Result<PathBuf, String> {
    let plats = platforms(interp);
    let mut h = Sha256::new();
    h.update(RECIPE.as_bytes());
    for part in [&interp.version, &interp.glibc, &interp.machine] {
        h.update([0]);
        h.update(part.as_bytes());
    }
    for r in &rt.pip {
        h.update([1]);
        h.update(r.as_bytes());
    }
    let key = hex::encode(h.finalize())[..16].to_string();
    let root = cache_dir.join("runtime-wheels");
    let done = root.join(&key);
    if done.join(".complete").exists() {
        tracing::info!("wheels cached in {}", done.display());
        return Ok(done);
    }
    let tmp = root.join(format!("{key}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let python = host_python(cache_dir);
    let dest = tmp.display().to_string();
    let mut args: Vec<String> = [
        "download",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        &interp.version,
        "--no-input",
        "--find-links",
        &dest,
        "-d",
        &dest,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for p in &plats {
        args.push("--platform".into());
        args.push(p.clone());
    }
    args.push("pip".into());
    args.extend(rt.pip.iter().cloned());
    tracing::info!(
        "downloading wheels for Python {} into {}",
        interp.version,
        done.display()
    );
    let mut built: Vec<String> = Vec::new();
    loop {
        let Err(stderr) = pip(&python, &args, log).await else {
            break;
        };
        // A dependency published only as an sdist: build it here; accept pure-Python wheels only.
        let Some(req) = missing_requirement(&stderr).filter(|r| !built.contains(r) && built.len() < 16)
        else {
            return Err(format!(
                "pip download for Python {} ({}) failed:\n{}",
                interp.version,
                plats[0],
                tail_lines(&stderr, 15)
            ));
        };
        tracing::info!("{req}: no wheel on the index; building one from its sdist");
        let before: Vec<_> = wheel_names(&tmp);
        let wargs: Vec<String> = ["wheel", "--no-deps", "--no-input", "-w", &dest, &req]
            .iter()
            .map(|s| s.to_string())
            .collect();
        pip(&python, &wargs, log).await.map_err(|e| {
            format!(
                "building a wheel of `{req}` from its sdist failed:\n{}",
                tail_lines(&e, 15)
            )
        })?;
        for w in wheel_names(&tmp).into_iter().filter(|w| !before.contains(w)) {
            if !w.ends_with("-none-any.whl") {
                return Err(format!(
                    "`{req}` has no wheel for Python {} on {} and its sdist builds a platform wheel ({w}); \
                     it cannot be installed offline",
                    interp.version, plats[0]
                ));
            }
        }
        built.push(req);
    }
    std::fs::write(tmp.join(".complete"), format!("{}\n", rt.pip.join("\n")))
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    match std::fs::rename(&tmp, &done) {
        Ok(()) => Ok(done),
        // Another process finished the same download first: use its copy.
        Err(_) if done.join(".complete").exists() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(done)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&done);
            std::fs::rename(&tmp, &done)
                .map_err(|e2| format!("moving wheels to {}: {e}; {e2}", done.display()))?;
            Ok(done)
        }
    }
}

fn wheel_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".whl"))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(pip: &[&str]) -> Runtime {
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

    #[test]
    fn probe_and_platforms() {
        let i = parse_probe("3.13\nglibc 2.41\nx86_64\n").expect("probe");
        assert_eq!(i.version, "3.13");
        let p = platforms(&i);
        assert_eq!(p[0], "manylinux_2_41_x86_64");
        assert!(p.contains(&"manylinux_2_17_x86_64".to_string()));
        assert!(p.contains(&"manylinux2014_x86_64".to_string()));
        assert!(
            parse_probe("3.12\n \naarch64\n").is_none(),
            "musl/unknown libc is refused"
        );
    }

    #[test]
    fn missing_requirement_is_parsed() {
        let e = "ERROR: Could not find a version that satisfies the requirement func-timeout>=4.3.5 (from \
                 openhands-tools) (from versions: none)\nERROR: No matching distribution found for \
                 func-timeout>=4.3.5 (from openhands-tools)\n";
        assert_eq!(missing_requirement(e).as_deref(), Some("func-timeout>=4.3.5"));
        assert_eq!(missing_requirement("ERROR: other"), None);
    }

    #[test]
    fn install_script_quotes_and_links() {
        let mut r = rt(&["claude-agent-sdk==0.2.189", "a'b"]);
        r.links
            .insert("claude".into(), "claude_agent_sdk/_bundled/claude".into());
        let s = install_script(&r);
        assert!(s.contains("'claude-agent-sdk==0.2.189' 'a'\\''b'"), "{s}");
        assert!(
            s.contains("ln -sfn \"$sp\"/'claude_agent_sdk/_bundled/claude' \"$R/bin/\"'claude'"),
            "{s}"
        );
    }
}
