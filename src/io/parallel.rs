//! Parallel decompression of multi-frame zstd files.
//!
//! zstd frames are independent, so a file made of many frames can be decompressed on every
//! core at once; one streaming decoder is bounded by a single core (`zstd -dc` speed). On 2 cores
//! this does not pay (scripts/bench/io.sh: 0.94-0.97x the one-frame read, as JSON parsing already
//! takes the other core); it is for machines with more cores. [`super::AtomicWriter`] writes a
//! frame per ~4 MiB of records and [`super::AppendWriter`] a frame per commit, each declaring its
//! decompressed size, so lego-rl's own files qualify; a file of one streaming frame (the `zstd`
//! CLI, Python's stream writer, lego-rl before this) is read by the streaming decoder as before.
//!
//! [`ParallelDecoder`] is a plain [`BufRead`], so the line splitting, error mapping and torn-tail
//! handling of its users stay the same: a background thread cuts the frames into jobs of ~4 MiB
//! of output, decompresses a round of jobs at once ([`map_on_threads`]), and queues the outputs
//! in file order while the reader consumes the previous round.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use super::frames::{frame_at, FrameScan};

/// Frames that declare more than this are read by the streaming decoder instead: a job holds a
/// whole frame's output in memory.
pub const MAX_FRAME_CONTENT: u64 = 64 << 20;

/// Decompressed bytes per job (whole frames; a job closes once it reaches this).
const JOB_CONTENT: u64 = 4 << 20;

/// True when `scan`'s frames can be decompressed in parallel within bounded memory: more than
/// one frame, and every data frame declares a size of at most [`MAX_FRAME_CONTENT`].
pub fn applies(scan: &FrameScan) -> bool {
    scan.frames > 1 && scan.max_content.is_some_and(|m| m <= MAX_FRAME_CONTENT)
}

/// The decompressed bytes of `file`'s complete frames (up to `scan.complete_len`; a torn tail
/// is the caller's to report): decoded in parallel where [`applies`], else by one streaming
/// decoder from byte 0. The one place readers choose between the two.
pub fn decoder(mut file: File, scan: &FrameScan) -> io::Result<Box<dyn BufRead + Send>> {
    if applies(scan) {
        return Ok(Box::new(ParallelDecoder::new(file, scan)?));
    }
    file.seek(io::SeekFrom::Start(0))?;
    let limited = BufReader::with_capacity(1 << 20, file.take(scan.complete_len));
    Ok(Box::new(BufReader::with_capacity(
        1 << 20,
        zstd::Decoder::with_buffer(limited)?,
    )))
}

/// Decompressed bytes of the complete frames of a file, in order, decoded in parallel. A
/// [`BufRead`] over its own job buffers, so wrapping it in a `BufReader` only adds a copy.
pub struct ParallelDecoder {
    rx: Receiver<io::Result<Vec<u8>>>,
    /// Spent output buffers go back to the decoding thread, which reuses them: a fresh 4 MiB
    /// buffer per job would cost a page fault per 4 KiB page (as in `tasks::chunks`).
    back: SyncSender<Vec<u8>>,
    current: Vec<u8>,
    offset: usize,
    done: bool,
}

/// A run of whole frames: byte range and total declared size.
struct Job {
    start: u64,
    len: u64,
    content: u64,
}

impl ParallelDecoder {
    /// Decodes `file`'s frames from byte 0 up to `scan.complete_len` (the caller has checked
    /// [`applies`]). Bytes after that (a torn tail) are the caller's to report.
    pub fn new(file: File, scan: &FrameScan) -> io::Result<Self> {
        let end = scan.complete_len;
        let threads = round_size();
        // One round being decoded while up to a round of outputs waits for the reader.
        let (tx, rx) = sync_channel(threads);
        let (back, spent) = sync_channel::<Vec<u8>>(2 * threads + 1);
        std::thread::Builder::new()
            .name("lego-rl-unzstd".into())
            .spawn(move || {
                let mut pos = 0;
                loop {
                    let mut jobs = Vec::with_capacity(threads);
                    while jobs.len() < threads && pos < end {
                        match next_job(&file, pos, end) {
                            Ok(job) => {
                                pos = job.start + job.len;
                                jobs.push((job, spent.try_recv().unwrap_or_default()));
                            }
                            Err(e) => {
                                let _ = tx.send(Err(e));
                                return;
                            }
                        }
                    }
                    if jobs.is_empty() {
                        return;
                    }
                    let outs = map_on_threads(jobs, |(j, buf)| decode_job(&file, &j, buf));
                    for out in outs {
                        let failed = out.is_err();
                        if tx.send(out).is_err() || failed {
                            return;
                        }
                    }
                }
            })?;
        Ok(ParallelDecoder {
            rx,
            back,
            current: Vec::new(),
            offset: 0,
            done: false,
        })
    }
}

/// Whole frames from `pos` until their declared sizes reach [`JOB_CONTENT`].
fn next_job(file: &File, pos: u64, end: u64) -> io::Result<Job> {
    let mut job = Job {
        start: pos,
        len: 0,
        content: 0,
    };
    let mut at = pos;
    while at < end && job.content < JOB_CONTENT {
        // The scan walked these frames already; a frame that no longer parses means the file
        // changed under us.
        let frame = frame_at(file, at, end)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("zstd frame at byte {at} changed while reading"),
            )
        })?;
        job.content += frame.content.unwrap_or(0);
        at = frame.end;
    }
    job.len = at - pos;
    Ok(job)
}

/// Maps `f` over `items` in order, each on its own scoped thread (one item: on this thread).
///
/// Not on the rayon pool: the caller of a reader or writer is often a rayon worker itself
/// (`validate` checks files with `par_iter`), and workers blocked on a decoder's output while the
/// decoder waits for a free worker would deadlock. A thread per ~4 MiB job costs tens of
/// microseconds against milliseconds of zstd work.
pub(crate) fn map_on_threads<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.into_iter().map(f).collect();
    }
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = items.into_iter().map(|item| s.spawn(move || f(item))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    })
}

/// Jobs per round: the machine's parallelism, as rayon sees it (`RAYON_NUM_THREADS` limits it).
pub(crate) fn round_size() -> usize {
    rayon::current_num_threads().max(1)
}

/// Decodes `job` into `out` (a recycled buffer, or empty).
fn decode_job(file: &File, job: &Job, mut out: Vec<u8>) -> io::Result<Vec<u8>> {
    let mut compressed = vec![0u8; job.len as usize];
    file.read_exact_at(&mut compressed, job.start)?;
    out.clear();
    out.reserve(job.content as usize);
    // One call decodes every frame of the job into spare capacity of the declared size.
    zstd::bulk::Decompressor::new()?.decompress_to_buffer(&compressed[..], &mut out)?;
    if out.len() as u64 != job.content {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "zstd frames at bytes {}..{} decoded to {} bytes, their headers declare {}",
                job.start,
                job.start + job.len,
                out.len(),
                job.content
            ),
        ));
    }
    Ok(out)
}

impl BufRead for ParallelDecoder {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.offset == self.current.len() {
            if self.done {
                return Ok(&[]);
            }
            match self.rx.recv() {
                Ok(Ok(next)) => {
                    let spent = std::mem::replace(&mut self.current, next);
                    // The decoding thread may have finished; then the buffer is dropped.
                    let _ = self.back.try_send(spent);
                    self.offset = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                // The decoding thread finished after its last job.
                Err(_) => self.done = true,
            }
        }
        Ok(&self.current[self.offset..])
    }

    fn consume(&mut self, n: usize) {
        self.offset = (self.offset + n).min(self.current.len());
    }
}

impl Read for ParallelDecoder {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = buf.len().min(avail.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(frames: &[Vec<u8>]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        for fr in frames {
            f.write_all(fr).unwrap();
        }
        f
    }

    #[test]
    fn many_frames_decode_in_order_across_jobs() {
        // Frames of varied sizes, some larger than a job, lines split across frame boundaries.
        let text: Vec<u8> = (0..200_000)
            .flat_map(|i| format!("{{\"i\":{i}}}\n").into_bytes())
            .collect();
        let mut frames = Vec::new();
        let mut at = 0;
        let mut k = 0usize;
        while at < text.len() {
            let n = [1, 10_000, 5 << 20, 333_333][k % 4].min(text.len() - at);
            frames.push(zstd::bulk::compress(&text[at..at + n], 3).unwrap());
            at += n;
            k += 1;
        }
        // A skippable frame in the middle is skipped.
        let mut skip = vec![0x50, 0x2A, 0x4D, 0x18, 3, 0, 0, 0];
        skip.extend_from_slice(b"abc");
        frames.insert(2, skip);
        let file = file_of(&frames);
        let scan = super::super::frames::scan(&file, 0).unwrap();
        assert!(applies(&scan), "{scan:?}");
        let mut out = Vec::new();
        ParallelDecoder::new(file, &scan)
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, text);
    }

    #[test]
    fn a_corrupt_frame_is_an_error_after_the_good_ones() {
        let a = zstd::bulk::compress(&b"good\n".repeat(1_000_000), 3).unwrap();
        let data: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let mut b = zstd::bulk::compress(&data, 3).unwrap();
        // Declare one byte more than the frame holds: zstd detects the mismatch.
        let size = (data.len() as u32).to_le_bytes();
        let at = (0..14)
            .find(|&i| b[i..i + 4] == size)
            .expect("4-byte content size field");
        b[at..at + 4].copy_from_slice(&(data.len() as u32 + 1).to_le_bytes());
        let file = file_of(&[a, b]);
        let scan = super::super::frames::scan(&file, 0).unwrap();
        assert!(applies(&scan));
        let mut dec = ParallelDecoder::new(file, &scan).unwrap();
        let mut out = vec![0u8; 5_000_000];
        let mut got = 0;
        let err = loop {
            match dec.read(&mut out[got..]) {
                Ok(0) => panic!("the corrupt frame decoded"),
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert_eq!(got, 5_000_000, "the good frame came first, whole");
        assert!(!err.to_string().is_empty());
    }

    #[test]
    fn streaming_or_single_frames_do_not_apply() {
        let one = file_of(&[zstd::bulk::compress(b"x\n", 3).unwrap()]);
        assert!(!applies(&super::super::frames::scan(&one, 0).unwrap()));
        let mut enc = zstd::Encoder::new(Vec::new(), 3).unwrap();
        enc.write_all(b"y\n").unwrap();
        let streamed = enc.finish().unwrap();
        let two = file_of(&[streamed.clone(), streamed]);
        assert!(!applies(&super::super::frames::scan(&two, 0).unwrap()));
    }
}
