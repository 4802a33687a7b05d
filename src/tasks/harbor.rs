//! Harbor task directory → `Task`.
//!
//! Layout: `task.toml`, `instruction.md`, `environment/Dockerfile` (or
//! `environment/docker-compose.yaml` with a `main` service, or `[environment].docker_image`),
//! `tests/test.sh` (writes `/logs/verifier/reward.txt` or `reward.json`), `solution/solve.sh`.
//! Multi-step tasks (`[[steps]]`) keep their instructions under `steps/<name>/`.
//!
//! `task.toml` comes in two key layouts: legacy (`version = "1.0"`, `memory = "2G"`,
//! `storage = "10G"`) and current (`schema_version = "1.x"`, `memory_mb`, `storage_mb`). Both
//! normalise to `metadata.harbor.{memory_mb, storage_mb}`; the whole file is also kept as JSON in
//! `metadata.harbor.task_toml`. Paths (build context, tests, solution) are absolute, because the
//! kept-task file usually lives elsewhere than the pool.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::TaskError;
use crate::records::{Environment, Grader, Task, TaskSource, Timeouts};
use crate::sandbox::images::usable_workdir;

/// Whether `dir` looks like a Harbor task directory.
pub fn is_task_dir(dir: &Path) -> bool {
    dir.join("task.toml").is_file()
}

/// Reads one Harbor task directory.
pub fn load(dir: &Path) -> Result<Task, TaskError> {
    let err = |msg: String| TaskError::TaskDir {
        path: dir.to_path_buf(),
        msg,
    };
    let dir = std::fs::canonicalize(dir).map_err(|e| err(e.to_string()))?;
    let read = |rel: &str| -> Result<Option<String>, TaskError> {
        let p = dir.join(rel);
        match std::fs::read_to_string(&p) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err(format!("{rel}: {e}"))),
        }
    };
    let toml_text = read("task.toml")?.ok_or_else(|| err("no task.toml".into()))?;
    let doc: toml::Table = toml_text
        .parse()
        .map_err(|e: toml::de::Error| err(format!("task.toml: {}", e.message())))?;
    let get = |table: &str, key: &str| doc.get(table).and_then(|t| t.get(key));
    let secs = |table: &str| get(table, "timeout_sec").and_then(as_f64);

    let steps: Vec<String> = doc
        .get("steps")
        .and_then(|s| s.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|s| s.get("name").and_then(|n| n.as_str()).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let instruction = match read("instruction.md")? {
        Some(text) => text,
        None if !steps.is_empty() => {
            let mut parts = Vec::new();
            for name in &steps {
                let text = read(&format!("steps/{name}/instruction.md"))?
                    .ok_or_else(|| err(format!("steps/{name}/instruction.md is missing")))?;
                parts.push(format!("## Step {name}\n\n{text}"));
            }
            parts.join("\n\n")
        }
        None => return Err(err("instruction.md is missing".into())),
    };

    let env_dir = dir.join("environment");
    let dockerfile = read("environment/Dockerfile")?;
    let compose = ["docker-compose.yaml", "docker-compose.yml"]
        .iter()
        .any(|f| env_dir.join(f).is_file());
    let image = get("environment", "docker_image")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    if dockerfile.is_none() && image.is_none() && !compose {
        return Err(err(
            "no environment: need environment/Dockerfile, environment/docker-compose.yaml or [environment].docker_image"
                .into(),
        ));
    }
    let tests_dir = dir.join("tests");
    let has_tests = tests_dir.join("test.sh").is_file()
        || steps
            .iter()
            .all(|s| dir.join(format!("steps/{s}/tests/test.sh")).is_file())
            && !steps.is_empty();
    if !has_tests {
        return Err(err("tests/test.sh is missing".into()));
    }
    let solution = dir.join("solution/solve.sh");

    let mut harbor = Map::new();
    let schema_version = doc
        .get("schema_version")
        .or_else(|| doc.get("version"))
        .and_then(|v| v.as_str())
        .map(str::to_string);
    harbor.insert("schema_version".into(), json!(schema_version));
    if let Some(name) = get("task", "name").and_then(|v| v.as_str()) {
        harbor.insert("name".into(), json!(name));
    }
    let mb = |new_key: &str, legacy_key: &str| -> Result<Option<u64>, TaskError> {
        if let Some(v) = get("environment", new_key) {
            return v
                .as_integer()
                .and_then(|i| u64::try_from(i).ok())
                .map(Some)
                .ok_or_else(|| {
                    err(format!(
                        "task.toml: [environment].{new_key} must be a non-negative integer"
                    ))
                });
        }
        match get("environment", legacy_key) {
            None => Ok(None),
            Some(v) => v.as_str().and_then(parse_size_mb).map(Some).ok_or_else(|| {
                err(format!(
                    "task.toml: [environment].{legacy_key} must be a size like \"2G\""
                ))
            }),
        }
    };
    harbor.insert("memory_mb".into(), json!(mb("memory_mb", "memory")?));
    harbor.insert("storage_mb".into(), json!(mb("storage_mb", "storage")?));
    for key in ["cpus", "gpus", "allow_internet", "build_timeout_sec"] {
        if let Some(v) = get("environment", key) {
            harbor.insert(key.into(), toml_to_json(v));
        }
    }
    harbor.insert("compose".into(), json!(compose));
    if !steps.is_empty() {
        harbor.insert("steps".into(), json!(steps));
    }
    if solution.is_file() {
        harbor.insert("solution".into(), json!(solution.display().to_string()));
    }
    harbor.insert("task_toml".into(), toml_to_json(&toml::Value::Table(doc.clone())));

    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| err("directory name is not UTF-8".into()))?
        .to_string();
    let mut task = Task::new(id, instruction);
    task.source = TaskSource::Harbor;
    let named_workdir = get("environment", "workdir").and_then(|v| v.as_str());
    task.environment = environment(dockerfile, &env_dir, image, named_workdir);
    task.grader = Some(Grader::Harbor {
        tests_dir: tests_dir.display().to_string(),
    });
    let d = Timeouts::default();
    task.timeouts = Timeouts {
        setup_s: d.setup_s,
        agent_s: secs("agent").unwrap_or(d.agent_s),
        eval_s: secs("verifier").unwrap_or(d.eval_s),
    };
    if let Some(meta) = doc.get("metadata").and_then(|m| m.as_table()) {
        for (k, v) in meta {
            task.metadata.insert(k.clone(), toml_to_json(v));
        }
    }
    task.metadata.insert("harbor".into(), Value::Object(harbor));
    Ok(task)
}

/// `"2G"` → 2048, `"512M"` → 512, `"10GB"`/`"10Gi"` → 10240.
pub fn parse_size_mb(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let n: f64 = s[..digits].parse().ok()?;
    let unit = s[digits..].trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches('B').trim_end_matches('I');
    let mb = match unit {
        "" | "M" => n,
        "K" => n / 1024.0,
        "G" => n * 1024.0,
        "T" => n * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(mb.round() as u64)
}

/// The task's container: its Dockerfile (and build context) or prebuilt image, and its working
/// directory, the one task.toml names or else the Dockerfile's.
fn environment(
    dockerfile: Option<String>,
    env_dir: &Path,
    image: Option<String>,
    named_workdir: Option<&str>,
) -> Environment {
    let workdir = named_workdir
        .map(str::to_string)
        .or_else(|| dockerfile.as_deref().and_then(dockerfile_workdir));
    Environment {
        dockerfile,
        context: env_dir.is_dir().then(|| env_dir.display().to_string()),
        image,
        workdir,
        ..Environment::default()
    }
}

/// The working directory a Dockerfile leaves its final stage in: its last `WORKDIR`, a relative
/// one joined to the one before.
///
/// Why: Harbor runs the agent in the image's working directory, and task.toml rarely names it.
/// Without it the trial would fall back to SWE-bench's /testbed: the agent would work there, the
/// diff would be taken there, and an answer written to /app would never reach the grader (reward
/// 0, silently). `None` when the final stage sets none (it inherits its base image's, which only
/// the built image knows), when the path uses a build variable, and for `/` (the trial hands its
/// working tree to the agent user and takes its diff with git, which must never span the whole
/// filesystem): a trial then works where the built image's config says
/// ([`crate::sandbox::images::trial_workdir`]), and in /testbed, with a warning, when it says
/// nothing.
///
/// Only instruction lines are read: a line continued from the one before (`\` at its end) and the
/// body of a heredoc (`RUN <<EOF`, `COPY <<-'EOF' /app/main.py`) are an instruction's arguments,
/// so a Python file written by a heredoc whose line starts with `from` does not end the stage.
fn dockerfile_workdir(dockerfile: &str) -> Option<String> {
    let mut dir: Option<String> = None;
    let mut lines = dockerfile.lines();
    let mut continued = false;
    while let Some(line) = lines.next() {
        let instruction_line = !continued;
        // Comment and empty lines inside a continued instruction do not end it (Docker drops them).
        let blank = line.trim_start().starts_with('#') || line.trim().is_empty();
        continued = if blank {
            continued
        } else {
            line.trim_end().ends_with('\\')
        };
        for end in heredoc_ends(if blank { "" } else { line }) {
            // The body, up to its terminator line (`<<-` allows leading tabs before it).
            lines.by_ref().find(|l| l.trim_start_matches('\t') == end);
            continued = false;
        }
        if !instruction_line {
            continue;
        }
        let mut words = line.split_whitespace();
        let Some(instruction) = words.next() else { continue };
        if instruction.eq_ignore_ascii_case("FROM") {
            dir = None;
        } else if instruction.eq_ignore_ascii_case("WORKDIR") {
            let path = words.collect::<Vec<_>>().join(" ");
            let path = path.trim_matches('"');
            dir = if path.contains('$') || path.is_empty() {
                None
            } else if path.starts_with('/') {
                usable_workdir(path)
            } else {
                dir.map(|d| format!("{}/{path}", d.trim_end_matches('/')))
            };
        }
    }
    dir
}

/// The terminators of the heredocs a Dockerfile line opens, in order: `<<EOF`, `<<-EOF`,
/// `<<"EOF"`, `<<'EOF'` (a shell here-string `<<<` opens none).
fn heredoc_ends(line: &str) -> Vec<&str> {
    let mut ends = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("<<") {
        rest = &rest[at + 2..];
        if rest.starts_with('<') {
            rest = rest.trim_start_matches('<');
            continue;
        }
        let word = rest.strip_prefix('-').unwrap_or(rest);
        let word = word.trim_start_matches(['"', '\'']);
        let len = word
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(word.len());
        if len > 0 {
            ends.push(&word[..len]);
        }
        rest = &word[len..];
    }
    ends
}

fn as_f64(v: &toml::Value) -> Option<f64> {
    v.as_float().or_else(|| v.as_integer().map(|i| i as f64))
}

fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => json!(s),
        toml::Value::Integer(i) => json!(i),
        toml::Value::Float(f) => json!(f),
        toml::Value::Boolean(b) => json!(b),
        toml::Value::Datetime(d) => json!(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(t.iter().map(|(k, v)| (k.clone(), toml_to_json(v))).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_sizes_convert_to_mb() {
        assert_eq!(parse_size_mb("2G"), Some(2048));
        assert_eq!(parse_size_mb("10G"), Some(10240));
        assert_eq!(parse_size_mb("512M"), Some(512));
        assert_eq!(parse_size_mb("1.5GiB"), Some(1536));
        assert_eq!(parse_size_mb("lots"), None);
    }

    #[test]
    fn the_dockerfile_names_the_working_directory() {
        let wd = |d: &str| dockerfile_workdir(d);
        assert_eq!(wd("FROM x\nWORKDIR /app\n").as_deref(), Some("/app"));
        assert_eq!(
            wd("FROM x\nworkdir /srv/\nWORKDIR code\n").as_deref(),
            Some("/srv/code")
        );
        assert_eq!(wd("FROM x\nWORKDIR \"/a b\"\n").as_deref(), Some("/a b"));
        assert_eq!(wd("FROM x\nWORKDIR /app\nWORKDIR /\n"), None);
        // The final stage decides; one without WORKDIR inherits its base image's (unknown here).
        assert_eq!(
            wd("FROM x AS b\nWORKDIR /build\nFROM y\nCOPY --from=b /o /o\n"),
            None
        );
        assert_eq!(wd("FROM x\nWORKDIR $HOME/app\n"), None);
        assert_eq!(wd("FROM x\nWORKDIR rel\n"), None);
        // A heredoc's body and a continued line are arguments, not instructions: a Python file
        // that starts `from ...` does not begin a stage, nor does a WORKDIR line inside the body.
        let heredoc = "FROM x\nWORKDIR /app\nCOPY <<-'EOF' /app/main.py\nfrom math import sqrt\n\
                       WORKDIR /elsewhere\n\tEOF\nRUN cat <<A >a <<\"B\" >b\nfrom a\nA\nfrom b\nB\n";
        assert_eq!(wd(heredoc).as_deref(), Some("/app"));
        let continued = "FROM x\nWORKDIR /app\nRUN echo \\\n    from here \\\n# a comment\n\n  from there\n";
        assert_eq!(wd(continued).as_deref(), Some("/app"));
        // A here-string opens no heredoc; the instructions after it still count.
        assert_eq!(
            wd("FROM x\nRUN cat <<< hi\nWORKDIR /srv\n").as_deref(),
            Some("/srv")
        );
        // A comment opens no heredoc either.
        assert_eq!(
            wd("FROM x\n# see <<EOF\nWORKDIR /a\nEOF\n").as_deref(),
            Some("/a")
        );
        assert_eq!(heredoc_ends("RUN cat <<A >a <<-\"B\" >b <<<c"), ["A", "B"]);
    }
}

#[cfg(test)]
mod fixture_tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/harbor")
            .join(name)
    }

    fn harbor_meta(t: &Task) -> &Map<String, Value> {
        t.metadata["harbor"].as_object().expect("harbor metadata")
    }

    #[test]
    fn legacy_task_toml_keys_normalise() {
        let t = load(&fixture("hello-world")).unwrap();
        assert_eq!(t.id, "hello-world");
        // task.toml names no workdir: the Dockerfile's WORKDIR, where Harbor runs the agent.
        assert_eq!(t.environment.workdir.as_deref(), Some("/app"));
        assert_eq!(t.source, TaskSource::Harbor);
        assert!(t.instruction.contains("hello.txt"), "{}", t.instruction);
        let h = harbor_meta(&t);
        assert_eq!(h["schema_version"], json!("1.0"));
        assert_eq!(h["memory_mb"], json!(2048));
        assert_eq!(h["storage_mb"], json!(10240));
        assert_eq!(h["compose"], json!(false));
        assert!(h["solution"]
            .as_str()
            .unwrap()
            .ends_with("hello-world/solution/solve.sh"));
        assert_eq!(t.metadata["difficulty"], json!("easy"));
        assert_eq!(t.timeouts.agent_s, 120.0);
        assert!(t.environment.dockerfile.as_deref().unwrap().contains("FROM"));
        match &t.grader {
            Some(Grader::Harbor { tests_dir }) => assert!(tests_dir.ends_with("hello-world/tests")),
            other => panic!("grader {other:?}"),
        }
    }

    #[test]
    fn current_keys_compose_and_steps() {
        let t = load(&fixture("simple-task")).unwrap();
        assert_eq!(harbor_meta(&t)["memory_mb"], json!(2048));
        let mc = load(&fixture("multi-container")).unwrap();
        assert_eq!(harbor_meta(&mc)["compose"], json!(true));
        let ms = load(&fixture("multi-step")).unwrap();
        assert_eq!(
            harbor_meta(&ms)["steps"],
            json!(["scaffold", "implement", "document"])
        );
        assert_eq!(harbor_meta(&ms)["schema_version"], json!("1.1"));
        assert!(ms.instruction.starts_with("## Step scaffold"));
        assert_eq!(ms.environment.workdir.as_deref(), Some("/app"));
    }

    #[test]
    fn prebuilt_image_task_and_a_broken_directory() {
        let dir = tempfile::tempdir().unwrap();
        let task = dir.path().join("caffe-cifar-10");
        std::fs::create_dir_all(task.join("tests")).unwrap();
        std::fs::copy(
            fixture("_task-toml-samples/terminal-bench-2.1__caffe-cifar-10.task.toml"),
            task.join("task.toml"),
        )
        .unwrap();
        std::fs::write(task.join("tests/test.sh"), "#!/bin/bash\n").unwrap();
        let err = load(&task).unwrap_err().to_string();
        assert!(
            err.contains("caffe-cifar-10: cannot read task directory: instruction.md is missing"),
            "{err}"
        );
        std::fs::write(task.join("instruction.md"), "Train it.\n").unwrap();
        let t = load(&task).unwrap();
        assert_eq!(
            t.environment.image.as_deref(),
            Some("alexgshaw/caffe-cifar-10:20260403")
        );
        assert_eq!(harbor_meta(&t)["memory_mb"], json!(8192));
        assert_eq!(harbor_meta(&t)["name"], json!("terminal-bench/caffe-cifar-10"));
        assert_eq!(t.timeouts.eval_s, 1200.0);
        let dirs = crate::tasks::source::classify(dir.path()).unwrap();
        assert!(matches!(dirs, crate::tasks::source::InputKind::TaskDirs(d) if d == vec![task.clone()]));
        let empty = tempfile::tempdir().unwrap();
        assert!(crate::tasks::source::classify(empty.path())
            .unwrap_err()
            .to_string()
            .contains("no Harbor task.toml"));
    }
}
