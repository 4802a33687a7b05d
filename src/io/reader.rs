//! Streaming record reader.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::frames::{self, ZSTD_MAGIC};
use super::parallel;
use super::{is_stdio, IoError};
use crate::records::{check_schema, Record};

/// What to do with bytes after the last complete zstd frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TornTail {
    /// Report [`IoError::Truncated`] after the complete records (a finished producer's file).
    #[default]
    Error,
    /// Stop quietly at the last complete frame (a file that is still being appended to).
    Stop,
}

/// How strictly to read.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Fail on the first bad record instead of skipping and counting it.
    pub strict: bool,
    pub torn_tail: TornTail,
}

const BATCH_LINES: usize = 2048;
const BATCH_BYTES: usize = 16 << 20;

/// Decompressed lines of a file with their 1-based line numbers; blank lines are skipped.
pub struct LineSource {
    path: PathBuf,
    inner: Box<dyn BufRead + Send>,
    line: u64,
    torn: Option<(u64, u64)>,
    torn_tail: TornTail,
    finished: bool,
}

fn peek_magic(r: &mut dyn BufRead) -> io::Result<bool> {
    let buf = r.fill_buf()?;
    Ok(buf.len() >= 4 && buf[..4] == ZSTD_MAGIC)
}

/// Opens a file (or `-` for stdin) as decompressed lines.
pub fn open_lines(path: &Path, torn_tail: TornTail) -> Result<LineSource, IoError> {
    let open_err = |source| IoError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut torn = None;
    let inner: Box<dyn BufRead + Send> = if is_stdio(path) {
        let mut raw = BufReader::with_capacity(1 << 20, io::stdin());
        if peek_magic(&mut raw).map_err(open_err)? {
            Box::new(BufReader::with_capacity(
                1 << 20,
                zstd::Decoder::with_buffer(raw).map_err(open_err)?,
            ))
        } else {
            Box::new(raw)
        }
    } else {
        let file = File::open(path).map_err(open_err)?;
        let mut raw = BufReader::with_capacity(1 << 20, file.try_clone().map_err(open_err)?);
        if peek_magic(&mut raw).map_err(open_err)? {
            let scan = frames::scan(&file, 0).map_err(open_err)?;
            if scan.torn() {
                torn = Some((scan.complete_len, scan.file_len));
            }
            parallel::decoder(file, &scan).map_err(open_err)?
        } else {
            Box::new(raw)
        }
    };
    Ok(LineSource {
        path: path.to_path_buf(),
        inner,
        line: 0,
        torn,
        torn_tail,
        finished: false,
    })
}

impl LineSource {
    /// The file this reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the next non-blank line as (line number, text without the newline).
    pub fn next_line(&mut self) -> Result<Option<(u64, String)>, IoError> {
        loop {
            if self.finished {
                return Ok(None);
            }
            let mut buf = Vec::new();
            let n = self.inner.read_until(b'\n', &mut buf).map_err(|source| {
                self.finished = true;
                if source.kind() == io::ErrorKind::UnexpectedEof || is_zstd_eof(&source) {
                    IoError::TruncatedStream {
                        path: self.path.clone(),
                        line: self.line,
                    }
                } else {
                    IoError::Read {
                        path: self.path.clone(),
                        line: self.line,
                        source,
                    }
                }
            })?;
            if n == 0 {
                self.finished = true;
                if let (Some((offset, len)), TornTail::Error) = (self.torn, self.torn_tail) {
                    return Err(IoError::Truncated {
                        path: self.path.clone(),
                        line: self.line,
                        offset,
                        len,
                    });
                }
                return Ok(None);
            }
            self.line += 1;
            if buf.last() != Some(&b'\n') {
                // A final line without newline: complete JSON is accepted (hand-written files).
                tracing::debug!(path = %self.path.display(), line = self.line, "last line has no newline");
            }
            let text = String::from_utf8(buf).map_err(|e| IoError::BadRecord {
                path: self.path.clone(),
                line: self.line,
                msg: format!("not UTF-8: {e}"),
            })?;
            if text.trim().is_empty() {
                continue;
            }
            return Ok(Some((self.line, text)));
        }
    }
}

fn is_zstd_eof(e: &io::Error) -> bool {
    // zstd reports a stream that ends inside a frame as "incomplete frame" / unexpected end.
    let msg = e.to_string().to_ascii_lowercase();
    msg.contains("incomplete") || msg.contains("unexpected end") || msg.contains("truncated")
}

/// Decompressed lines with their numbers, and the error that ended the input, if any.
type LineBatch = (Vec<(u64, String)>, Option<IoError>);

/// A streaming iterator of typed records. Bad records are skipped and counted unless
/// [`ReadOptions::strict`]; every error names the file and the record.
pub struct RecordReader<R: Record> {
    path: PathBuf,
    /// Batches of decompressed lines from the reading thread, which overlaps decompression with
    /// JSON parsing (measured in scripts/bench/io.sh); ends with the error that stopped it, if any.
    rx: std::sync::mpsc::Receiver<LineBatch>,
    opts: ReadOptions,
    queue: VecDeque<Result<R, IoError>>,
    skipped: u64,
    first_skip: Option<String>,
    done: bool,
    _marker: PhantomData<R>,
}

/// Opens `path` (or `-`) as records of type `R`.
pub fn open_records<R: Record>(path: &Path, opts: ReadOptions) -> Result<RecordReader<R>, IoError> {
    let mut lines = open_lines(path, opts.torn_tail)?;
    let (tx, rx) = std::sync::mpsc::sync_channel(2);
    std::thread::Builder::new()
        .name("lego-rl-read".into())
        .spawn(move || loop {
            let mut batch = Vec::new();
            let mut bytes = 0;
            let mut end = None;
            while batch.len() < BATCH_LINES && bytes < BATCH_BYTES {
                match lines.next_line() {
                    Ok(Some((line, text))) => {
                        bytes += text.len();
                        batch.push((line, text));
                    }
                    Ok(None) => {
                        end = Some(None);
                        break;
                    }
                    Err(e) => {
                        end = Some(Some(e));
                        break;
                    }
                }
            }
            let stop = end.is_some();
            if tx.send((batch, end.flatten())).is_err() || stop {
                return;
            }
        })
        .map_err(|source| IoError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(RecordReader {
        path: path.to_path_buf(),
        rx,
        opts,
        queue: VecDeque::new(),
        skipped: 0,
        first_skip: None,
        done: false,
        _marker: PhantomData,
    })
}

/// Reads every record of a file; bad records are skipped and counted (or fatal when strict).
pub fn read_all<R: Record>(path: &Path, opts: ReadOptions) -> Result<Vec<R>, IoError> {
    let mut reader = open_records::<R>(path, opts)?;
    let out = reader.by_ref().collect::<Result<Vec<R>, IoError>>()?;
    reader.warn_skipped();
    Ok(out)
}

/// Parses one line as `R`, with a schema check that explains misplaced files.
pub(crate) fn parse_record<R: Record>(path: &Path, line: u64, text: &str) -> Result<R, IoError> {
    let bad = |msg: String| IoError::BadRecord {
        path: path.to_path_buf(),
        line,
        msg,
    };
    match serde_json::from_str::<R>(text) {
        Ok(rec) => {
            check_schema::<R>(rec.schema()).map_err(|e| bad(e.to_string()))?;
            Ok(rec)
        }
        Err(e) => {
            // Prefer the schema explanation when the record is of another kind.
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
                match v.get("schema").and_then(|s| s.as_str()) {
                    Some(s) => check_schema::<R>(s).map_err(|se| bad(se.to_string()))?,
                    None => return Err(bad(format!("no `schema` field (expected `{}`)", R::SCHEMA))),
                }
            }
            Err(bad(e.to_string()))
        }
    }
}

impl<R: Record> RecordReader<R> {
    /// Bad records skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Logs a warning with the skip count, if any records were skipped.
    pub fn warn_skipped(&self) {
        if self.skipped > 0 {
            tracing::warn!(
                "{}: skipped {} bad record(s); first: {}",
                self.path.display(),
                self.skipped,
                self.first_skip.as_deref().unwrap_or("")
            );
        }
    }

    fn fill(&mut self) {
        match self.rx.recv() {
            Ok((batch, err)) => {
                let parsed = parse_batch::<R>(&self.path, batch);
                self.queue.extend(parsed);
                if let Some(e) = err {
                    self.queue.push_back(Err(e));
                    self.done = true;
                }
            }
            // The reading thread finished (end of input after its last batch).
            Err(_) => self.done = true,
        }
    }
}

fn parse_batch<R: Record>(path: &Path, batch: Vec<(u64, String)>) -> Vec<Result<R, IoError>> {
    if batch.len() < 16 {
        batch
            .iter()
            .map(|(line, text)| parse_record::<R>(path, *line, text))
            .collect()
    } else {
        batch
            .par_iter()
            .map(|(line, text)| parse_record::<R>(path, *line, text))
            .collect()
    }
}

impl<R: Record> Iterator for RecordReader<R> {
    type Item = Result<R, IoError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                match item {
                    Err(IoError::BadRecord { path, line, msg }) if !self.opts.strict => {
                        tracing::debug!("{}: record {line}: skipped: {msg}", path.display());
                        self.skipped += 1;
                        self.first_skip
                            .get_or_insert_with(|| format!("record {line}: {msg}"));
                        continue;
                    }
                    Err(e) => {
                        self.queue.clear();
                        self.done = true;
                        return Some(Err(e));
                    }
                    ok => return Some(ok),
                }
            }
            if self.done {
                return None;
            }
            self.fill();
        }
    }
}
