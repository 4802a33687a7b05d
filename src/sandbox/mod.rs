//! Sandboxes on a Docker-compatible engine: content-addressed task images ([`images`]), one isolated
//! container per trial with stage-wise timeouts ([`trial`]), the relay that is a trial's only way
//! out, to the proxy ([`relay`]), and the engine client they share ([`client`]).
//!
//! Trust boundary: the agent inside a trial is untrusted. Its container runs as a non-root user with
//! pids/memory/CPU limits, no Docker socket, on an internal network with no host address (its only
//! endpoint is the proxy, through [`relay`]), and sees
//! the repository squashed to one commit with the test-patch files hidden. Grading happens in a fresh
//! container from the pristine image, so nothing the agent did to its container except its diff
//! reaches the grader.

pub mod client;
pub mod freeze;
pub mod images;
pub mod relay;
pub mod runtime;
pub mod tar;
pub mod trial;

pub use client::{ContainerSpec, ContainerState, Engine, ExecOutput};
pub use images::{build_images, BuildSettings};
pub use runtime::{ensure_runtime, RuntimeVolume, RUNTIME_DIR};
pub use trial::{AgentOutcome, Defence, Trial, TrialLimits, TrialResult};

/// Label carrying the run id on every object lego-rl creates.
pub const LABEL_RUN: &str = "lego-rl.run-id";
/// Label carrying the trial id on every trial container and network.
pub const LABEL_TRIAL: &str = "lego-rl.trial";
/// The non-root user agents run as (created by the base image).
pub const AGENT_USER: &str = "agent";
/// Default base image tag (see `scripts/bootstrap-base-image.sh`).
pub const DEFAULT_BASE_IMAGE: &str = "lego-rl/base:trixie";

/// Errors of the sandbox layer, one variant per engine operation.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot connect to the container engine (set DOCKER_HOST?): {source}")]
    Connect {
        #[source]
        source: bollard::errors::Error,
    },
    #[error("inspecting image {image}: {source}")]
    InspectImage {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("image {image} not found (run build-images first)")]
    ImageMissing { image: String },
    #[error("building image {image}: {message}")]
    BuildImage { image: String, message: String },
    #[error("{}: agent runtime: {message}", harness.display())]
    Runtime {
        harness: std::path::PathBuf,
        message: String,
    },
    #[error("volume {name}: {source}")]
    Volume {
        name: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("creating network {name}: {source}")]
    CreateNetwork {
        name: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("removing network {name}: {source}")]
    RemoveNetwork {
        name: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("creating a container from {image}: {source}")]
    CreateContainer {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("starting container {container}: {source}")]
    StartContainer {
        container: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("inspecting container {container}: {source}")]
    InspectContainer {
        container: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("removing container {container}: {source}")]
    RemoveContainer {
        container: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("running `{command}` in {container}: {source}")]
    Exec {
        container: String,
        command: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("uploading to {path} in {container}: {source}")]
    Upload {
        container: String,
        path: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("listing engine objects: {source}")]
    List {
        #[source]
        source: bollard::errors::Error,
    },
    #[error("{stage} failed: {message}")]
    Stage { stage: &'static str, message: String },
    #[error("reading {path}: {source}")]
    ReadFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}
