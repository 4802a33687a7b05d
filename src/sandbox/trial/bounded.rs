//! Bounded reads of what a trial's test user could write: every result file root reads from the
//! evaluation container (junit.xml, Harbor's reward files) is read through here, so that no trial
//! can make the host process read more than a fixed cap (a sparse 1 TiB file, a symlink to
//! `/dev/zero`, a FIFO that never ends).
//!
//! In the container, as root, after every process of the test user is dead (so nothing swaps the
//! file between the checks and the read): a symlink or anything but a regular file is refused
//! without being opened; a regular file whose size is over the cap is refused by its size; the read
//! itself is `dd iflag=nofollow` (`O_NOFOLLOW`) of at most cap + 1 bytes, so even a file that grew
//! after the check cannot send more. The host checks the length once more.

use std::time::Duration;

use super::Trial;
use crate::records::AuditEvent;
use crate::sandbox::SandboxError;
use crate::text::sh_quote;

/// The most of junit.xml read (a suite of tens of thousands of tests writes a few MiB).
pub(super) const JUNIT_CAP: u64 = 32 << 20;
/// The most of a Harbor reward file read (a number, or a small JSON object).
pub(super) const REWARD_CAP: u64 = 1 << 20;

/// What a bounded read found.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Read {
    Absent,
    Text(String),
    /// A symlink, a non-regular file or a file over the cap: never read.
    Refused(String),
}

/// The shell that reads `path` (see the module doc); its first line is `LEGO_READ=<verdict>`.
pub(super) fn script(path: &str, cap: u64) -> String {
    let f = sh_quote(path);
    format!(
        "f={f}; if [ -L \"$f\" ]; then echo 'LEGO_READ=a symlink'; \
         elif [ ! -e \"$f\" ]; then echo LEGO_READ=absent; \
         elif [ ! -f \"$f\" ]; then echo 'LEGO_READ=not a regular file'; \
         else s=$(stat -c %s -- \"$f\"); \
         if [ \"$s\" -gt {cap} ]; then echo \"LEGO_READ=$s bytes, over the cap of {cap}\"; \
         else echo LEGO_READ=ok; dd if=\"$f\" iflag=nofollow,count_bytes bs=65536 count={} status=none; fi; fi",
        cap + 1
    )
}

/// Parses [`script`]'s output.
pub(super) fn parse(stdout: &str, cap: u64) -> Read {
    let (first, rest) = stdout.split_once('\n').unwrap_or((stdout, ""));
    match first.strip_prefix("LEGO_READ=") {
        Some("absent") => Read::Absent,
        Some("ok") if rest.len() as u64 > cap => Read::Refused(format!("over the cap of {cap} bytes")),
        Some("ok") => Read::Text(rest.to_string()),
        Some(why) => Read::Refused(why.to_string()),
        None => Read::Refused(format!("unreadable: {first:?}")),
    }
}

/// The `result_tampering` event of a refused result file.
pub(super) fn refused_event(kind: &str, path: &str, why: &str) -> AuditEvent {
    AuditEvent {
        kind: kind.into(),
        detail: format!("{path}: {why}; not read (reward 0)"),
        generation: None,
    }
}

impl Trial {
    /// Reads `path` in container `id` with [`script`], as root.
    pub(super) async fn read_bounded(&self, id: &str, path: &str, cap: u64) -> Result<Read, SandboxError> {
        let out = self
            .engine
            .exec(id, "root", "/", &[], &script(path, cap), Duration::from_secs(60))
            .await?;
        Ok(parse(&out.stdout, cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(path: &str, cap: u64) -> Read {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(script(path, cap))
            .output()
            .expect("bash");
        parse(&String::from_utf8_lossy(&out.stdout), cap)
    }

    #[test]
    fn symlinks_special_files_and_big_files_are_never_read() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = |n: &str| dir.path().join(n).display().to_string();
        std::fs::write(p("ok.txt"), "1\n").expect("write");
        assert_eq!(run(&p("ok.txt"), 10), Read::Text("1\n".into()));
        assert_eq!(run(&p("none.txt"), 10), Read::Absent);
        std::os::unix::fs::symlink("/dev/zero", p("zero")).expect("symlink");
        assert_eq!(run(&p("zero"), 10), Read::Refused("a symlink".into()));
        assert_eq!(run("/dev/zero", 10), Read::Refused("not a regular file".into()));
        // A sparse file far over the cap: refused by its size, nothing read.
        let f = std::fs::File::create(p("sparse")).expect("create");
        f.set_len(1 << 40).expect("sparse");
        assert!(
            matches!(run(&p("sparse"), 10), Read::Refused(ref w) if w.contains("over the cap")),
            "{:?}",
            run(&p("sparse"), 10)
        );
        std::fs::write(p("eleven"), "01234567890").expect("write");
        assert!(matches!(run(&p("eleven"), 10), Read::Refused(_)));
        assert!(matches!(parse("LEGO_READ=ok\n01234567890", 10), Read::Refused(_)));
    }
}
