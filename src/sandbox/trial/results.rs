//! The grading script's run for the result channel ([`crate::grade::channel`]): root's shell
//! around the test user's script, with the FIFO the grader's pytest plugin writes to and the root
//! process that keeps what it wrote.

use crate::sandbox::AGENT_USER;
use crate::text::sh_quote;

/// The root-only directory of the result stream ([`channel`]): its FIFO and the reader's copy.
pub(super) const RESULTS: &str = "/var/lib/lego-rl-results";

/// Which parts of the result channel a grading run has (each a defence the tests switch off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Wrap {
    /// The FIFO on descriptor 3 and root's copy of it.
    pub channel: bool,
    /// A per-grading key on descriptor 4 (see [`crate::grade::channel::KEY_FD_ENV`]).
    pub keyed: bool,
    /// The test user's commands under the no-ptrace filter ([`super::noptrace`]).
    pub no_ptrace: bool,
}

/// Root's shell around the grading `script`, which runs as the agent user with `3` the write end of
/// the result FIFO (`channel`: else no stream); a root `cat` copies the FIFO to a root-only file.
/// With `keyed`, root draws a random key, keeps it in a root-only file and hands it to the plugin
/// as the only content of a pipe on descriptor 4 (its writer, root's, has exited when the script
/// starts); the key is in no command line and no environment. When the script is done, every
/// process of the agent user is killed (so the FIFO's last writer is gone) and the copy is waited
/// for. Exits with the script's status.
pub(super) fn grading_wrapper(script: &str, w: Wrap) -> String {
    let as_agent = format!("setpriv --reuid={AGENT_USER} --regid={AGENT_USER} --init-groups --");
    let (open, close) = if w.channel {
        let key = if w.keyed {
            format!(
                "K=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'); printf '%s' \"$K\" > {RESULTS}/key; \
                 exec 4< <(printf '%s\\n' \"$K\"); K=; "
            )
        } else {
            String::new()
        };
        (
            format!(
                "rm -rf {RESULTS}; mkdir -m 700 -p {RESULTS}; mkfifo -m 600 {RESULTS}/fifo; {key}\
                 cat {RESULTS}/fifo > {RESULTS}/stream & C=$!; exec 3>{RESULTS}/fifo; "
            ),
            "exec 3>&- 4<&-; ".to_string(),
        )
    } else {
        ("C=; ".to_string(), String::new())
    };
    let filter = if w.no_ptrace {
        super::noptrace::prefix()
    } else {
        String::new()
    };
    format!(
        "{open}{filter}{as_agent} env HOME=/home/{AGENT_USER} USER={AGENT_USER} LOGNAME={AGENT_USER} bash -c {}; rc=$?; \
         {close}{as_agent} bash -c 'kill -KILL -1' 2>/dev/null; [ -z \"$C\" ] || wait $C; exit $rc",
        sh_quote(script)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_runs_as_the_agent_and_root_keeps_the_stream() {
        let all = Wrap {
            channel: true,
            keyed: true,
            no_ptrace: true,
        };
        let w = grading_wrapper("echo 'hi'", all);
        assert!(w.contains("mkfifo -m 600 /var/lib/lego-rl-results/fifo"), "{w}");
        assert!(
            w.contains("> /var/lib/lego-rl-results/key; exec 4< <(printf"),
            "{w}"
        );
        assert!(
            w.contains("exec 3>/var/lib/lego-rl-results/fifo; python3 -I -c"),
            "{w}"
        );
        assert!(w.contains(
            "exec 3>&- 4<&-; setpriv --reuid=agent --regid=agent --init-groups -- bash -c 'kill -KILL -1'"
        ));
        assert!(w.ends_with("wait $C; exit $rc"), "{w}");
        let w = grading_wrapper(
            "true",
            Wrap {
                channel: false,
                keyed: false,
                no_ptrace: false,
            },
        );
        assert!(!w.contains("fifo") && w.starts_with("C=; setpriv"), "{w}");
    }
}
