//! Driver for scripts/bench/concurrency.sh: how many trials this machine runs at once without
//! infrastructure failures. For each concurrency level J it runs `max(MIN_TRIALS, J)` trials of one
//! task with a trivial agent command (`true`), J at a time, through the whole lifecycle a rollout
//! uses (setup with the proxy relay, agent, extract, evaluate, cleanup), and prints one line of
//! `key=value` pairs per level. Levels stop early once BUDGET_S seconds have passed.
//!
//!   concurrency_bench TASKS_JSONL IMAGES_MANIFEST TASK_ID LEVELS(1,2,4) MIN_TRIALS BUDGET_S
//!
//! The relay forwards to a unix socket nobody answers on (the agent never calls the model): the
//! point is the sandbox machinery, not inference.

use std::path::PathBuf;
use std::time::Instant;

use futures::StreamExt;
use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{ImageRecord, Task};
use lego_rl::sandbox::{Engine, Trial, TrialLimits};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        a.len() == 7,
        "usage: concurrency_bench TASKS_JSONL IMAGES_MANIFEST TASK_ID LEVELS MIN_TRIALS BUDGET_S"
    );
    let tasks_path = PathBuf::from(&a[1]);
    let task_root = tasks_path
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let tasks: Vec<Task> = read_all(&tasks_path, ReadOptions::default())?;
    let task = tasks
        .into_iter()
        .find(|t| t.id == a[3])
        .ok_or_else(|| anyhow::anyhow!("{}: no task {}", a[1], a[3]))?;
    let images: Vec<ImageRecord> = read_all(&PathBuf::from(&a[2]), ReadOptions::default())?;
    let image = images
        .into_iter()
        .find(|r| r.task_id == task.id && r.error.is_none())
        .ok_or_else(|| anyhow::anyhow!("{}: no usable image for {}", a[2], task.id))?
        .image;
    let levels: Vec<usize> = a[4].split(',').map(str::parse).collect::<Result<_, _>>()?;
    let min_trials: usize = a[5].parse()?;
    let budget: f64 = a[6].parse()?;
    let engine = Engine::connect().await?;
    let sock_dir = tempfile::tempdir()?;
    let sock = sock_dir.path().join("proxy.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock)?;
    let run = format!("bench-concurrency-{}", std::process::id());
    lego_rl::sandbox::trial::install_signal_sweep(engine.clone(), run.clone());
    let started = Instant::now();
    for (li, &jobs) in levels.iter().enumerate() {
        if started.elapsed().as_secs_f64() > budget {
            println!("skipped_level={jobs} reason=budget");
            continue;
        }
        let n = min_trials.max(jobs);
        let t0 = Instant::now();
        let results: Vec<_> = futures::stream::iter(0..n)
            .map(|i| {
                let trial = Trial::new(
                    engine.clone(),
                    task.clone(),
                    task_root.clone(),
                    image.clone(),
                    &run,
                    &format!("j{jobs}-{li}-{i}"),
                    TrialLimits::for_task(&task),
                    Vec::new(),
                    Vec::new(),
                )
                .with_proxy_socket(sock.clone());
                trial.run("true")
            })
            .buffer_unordered(jobs)
            .collect()
            .await;
        let wall = t0.elapsed().as_secs_f64();
        let infra: Vec<String> = results
            .iter()
            .filter(|r| r.infra_failure)
            .map(|r| r.termination.to_string())
            .collect();
        let mut setup: Vec<f64> = results
            .iter()
            .filter_map(|r| r.stages.get("setup").map(|s| s.end - s.start))
            .collect();
        setup.sort_by(f64::total_cmp);
        let p50 = setup.get(setup.len() / 2).copied().unwrap_or(f64::NAN);
        println!(
            "jobs={jobs} trials={n} infra={} wall_s={wall:.2} trials_per_min={:.2} setup_p50_s={p50:.2} infra_kinds={}",
            infra.len(),
            n as f64 * 60.0 / wall,
            if infra.is_empty() { "-".to_string() } else { infra.join(",") }
        );
    }
    let left = engine.sweep(Some(&run)).await?;
    println!("leftover_objects={left}");
    Ok(())
}
