//! build-images: one content-addressed image per task environment, layered like SWE-bench's
//! (base → environment shared by tasks with the same setup → task).
//!
//! Tags are content hashes: an environment layer hashes (base image id, setup commands); a task layer
//! hashes (environment image id, generated Dockerfile, repository bundle bytes) or, for a task with its
//! own Dockerfile (Harbor), (Dockerfile, every file of the build context, the id of a local `FROM`
//! image). An existing tag is a cache hit. Builds run `jobs` at a time; one failure does not stop the
//! others and lands in the task's [`ImageRecord`] as `error`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::tar::TarBuilder;
use super::{Engine, SandboxError, LABEL_RUN};
use crate::records::{ImageRecord, RepoSource, Task};

/// Where the repository lives inside SWE-style task images.
pub const DEFAULT_WORKDIR: &str = "/testbed";

/// `dir` as a trial's working directory: absolute, without a trailing `/`, and not `/` itself (a
/// trial hands its working tree to the agent user and takes its diff with git, which must never
/// span the whole filesystem).
pub fn usable_workdir(dir: &str) -> Option<String> {
    let dir = dir.trim_end_matches('/');
    dir.starts_with('/').then(|| dir.to_string())
}

/// Where a trial of `task` on `image` works: the task's `environment.workdir`, else the working
/// directory the image sets (its `WORKDIR`, an inherited one included: how Harbor runs a prebuilt
/// `docker_image`, or a Dockerfile whose final stage names none), else [`DEFAULT_WORKDIR`]. The
/// second value is false only for that last fallback, which the caller should warn about.
pub async fn trial_workdir(
    engine: &Engine,
    task: &Task,
    image: &str,
) -> Result<(String, bool), SandboxError> {
    if let Some(dir) = &task.environment.workdir {
        return Ok((dir.clone(), true));
    }
    Ok(match engine.image_workdir(image).await? {
        Some(dir) => (dir, true),
        None => (DEFAULT_WORKDIR.to_string(), false),
    })
}

/// Resolved settings of one build-images run.
#[derive(Debug, Clone)]
pub struct BuildSettings {
    /// Base image for tasks without their own Dockerfile.
    pub base_image: String,
    pub jobs: usize,
    /// Directory for per-image build logs.
    pub log_dir: PathBuf,
    /// Directory that relative paths in task records are resolved against (the task file's).
    pub task_root: PathBuf,
}

/// A Docker-safe repository name fragment.
pub fn slug(s: &str) -> String {
    let mut out: String = s
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    out.truncate(100);
    out.trim_matches(|c| c == '-' || c == '.').to_string()
}

fn short_hash(h: Sha256) -> String {
    hex::encode(h.finalize())[..16].to_string()
}

fn resolve(root: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    }
}

/// The environment layer of a SWE-style task: (tag, Dockerfile).
pub fn environment_layer(task: &Task, base_id: &str) -> (String, String) {
    let mut dockerfile = "FROM {BASE}\n".to_string();
    for cmd in &task.environment.setup {
        dockerfile.push_str(&format!("RUN {cmd}\n"));
    }
    let mut h = Sha256::new();
    h.update(base_id.as_bytes());
    h.update(dockerfile.as_bytes());
    let repo = task.repo.as_deref().map(slug).unwrap_or_else(|| "generic".into());
    (format!("lego-rl/env-{repo}:{}", short_hash(h)), dockerfile)
}

/// The task layer's Dockerfile on top of an environment image: the repository with its full history,
/// checked out at the base commit (the pristine image graders start from).
pub fn task_dockerfile(env_tag: &str, task: &Task) -> String {
    let workdir = task.environment.workdir.as_deref().unwrap_or(DEFAULT_WORKDIR);
    let base = task.base_commit.as_deref().unwrap_or("HEAD");
    format!(
        "FROM {env_tag}\nCOPY repo.bundle /tmp/repo.bundle\n\
         RUN git clone -q /tmp/repo.bundle {workdir} && cd {workdir} && git checkout -q -f {base} \
         && git reset -q --hard && rm /tmp/repo.bundle\nWORKDIR {workdir}\n"
    )
}

/// What build-images does for one task.
enum Plan {
    Prebuilt(String),
    Swe {
        env_tag: String,
        env_dockerfile: String,
        bundle: PathBuf,
    },
    Dockerfile {
        tag: String,
        context: Vec<u8>,
    },
}

fn from_image(dockerfile: &str) -> Option<String> {
    dockerfile
        .lines()
        .map(str::trim)
        .find(|l| l.to_ascii_uppercase().starts_with("FROM "))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(str::to_string)
}

async fn plan(
    engine: &Engine,
    task: &Task,
    s: &BuildSettings,
    base_id: &Option<String>,
) -> Result<Plan, SandboxError> {
    let env = &task.environment;
    if let Some(image) = &env.image {
        return Ok(Plan::Prebuilt(image.clone()));
    }
    if let Some(dockerfile) = &env.dockerfile {
        let mut tar = TarBuilder::new();
        if let Some(ctx) = &env.context {
            let dir = resolve(&s.task_root, ctx);
            tar.dir_tree(&dir, "").map_err(|source| SandboxError::ReadFile {
                path: dir.clone(),
                source,
            })?;
        }
        tar.file("Dockerfile", dockerfile.as_bytes(), 0o644);
        let context = tar.finish();
        let mut h = Sha256::new();
        h.update(&context);
        if let Some(from) = from_image(dockerfile) {
            if let Some(id) = engine.image_id(&from).await? {
                h.update(id.as_bytes());
            }
        }
        return Ok(Plan::Dockerfile {
            tag: format!("lego-rl/task-{}:{}", slug(&task.id), short_hash(h)),
            context,
        });
    }
    let Some(RepoSource::Bundle { path }) = &env.repo_source else {
        return Err(SandboxError::Stage {
            stage: "plan",
            message: format!(
                "task {}: needs environment.image, .dockerfile or a bundle repo_source",
                task.id
            ),
        });
    };
    let base_id = base_id.clone().ok_or_else(|| SandboxError::ImageMissing {
        image: s.base_image.clone(),
    })?;
    let (env_tag, env_dockerfile) = environment_layer(task, &base_id);
    Ok(Plan::Swe {
        env_tag,
        env_dockerfile,
        bundle: resolve(&s.task_root, path),
    })
}

fn log_path(tag: &str, s: &BuildSettings) -> PathBuf {
    s.log_dir.join(format!("{}.log", slug(&tag.replace(':', "_"))))
}

async fn build_logged(
    engine: &Engine,
    tag: &str,
    context: Vec<u8>,
    s: &BuildSettings,
    run_id: &str,
) -> Result<(String, bool, PathBuf), SandboxError> {
    let log_path = log_path(tag, s);
    if let Some(id) = engine.image_id(tag).await? {
        return Ok((id, true, log_path));
    }
    // Two build-images processes on one Docker host (two test fixtures, two Slurm steps) may both
    // miss a tag and build it; each build gives a new image id, the tag ends on the last one,
    // and every task layer hashed over the first id changes its tag. A lock per tag on the host
    // makes the second wait and then find the first one's image.
    let _lock = lock_tag(tag).await?;
    if let Some(id) = engine.image_id(tag).await? {
        return Ok((id, true, log_path));
    }
    let mut log = std::fs::File::create(&log_path).map_err(|source| SandboxError::ReadFile {
        path: log_path.clone(),
        source,
    })?;
    let labels = HashMap::from([(LABEL_RUN.to_string(), run_id.to_string())]);
    let id = engine.build_image(tag, context, labels, &mut log).await?;
    Ok((id, false, log_path))
}

/// Takes this host's lock of `tag` (a file under the temporary directory, `flock`ed; released
/// when the returned file closes, also when the process dies).
async fn lock_tag(tag: &str) -> Result<std::fs::File, SandboxError> {
    let dir = std::env::temp_dir().join("lego-rl-image-locks");
    let path = dir.join(format!("{}.lock", slug(&tag.replace([':', '/'], "_"))));
    let p = path.clone();
    let locked = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
        std::fs::create_dir_all(&dir)?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)?;
        crate::io::lock_exclusive(&f, true)?;
        Ok(f)
    })
    .await
    .map_err(|e| SandboxError::ReadFile {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    locked.map_err(|source| SandboxError::ReadFile { path, source })
}

/// An environment layer's build: (image id, cache hit, log, seconds) or the error text.
type EnvBuild = Result<(String, bool, PathBuf, f64), String>;
/// A task image's build: (tag, image id, cache hit, log) or the error text.
type TaskBuild = Result<(String, String, bool, Option<PathBuf>), String>;

/// Builds (or finds) every task's image; returns one record per task, in input order.
pub async fn build_images(
    engine: &Engine,
    tasks: &[Task],
    s: &BuildSettings,
    run_id: &str,
    on_done: &(dyn Fn(&ImageRecord) + Sync),
) -> Result<Vec<ImageRecord>, SandboxError> {
    std::fs::create_dir_all(&s.log_dir).map_err(|source| SandboxError::ReadFile {
        path: s.log_dir.clone(),
        source,
    })?;
    let base_id = engine.image_id(&s.base_image).await?;
    let sem = Arc::new(Semaphore::new(s.jobs.max(1)));
    // Environment layers first (deduplicated), then task layers.
    let mut plans = Vec::with_capacity(tasks.len());
    let mut envs: BTreeMap<String, String> = BTreeMap::new();
    for t in tasks {
        let p = plan(engine, t, s, &base_id).await;
        if let Ok(Plan::Swe {
            env_tag,
            env_dockerfile,
            ..
        }) = &p
        {
            envs.insert(env_tag.clone(), env_dockerfile.replace("{BASE}", &s.base_image));
        }
        plans.push(p);
    }
    let env_results: HashMap<String, EnvBuild> = {
        let futs = envs.into_iter().map(|(tag, dockerfile)| {
            let sem = sem.clone();
            async move {
                let _permit = sem.acquire().await;
                let started = Instant::now();
                let mut tar = TarBuilder::new();
                tar.file("Dockerfile", dockerfile.as_bytes(), 0o644);
                let r = build_logged(engine, &tag, tar.finish(), s, run_id).await;
                (
                    tag,
                    r.map(|(id, hit, log)| (id, hit, log, started.elapsed().as_secs_f64()))
                        .map_err(|e| e.to_string()),
                )
            }
        });
        futures::future::join_all(futs).await.into_iter().collect()
    };
    let futs = tasks.iter().zip(plans).map(|(task, p)| {
        let sem = sem.clone();
        let env_results = &env_results;
        async move {
            let _permit = sem.acquire().await;
            let started = Instant::now();
            let mut rec = ImageRecord {
                schema: <ImageRecord as crate::records::Record>::SCHEMA.to_string(),
                task_id: task.id.clone(),
                image: String::new(),
                image_id: None,
                environment_image: None,
                cache_hit: false,
                seconds: 0.0,
                log_path: None,
                error: None,
            };
            let result: TaskBuild = async {
                match p.map_err(|e| e.to_string())? {
                    Plan::Prebuilt(image) => {
                        let id = engine.image_id(&image).await.map_err(|e| e.to_string())?;
                        let id = id.ok_or_else(|| format!("prebuilt image {image} not found"))?;
                        Ok((image, id, true, None))
                    }
                    Plan::Dockerfile { tag, context } => {
                        rec.log_path = Some(log_path(&tag, s).display().to_string());
                        let (id, hit, log) = build_logged(engine, &tag, context, s, run_id)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok((tag, id, hit, Some(log)))
                    }
                    Plan::Swe { env_tag, bundle, .. } => {
                        rec.environment_image = Some(env_tag.clone());
                        let (env_id, _, _, _) = env_results
                            .get(&env_tag)
                            .cloned()
                            .unwrap_or_else(|| Err("environment layer not built".into()))
                            .map_err(|e| format!("environment layer {env_tag}: {e}"))?;
                        let dockerfile = task_dockerfile(&env_tag, task);
                        let bytes = std::fs::read(&bundle)
                            .map_err(|e| format!("reading {}: {e}", bundle.display()))?;
                        let mut h = Sha256::new();
                        h.update(env_id.as_bytes());
                        h.update(dockerfile.as_bytes());
                        h.update(&bytes);
                        let tag = format!("lego-rl/task-{}:{}", slug(&task.id), short_hash(h));
                        rec.log_path = Some(log_path(&tag, s).display().to_string());
                        let mut tar = TarBuilder::new();
                        tar.file("Dockerfile", dockerfile.as_bytes(), 0o644).file(
                            "repo.bundle",
                            &bytes,
                            0o644,
                        );
                        let (id, hit, log) = build_logged(engine, &tag, tar.finish(), s, run_id)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok((tag, id, hit, Some(log)))
                    }
                }
            }
            .await;
            rec.seconds = started.elapsed().as_secs_f64();
            match result {
                Ok((tag, id, hit, log)) => {
                    rec.image = tag;
                    rec.image_id = Some(id);
                    rec.cache_hit = hit;
                    rec.log_path = log.map(|l| l.display().to_string()).or(rec.log_path.take());
                }
                Err(e) => rec.error = Some(e),
            }
            on_done(&rec);
            rec
        }
    });
    Ok(futures::future::join_all(futs).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_workdirs_are_absolute_and_never_the_root() {
        assert_eq!(usable_workdir("/app/").as_deref(), Some("/app"));
        assert_eq!(usable_workdir("/srv/repo").as_deref(), Some("/srv/repo"));
        for none in ["", "/", "//", "app", "./app"] {
            assert_eq!(usable_workdir(none), None, "{none:?}");
        }
    }

    #[test]
    fn slugs_are_docker_safe() {
        assert_eq!(slug("Owner/Name__x"), "owner-name--x");
        assert_eq!(slug("-a.b-"), "a.b");
    }

    #[test]
    fn environment_tag_depends_on_base_and_setup() {
        let mut t = Task::new("t", "i");
        t.repo = Some("o/r".into());
        let (a, _) = environment_layer(&t, "sha256:1");
        let (b, _) = environment_layer(&t, "sha256:2");
        t.environment.setup.push("pip install x".into());
        let (c, d) = environment_layer(&t, "sha256:1");
        assert!(a.starts_with("lego-rl/env-o-r:"));
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert!(d.contains("RUN pip install x"));
    }

    #[test]
    fn from_line_is_found() {
        assert_eq!(
            from_image("# c\nfrom lego-rl/base:trixie AS x\n"),
            Some("lego-rl/base:trixie".into())
        );
    }
}
