//! A minimal tar (ustar + GNU long-name) writer for build contexts and uploads into containers.
//!
//! The Docker API takes build contexts and `PUT /archive` bodies as tar streams; the files involved
//! are small (a Dockerfile, a git bundle, a diff, a tests folder), so an in-memory writer of regular
//! files and directories is all that is needed, and avoids a dependency.

use std::path::Path;

/// An in-memory tar archive under construction.
#[derive(Default)]
pub struct TarBuilder {
    buf: Vec<u8>,
}

fn octal(field: &mut [u8], value: u64) {
    let s = format!("{:0width$o}", value, width = field.len() - 1);
    field[..s.len()].copy_from_slice(s.as_bytes());
    field[field.len() - 1] = 0;
}

impl TarBuilder {
    /// An empty archive.
    pub fn new() -> Self {
        Self::default()
    }

    fn header(&mut self, name: &str, size: u64, mode: u32, kind: u8) {
        if name.len() > 99 {
            // GNU long name: a pseudo-entry `././@LongLink` whose data is the name.
            let mut long = name.as_bytes().to_vec();
            long.push(0);
            self.raw_header("././@LongLink", long.len() as u64, 0o644, b'L');
            self.data(&long);
        }
        let short: String = name.chars().take(99).collect();
        self.raw_header(&short, size, mode, kind);
    }

    fn raw_header(&mut self, name: &str, size: u64, mode: u32, kind: u8) {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        octal(&mut h[100..108], u64::from(mode));
        octal(&mut h[108..116], 0);
        octal(&mut h[116..124], 0);
        octal(&mut h[124..136], size);
        octal(&mut h[136..148], 0);
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        let s = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(s.as_bytes());
        self.buf.extend_from_slice(&h);
    }

    fn data(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        let pad = (512 - bytes.len() % 512) % 512;
        self.buf.extend(std::iter::repeat_n(0u8, pad));
    }

    /// Adds a regular file.
    pub fn file(&mut self, name: &str, bytes: &[u8], mode: u32) -> &mut Self {
        self.header(name, bytes.len() as u64, mode, b'0');
        self.data(bytes);
        self
    }

    /// Adds a directory entry.
    pub fn dir(&mut self, name: &str) -> &mut Self {
        let n = format!("{}/", name.trim_end_matches('/'));
        self.header(&n, 0, 0o755, b'5');
        self
    }

    /// Adds the files under `dir` (recursively, sorted, symlinks skipped) below `prefix`.
    pub fn dir_tree(&mut self, dir: &Path, prefix: &str) -> std::io::Result<&mut Self> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let full = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let ft = e.file_type()?;
            if ft.is_dir() {
                self.dir(&full);
                self.dir_tree(&e.path(), &full)?;
            } else if ft.is_file() {
                let bytes = std::fs::read(e.path())?;
                let mode = executable_mode(&e.path());
                self.file(&full, &bytes, mode);
            }
        }
        Ok(self)
    }

    /// The finished archive (two zero blocks appended).
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.extend(std::iter::repeat_n(0u8, 1024));
        self.buf
    }
}

fn executable_mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if m.permissions().mode() & 0o111 != 0 => 0o755,
        _ => 0o644,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_tar_reads_our_archive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let long = format!("d/{}.txt", "x".repeat(120));
        let mut t = TarBuilder::new();
        t.dir("d")
            .file("d/a.txt", b"hello\n", 0o644)
            .file(&long, b"long", 0o755);
        let path = dir.path().join("a.tar");
        std::fs::write(&path, t.finish()).expect("write");
        let out = std::process::Command::new("tar")
            .args(["-xf", "a.tar"])
            .current_dir(dir.path())
            .status()
            .expect("tar runs");
        assert!(out.success());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("d/a.txt")).expect("a"),
            "hello\n"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join(&long)).expect("long"),
            "long"
        );
    }
}
