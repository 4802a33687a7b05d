//! The grading script's run for the result channel ([`crate::grade::channel`]): root's shell
//! around the test user's script, with the FIFO the grader's pytest plugin writes to and the root
//! process that keeps what it wrote.

use crate::sandbox::AGENT_USER;
use crate::text::sh_quote;

/// The root-only directory of the result stream ([`channel`]): its FIFO and the reader's copy.
pub(super) const RESULTS: &str = "/var/lib/lego-rl-results";

/// Root's shell around the grading `script`, which runs as the agent user with `3` the write end of
/// the result FIFO (`channel`: else no stream); a root `cat` copies the FIFO to a root-only file.
/// When the script is done, every process of the agent user is killed (so the FIFO's last writer
/// is gone) and the copy is waited for. Exits with the script's status.
pub(super) fn grading_wrapper(script: &str, channel: bool) -> String {
    let as_agent = format!("setpriv --reuid={AGENT_USER} --regid={AGENT_USER} --init-groups --");
    let (open, close) = if channel {
        (
            format!(
                "rm -rf {RESULTS}; mkdir -m 700 -p {RESULTS}; mkfifo -m 600 {RESULTS}/fifo; \
                 cat {RESULTS}/fifo > {RESULTS}/stream & C=$!; exec 3>{RESULTS}/fifo; "
            ),
            "exec 3>&-; ".to_string(),
        )
    } else {
        ("C=; ".to_string(), String::new())
    };
    format!(
        "{open}{as_agent} env HOME=/home/{AGENT_USER} USER={AGENT_USER} LOGNAME={AGENT_USER} bash -c {}; rc=$?; \
         {close}{as_agent} bash -c 'kill -KILL -1' 2>/dev/null; [ -z \"$C\" ] || wait $C; exit $rc",
        sh_quote(script)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_runs_as_the_agent_and_root_keeps_the_stream() {
        let w = grading_wrapper("echo 'hi'", true);
        assert!(w.contains("mkfifo -m 600 /var/lib/lego-rl-results/fifo"), "{w}");
        assert!(
            w.contains("exec 3>/var/lib/lego-rl-results/fifo; setpriv --reuid=agent"),
            "{w}"
        );
        assert!(w.contains(
            "exec 3>&-; setpriv --reuid=agent --regid=agent --init-groups -- bash -c 'kill -KILL -1'"
        ));
        assert!(w.ends_with("wait $C; exit $rc"), "{w}");
        let w = grading_wrapper("true", false);
        assert!(!w.contains("fifo") && w.starts_with("C=; setpriv"), "{w}");
    }
}
