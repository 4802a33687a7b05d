//! Engine-side plumbing of runtime volumes: the per-runtime build lock, volume lookup and
//! removal, the short-lived helper containers, and reading a volume's marker.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use bollard::query_parameters::RemoveVolumeOptions;
use bollard::Docker;

use super::{Marker, MARKER, RUNTIME_DIR};
use crate::sandbox::{ContainerSpec, Engine, SandboxError, LABEL_RUN};

/// Takes an exclusive lock on `path` (blocking in a worker thread); released when dropped.
pub(super) async fn lock(path: &Path) -> Result<std::fs::File, SandboxError> {
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

pub(super) async fn volume_exists(docker: &Docker, name: &str) -> Result<bool, SandboxError> {
    match docker.inspect_volume(name).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(false),
        Err(source) => Err(SandboxError::Volume {
            name: name.to_string(),
            source,
        }),
    }
}

pub(super) async fn remove_volume(docker: &Docker, name: &str) -> Result<(), SandboxError> {
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
pub(super) async fn helper(
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
pub(super) async fn read_marker(
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
