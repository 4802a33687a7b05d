//! Driver for scripts/bench/io.sh: generates trajectory-like records and times lego-rl's zstd
//! JSONL writer and reader on them. Prints one `key=value` line per measurement.
//!
//!   io_bench gen OUT.jsonl.zst TARGET_MB     write a file of ~TARGET_MB uncompressed JSON
//!   io_bench read FILE                       read it back as typed Trajectory records

use std::path::Path;
use std::time::Instant;

use lego_rl::io::{open_records, AtomicWriter, ReadOptions};
use lego_rl::records::{Generation, Packed, Trajectory};
use rand::{Rng, SeedableRng};

fn trajectory(i: u64, rng: &mut rand::rngs::StdRng) -> Trajectory {
    let generations = (0..4u32)
        .map(|g| {
            let prompt: Vec<u32> = (0..1500).map(|_| rng.gen_range(0..151_643)).collect();
            let output: Vec<u32> = (0..200).map(|_| rng.gen_range(0..151_643)).collect();
            let logprobs: Vec<f32> = (0..200).map(|_| -rng.gen::<f32>() * 3.0).collect();
            let routing: Vec<u16> = (0..1700 * 4 * 2).map(|_| rng.gen_range(0..8)).collect();
            Generation {
                index: g,
                api: "openai".into(),
                request: serde_json::json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]}),
                prompt_ids: prompt,
                output_ids: output,
                logprobs: Packed::f32_vec(&logprobs),
                routing: Some(Packed::from_experts(vec![1700, 4, 2], &routing)),
                finish_reason: "stop".into(),
                ..Default::default()
            }
        })
        .collect();
    Trajectory {
        task_id: format!("task-{}", i / 8),
        reward: Some((i % 2) as f64),
        diff: Some(
            "diff --git a/x b/x
"
            .into(),
        ),
        ..Trajectory::new(
            "task",
            i / 8,
            (i % 8) as u32,
            "mini-swe-agent",
            "embedded",
            generations,
        )
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("gen") => {
            let out = Path::new(&args[2]);
            let target: u64 = args[3].parse::<u64>()? << 20;
            let mut rng = rand::rngs::StdRng::seed_from_u64(0);
            // Serialize a batch once to know the record size, then write it repeatedly with new ids.
            let batch: Vec<Trajectory> = (0..64).map(|i| trajectory(i, &mut rng)).collect();
            let per = serde_json::to_vec(&batch[0])?.len() as u64 + 1;
            let n = target / per;
            let start = Instant::now();
            let mut w = AtomicWriter::create(out)?;
            let mut written = 0u64;
            let mut i = 0u64;
            while i < n {
                let chunk: Vec<Trajectory> = batch
                    .iter()
                    .take((n - i).min(64) as usize)
                    .enumerate()
                    .map(|(k, t)| {
                        let mut t = t.clone();
                        t.id = Trajectory::make_id("task", (i + k as u64) / 8, ((i + k as u64) % 8) as u32);
                        t
                    })
                    .collect();
                w.write_all(&chunk)?;
                i += chunk.len() as u64;
                written += chunk.len() as u64 * per;
            }
            w.finish()?;
            let s = start.elapsed().as_secs_f64();
            println!("write_records={n}\nwrite_bytes={written}\nwrite_seconds={s:.3}");
        }
        Some("read") => {
            let path = Path::new(&args[2]);
            let start = Instant::now();
            let mut n = 0u64;
            let mut tokens = 0u64;
            for r in open_records::<Trajectory>(
                path,
                ReadOptions {
                    strict: true,
                    ..Default::default()
                },
            )? {
                let t = r?;
                n += 1;
                tokens += t
                    .generations
                    .iter()
                    .map(|g| g.output_ids.len() as u64)
                    .sum::<u64>();
            }
            let s = start.elapsed().as_secs_f64();
            println!("read_records={n}\nread_tokens={tokens}\nread_seconds={s:.3}");
        }
        _ => anyhow::bail!("usage: io_bench gen OUT MB | io_bench read FILE"),
    }
    Ok(())
}
