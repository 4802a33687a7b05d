//! Atomic and append-mode record writers.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use rayon::prelude::*;
use tempfile::NamedTempFile;

use super::frames;
use super::parallel;
use super::{is_stdio, IoError};
use crate::records::Record;

/// zstd level: 3 is zstd's default and keeps writing well above JSON serialization speed.
const LEVEL: i32 = 3;

/// Output encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Zstd,
    Plain,
}

impl Compression {
    /// zstd unless the file name ends in `.jsonl` or `.json` (plain text, for hand inspection);
    /// stdout is plain when it is a terminal and zstd otherwise, so pipes carry the same format
    /// as files and a terminal shows text.
    pub fn for_path(path: &Path) -> Self {
        if is_stdio(path) {
            return if io::stdout().is_terminal() {
                Compression::Plain
            } else {
                Compression::Zstd
            };
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") | Some("json") => Compression::Plain,
            _ => Compression::Zstd,
        }
    }
}

/// Uncompressed bytes per frame of an [`AtomicWriter`]'s zstd output (cut at a record
/// boundary). Independent frames let the writer compress, and readers decompress, several at
/// once ([`super::parallel`]); at level 3 (a 1–2 MiB window) 4 MiB frames cost well under 1% of
/// the compression ratio.
const FRAME_BYTES: usize = 4 << 20;

type Out = BufWriter<Box<dyn Write + Send>>;

enum Sink {
    Zstd(Framed),
    Plain(Out),
}

/// zstd output as independent frames, each declaring its size. Full frames go to a background
/// thread that compresses them a round at a time ([`super::parallel::map_on_threads`], not the
/// rayon pool: a writer is often driven from a rayon worker) and writes them in order, so
/// serializing the next records overlaps compressing the last ones (as zstd's own multi-threaded
/// mode did, but with frames a reader can decode in parallel too).
struct Framed {
    /// The frame being filled.
    current: Vec<u8>,
    tx: Option<SyncSender<Vec<u8>>>,
    thread: Option<JoinHandle<io::Result<Out>>>,
    /// Frames handed to the thread.
    frames: u64,
}

impl Framed {
    fn new(out: Out) -> io::Result<Self> {
        let threads = parallel::round_size();
        let (tx, rx) = sync_channel::<Vec<u8>>(threads);
        let thread = std::thread::Builder::new()
            .name("lego-rl-zstd".into())
            .spawn(move || compress_frames(rx, out, threads))?;
        Ok(Framed {
            current: Vec::with_capacity(FRAME_BYTES + (1 << 16)),
            tx: Some(tx),
            thread: Some(thread),
            frames: 0,
        })
    }

    /// Appends whole lines (`bytes` ends with a newline, or continues a line that will).
    fn write_lines(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.current.extend_from_slice(bytes);
        if self.current.len() >= FRAME_BYTES {
            // Cut after the last complete line; a single longer line makes a longer frame.
            if let Some(p) = memchr::memrchr(b'\n', &self.current) {
                let mut next = Vec::with_capacity(FRAME_BYTES + (1 << 16));
                next.extend_from_slice(&self.current[p + 1..]);
                self.current.truncate(p + 1);
                let full = std::mem::replace(&mut self.current, next);
                self.send(full)?;
            }
        }
        Ok(())
    }

    fn send(&mut self, frame: Vec<u8>) -> io::Result<()> {
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(frame).is_ok());
        if sent {
            self.frames += 1;
            return Ok(());
        }
        // The thread stopped on an error: report it.
        self.tx = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => Err(e),
            _ => Err(io::Error::other("the zstd writer thread stopped")),
        }
    }

    fn finish(mut self) -> io::Result<Out> {
        // An empty output is still one (empty) frame, so `zstd -dc` and other tools accept it.
        if !self.current.is_empty() || self.frames == 0 {
            let last = std::mem::take(&mut self.current);
            self.send(last)?;
        }
        self.tx = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(out)) => out,
            Some(Err(_)) => Err(io::Error::other("the zstd writer thread panicked")),
            None => Err(io::Error::other("the zstd writer thread stopped")),
        }
    }
}

/// The background thread of [`Framed`]: waits for a frame, takes whatever else is queued (up to
/// a round of `threads`), compresses the round in parallel and writes it in order.
fn compress_frames(rx: Receiver<Vec<u8>>, mut out: Out, threads: usize) -> io::Result<Out> {
    while let Ok(first) = rx.recv() {
        let mut round = vec![first];
        while round.len() < threads {
            match rx.try_recv() {
                Ok(f) => round.push(f),
                Err(_) => break,
            }
        }
        let frames = parallel::map_on_threads(round, |f| zstd::bulk::compress(&f, LEVEL))
            .into_iter()
            .collect::<io::Result<Vec<_>>>()?;
        for f in &frames {
            out.write_all(f)?;
        }
    }
    Ok(out)
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Zstd(w) => w.write_lines(buf).map(|()| buf.len()),
            Sink::Plain(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            // Frames are written whole, when full or at finish.
            Sink::Zstd(_) => Ok(()),
            Sink::Plain(w) => w.flush(),
        }
    }
}

/// Writes a whole file atomically: records go to `.<name>.<random>.tmp` in the target's
/// directory, and [`AtomicWriter::finish`] fsyncs and renames it. Dropping the writer without
/// `finish` (an error, a panic) removes the temp file and leaves any previous file untouched.
pub struct AtomicWriter {
    path: PathBuf,
    temp: Option<NamedTempFile>,
    sink: Option<Sink>,
    records: u64,
}

impl AtomicWriter {
    /// Creates a writer for `path` (`-` = stdout, written directly), compression by file name.
    pub fn create(path: &Path) -> Result<Self, IoError> {
        Self::with_compression(path, Compression::for_path(path))
    }

    /// Creates a writer with an explicit compression.
    pub fn with_compression(path: &Path, compression: Compression) -> Result<Self, IoError> {
        let werr = |source| IoError::Write {
            path: path.to_path_buf(),
            source,
        };
        let (temp, out): (Option<NamedTempFile>, Box<dyn Write + Send>) = if is_stdio(path) {
            (None, Box::new(io::stdout()))
        } else {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            std::fs::create_dir_all(&dir).map_err(werr)?;
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
            let temp = tempfile::Builder::new()
                .prefix(&format!(".{name}."))
                .suffix(".tmp")
                .tempfile_in(&dir)
                .map_err(werr)?;
            let file = temp.reopen().map_err(werr)?;
            (Some(temp), Box::new(file))
        };
        let buffered = BufWriter::with_capacity(1 << 20, out);
        let sink = match compression {
            Compression::Plain => Sink::Plain(buffered),
            Compression::Zstd => Sink::Zstd(Framed::new(buffered).map_err(werr)?),
        };
        Ok(AtomicWriter {
            path: path.to_path_buf(),
            temp,
            sink: Some(sink),
            records: 0,
        })
    }

    fn sink(&mut self) -> &mut Sink {
        self.sink.as_mut().expect("invariant: sink present until finish")
    }

    /// Writes one record.
    pub fn write<R: Record>(&mut self, record: &R) -> Result<(), IoError> {
        let mut line = serde_json::to_vec(record).map_err(|source| IoError::Serialize {
            path: self.path.clone(),
            source,
        })?;
        line.push(b'\n');
        self.write_raw(&line)?;
        self.records += 1;
        Ok(())
    }

    /// Writes many records, serializing them in parallel.
    pub fn write_all<R: Record + Sync>(&mut self, records: &[R]) -> Result<(), IoError> {
        let lines: Vec<Vec<u8>> = records
            .par_iter()
            .map(|r| {
                let mut v = serde_json::to_vec(r)?;
                v.push(b'\n');
                Ok(v)
            })
            .collect::<Result<_, serde_json::Error>>()
            .map_err(|source| IoError::Serialize {
                path: self.path.clone(),
                source,
            })?;
        for line in &lines {
            self.write_raw(line)?;
        }
        self.records += records.len() as u64;
        Ok(())
    }

    /// Writes pre-serialized JSON lines (each ending in a newline).
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<(), IoError> {
        let path = self.path.clone();
        self.sink()
            .write_all(bytes)
            .map_err(|source| IoError::Write { path, source })
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Completes the stream, fsyncs and renames the temp file onto the target.
    pub fn finish(mut self) -> Result<u64, IoError> {
        let werr = |source| IoError::Write {
            path: self.path.clone(),
            source,
        };
        let mut buffered = match self.sink.take().expect("invariant: finish called once") {
            Sink::Zstd(framed) => framed.finish().map_err(werr)?,
            Sink::Plain(w) => w,
        };
        buffered.flush().map_err(werr)?;
        drop(buffered);
        if let Some(temp) = self.temp.take() {
            temp.as_file().sync_all().map_err(werr)?;
            temp.persist(&self.path).map_err(|e| werr(e.error))?;
            sync_parent(&self.path);
        }
        Ok(self.records)
    }
}

fn sync_parent(path: &Path) {
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

/// Appends records to a zstd JSONL file, one complete frame per [`AppendWriter::commit`].
pub struct AppendWriter {
    path: PathBuf,
    file: File,
    pending: Vec<u8>,
    pending_records: u64,
    /// fsync after each commit (default true; off for benchmarks of throughput alone).
    pub sync: bool,
}

impl AppendWriter {
    /// Opens (or creates) `path` for appending. A torn final frame left by a crash is cut off
    /// with a warning; returns the writer and the number of bytes cut. The file is locked
    /// (advisory, exclusive) while the writer lives: opening it again, from this or another
    /// process, fails with an error that says so.
    pub fn open(path: &Path) -> Result<(Self, u64), IoError> {
        let werr = |source| IoError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(werr)?;
        // One appender per file, before anything else: a second one would take the first's
        // commit in flight for a torn frame and cut it, and both would write the same keys.
        // (An advisory lock, released when the writer is dropped or the process dies.)
        super::lock_exclusive(&file, false).map_err(|e| {
            werr(if e.kind() == io::ErrorKind::WouldBlock {
                io::Error::other(
                    "another process is appending to this file (a second rollout with the same output?)",
                )
            } else {
                e
            })
        })?;
        let scan = frames::scan(&file, 0).map_err(werr)?;
        let mut cut = 0;
        if scan.torn() {
            cut = scan.file_len - scan.complete_len;
            tracing::warn!(
                "{}: cutting a torn final zstd frame ({cut} bytes after byte {}) left by an interrupted writer",
                path.display(),
                scan.complete_len
            );
            file.set_len(scan.complete_len).map_err(werr)?;
            file.sync_all().map_err(werr)?;
        }
        Ok((
            AppendWriter {
                path: path.to_path_buf(),
                file,
                pending: Vec::new(),
                pending_records: 0,
                sync: true,
            },
            cut,
        ))
    }

    /// Buffers one record for the next commit.
    pub fn push<R: Record>(&mut self, record: &R) -> Result<(), IoError> {
        serde_json::to_writer(&mut self.pending, record).map_err(|source| IoError::Serialize {
            path: self.path.clone(),
            source,
        })?;
        self.pending.push(b'\n');
        self.pending_records += 1;
        Ok(())
    }

    /// Writes the buffered records as one zstd frame (a single `write` at the end of the file)
    /// and fsyncs it. Returns the number of records committed.
    pub fn commit(&mut self) -> Result<u64, IoError> {
        if self.pending.is_empty() {
            return Ok(0);
        }
        let werr = |source| IoError::Write {
            path: self.path.clone(),
            source,
        };
        let frame = zstd::bulk::compress(&self.pending, LEVEL).map_err(werr)?;
        use std::io::Seek;
        self.file.seek(io::SeekFrom::End(0)).map_err(werr)?;
        self.file.write_all(&frame).map_err(werr)?;
        if self.sync {
            self.file.sync_data().map_err(werr)?;
        }
        self.pending.clear();
        let n = self.pending_records;
        self.pending_records = 0;
        Ok(n)
    }
}
