//! Reader/writer behaviour on good, bad and torn files.

use std::io::Write;
use std::path::Path;

use super::*;
use crate::records::{Record, Task};

fn task(i: usize) -> Task {
    Task::new(format!("t{i}"), format!("fix bug {i}"))
}

fn write_tasks(path: &Path, n: usize) {
    let mut w = AtomicWriter::create(path).unwrap();
    for i in 0..n {
        w.write(&task(i)).unwrap();
    }
    assert_eq!(w.finish().unwrap(), n as u64);
}

#[test]
fn atomic_writer_round_trips_many_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.jsonl.zst");
    write_tasks(&path, 5000);
    let back: Vec<Task> = read_all(&path, ReadOptions::default()).unwrap();
    assert_eq!(back.len(), 5000);
    assert_eq!(back[4321], task(4321));
    // No temp files are left beside the output.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn dropped_atomic_writer_leaves_previous_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.jsonl.zst");
    write_tasks(&path, 3);
    {
        let mut w = AtomicWriter::create(&path).unwrap();
        w.write(&task(99)).unwrap();
        // dropped without finish(): simulates an error half-way
    }
    let back: Vec<Task> = read_all(&path, ReadOptions::default()).unwrap();
    assert_eq!(back, vec![task(0), task(1), task(2)]);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn plain_jsonl_is_read_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.jsonl");
    write_tasks(&path, 2);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("{\"schema\":\"lego-rl/task/v1\""), "{text}");
    let back: Vec<Task> = read_all(&path, ReadOptions::default()).unwrap();
    assert_eq!(back.len(), 2);
}

fn corrupt_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("bad.jsonl");
    let good = serde_json::to_string(&task(0)).unwrap();
    std::fs::write(
        &path,
        format!("{good}\n{{not json\n{good}\n{{\"schema\":\"lego-rl/task/v1\"}}\n{good}\n"),
    )
    .unwrap();
    path
}

#[test]
fn bad_records_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = corrupt_file(dir.path());
    let mut r = open_records::<Task>(&path, ReadOptions::default()).unwrap();
    let got: Vec<Task> = r.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(r.skipped(), 2);
}

#[test]
fn strict_reading_fails_on_the_first_bad_record_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = corrupt_file(dir.path());
    let err = read_all::<Task>(
        &path,
        ReadOptions {
            strict: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("bad.jsonl: record 2:"), "{msg}");
}

#[test]
fn missing_field_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, "{\"schema\":\"lego-rl/task/v1\",\"instruction\":\"x\"}\n").unwrap();
    let err = read_all::<Task>(
        &path,
        ReadOptions {
            strict: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("record 1: missing field `id`"), "{err}");
}

#[test]
fn wrong_kind_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, "{\"schema\":\"lego-rl/sample/v1\",\"id\":\"x\"}\n").unwrap();
    let err = read_all::<Task>(
        &path,
        ReadOptions {
            strict: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("expected a `lego-rl/task/v1` record, found `lego-rl/sample/v1`"),
        "{err}"
    );
}

#[test]
fn truncated_zstd_file_reads_complete_records_then_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.jsonl.zst");
    let (mut w, _) = AppendWriter::open(&path).unwrap();
    for i in 0..10 {
        w.push(&task(i)).unwrap();
        w.commit().unwrap();
    }
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 5).unwrap();
    let mut r = open_records::<Task>(&path, ReadOptions::default()).unwrap();
    let mut ok = 0;
    let mut err = None;
    for item in r.by_ref() {
        match item {
            Ok(_) => ok += 1,
            Err(e) => err = Some(e),
        }
    }
    assert_eq!(ok, 9);
    let msg = err.expect("truncation is reported").to_string();
    assert!(
        msg.contains("a.jsonl.zst: truncated zstd data after record 9"),
        "{msg}"
    );
    // A live reader stops quietly at the last complete frame.
    let live: Vec<Task> = read_all(
        &path,
        ReadOptions {
            torn_tail: TornTail::Stop,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(live.len(), 9);
}

#[test]
fn append_writer_cuts_a_torn_frame_and_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.jsonl.zst");
    {
        let (mut w, cut) = AppendWriter::open(&path).unwrap();
        assert_eq!(cut, 0);
        w.push(&task(0)).unwrap();
        w.push(&task(1)).unwrap();
        w.commit().unwrap();
    }
    // A torn write: half of a frame.
    let frame = zstd::bulk::compress(serde_json::to_string(&task(7)).unwrap().as_bytes(), 3).unwrap();
    let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(&frame[..frame.len() / 2]).unwrap();
    drop(f);
    let (mut w, cut) = AppendWriter::open(&path).unwrap();
    assert_eq!(cut as usize, frame.len() / 2);
    w.push(&task(2)).unwrap();
    w.commit().unwrap();
    let back: Vec<Task> = read_all(&path, ReadOptions::default()).unwrap();
    assert_eq!(back, vec![task(0), task(1), task(2)]);
}

#[test]
fn schema_constant_is_written() {
    let v = serde_json::to_value(task(1)).unwrap();
    assert_eq!(v["schema"], Task::SCHEMA);
}

#[test]
fn large_atomic_output_is_many_sized_frames_of_whole_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.jsonl.zst");
    // ~14 MB of records: several frames, compressed in rounds by the writer's thread.
    let big = |i: usize| Task::new(format!("t{i}"), format!("fix bug {i} ").repeat(40));
    let n = 30_000;
    let mut w = AtomicWriter::create(&path).unwrap();
    for i in 0..n {
        w.write(&big(i)).unwrap();
    }
    w.finish().unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let scan = frames::scan(&file, 0).unwrap();
    assert!(scan.frames >= 3, "{scan:?}");
    assert!(!scan.torn());
    assert!(parallel::applies(&scan), "{scan:?}");
    // Every frame holds whole records.
    let mut pos = 0;
    let bytes = std::fs::read(&path).unwrap();
    while pos < scan.complete_len {
        let f = frames::frame_at(&file, pos, scan.complete_len).unwrap().unwrap();
        let text = zstd::bulk::decompress(&bytes[pos as usize..f.end as usize], 64 << 20).unwrap();
        assert_eq!(text.len() as u64, f.content.unwrap());
        assert_eq!(text.last(), Some(&b'\n'), "frame at byte {pos}");
        pos = f.end;
    }
    // The parallel reader and a plain streaming decoder agree, record for record.
    let back: Vec<Task> = read_all(&path, ReadOptions::default()).unwrap();
    assert_eq!(back.len(), n);
    assert!(back.iter().enumerate().all(|(i, t)| *t == big(i)));
    let streamed = zstd::stream::decode_all(&bytes[..]).unwrap();
    let lines: Vec<&[u8]> = streamed
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), n);
    assert_eq!(
        serde_json::from_slice::<Task>(lines[12_345]).unwrap(),
        big(12_345)
    );
}

#[test]
fn empty_atomic_output_is_one_valid_zstd_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.jsonl.zst");
    AtomicWriter::create(&path).unwrap().finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes[..4], frames::ZSTD_MAGIC);
    assert!(zstd::stream::decode_all(&bytes[..]).unwrap().is_empty());
    assert!(read_all::<Task>(&path, ReadOptions::default())
        .unwrap()
        .is_empty());
}

#[test]
fn readers_and_writers_inside_every_rayon_worker_do_not_deadlock() {
    // validate reads files with par_iter, align writes from a pool: when every rayon worker
    // waits on a parallel decoder or a frame compressor, their own threads must not need a
    // worker. (Before they used the rayon pool, and this hung.)
    use rayon::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.jsonl.zst");
    let big = |i: usize| Task::new(format!("t{i}"), format!("fix bug {i} ").repeat(40));
    let mut w = AtomicWriter::create(&path).unwrap();
    for i in 0..20_000 {
        w.write(&big(i)).unwrap();
    }
    w.finish().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let dir_path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let n = 2 * rayon::current_num_threads();
        let counts: Vec<usize> = (0..n)
            .into_par_iter()
            .map(|k| {
                let back: Vec<Task> = read_all(&path, ReadOptions::default()).unwrap();
                let out = dir_path.join(format!("copy-{k}.jsonl.zst"));
                let mut w = AtomicWriter::create(&out).unwrap();
                w.write_all(&back).unwrap();
                w.finish().unwrap() as usize
            })
            .collect();
        let _ = tx.send(counts);
    });
    let counts = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("reading and writing from every rayon worker finished");
    assert!(counts.iter().all(|&c| c == 20_000), "{counts:?}");
}

#[test]
fn a_second_appender_is_refused_until_the_first_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.jsonl.zst");
    let (mut first, _) = AppendWriter::open(&path).unwrap();
    first.push(&task(0)).unwrap();
    first.commit().unwrap();
    let err = AppendWriter::open(&path)
        .err()
        .expect("a second appender is refused");
    let msg = err.to_string();
    assert!(
        msg.contains("a.jsonl.zst") && msg.contains("another process is appending"),
        "{msg}"
    );
    first.push(&task(1)).unwrap();
    first.commit().unwrap();
    drop(first);
    let (mut again, cut) = AppendWriter::open(&path).unwrap();
    assert_eq!(cut, 0);
    again.push(&task(2)).unwrap();
    again.commit().unwrap();
    let back: Vec<Task> = read_all(&path, ReadOptions::default()).unwrap();
    assert_eq!(back, vec![task(0), task(1), task(2)]);
}
