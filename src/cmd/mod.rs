//! One module per subcommand: its `#[derive(Args)]` struct and a thin `run` that resolves the
//! arguments and calls into the library. `cli` dispatches to them; nothing here points back.

pub mod align;
pub mod build_images;
pub mod env;
pub mod filter_tasks;
pub mod generate_docs;
pub mod gpu_probe;
pub mod report;
pub mod rollout;
pub mod train_step;
pub mod validate;

/// How a subcommand that ran to completion ended: 0 ok, 1 ran but found failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Failures,
}

impl From<Outcome> for std::process::ExitCode {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Ok => std::process::ExitCode::SUCCESS,
            Outcome::Failures => std::process::ExitCode::from(1),
        }
    }
}

/// True when the error is a broken pipe on stdout (e.g. `lego-rl ... | head`), which exits 0.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || e.downcast_ref::<crate::io::IoError>().is_some_and(|io| match io {
                crate::io::IoError::Write { source, .. } => source.kind() == std::io::ErrorKind::BrokenPipe,
                _ => false,
            })
    })
}

/// A `hint:` line for errors where one helps.
pub fn hint(err: &anyhow::Error) -> Option<String> {
    for e in err.chain() {
        if let Some(crate::io::IoError::Truncated { .. }) = e.downcast_ref::<crate::io::IoError>() {
            return Some(
                "if the writer is still running, wait for it; if it crashed, re-running it in append mode cuts the torn frame"
                    .into(),
            );
        }
    }
    None
}

/// The error and its causes on one line, `a: b: c`, leaving out a cause whose text the message
/// before it already ends with (our errors name their source in their own text, so anyhow's
/// `{:#}` would print "No such file or directory (os error 2)" twice).
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_already_in_the_message_is_said_once() {
        let open = crate::io::IoError::Open {
            path: "/nonexistent".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let err = anyhow::Error::new(open).context("aligning into out.jsonl.zst");
        assert_eq!(
            error_line(&err),
            "aligning into out.jsonl.zst: /nonexistent: cannot open: entity not found"
        );
        // A cause the message does not repeat is kept.
        let err = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_line(&err), "outer: inner");
    }
}
