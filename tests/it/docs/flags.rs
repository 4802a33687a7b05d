//! Finds the flags the docs name and checks them against clap's own definition of the CLI.
//!
//! It reads what a reader copies: the code spans and code blocks of the Markdown files, and the
//! example lines and backquoted spans of the generated man pages, where `--flag VALUE`,
//! `--flag=VALUE` and `--flag a|b|c` give values; in prose (the rest of a man page, a code block's
//! `#` comment) only a flag's name is checked. A value must be one of the flag's possible values
//! or parse with its value parser; a placeholder (`N`, `CKPT_DIR`, `embedded:CKPT`, `i/n`) that
//! does not parse is skipped. After `lego-rl SUB` (or a bare `SUB` in code) a flag must be one of
//! that subcommand's; with no command before it, one of some subcommand's. Other programs' flags
//! are told apart by the command before them ([`FOREIGN_COMMANDS`]; a project script's flags must
//! appear in that script) or, when named alone, by [`FOREIGN_FLAGS`].

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Command};

use super::{Owner, FOREIGN_COMMANDS, FOREIGN_FLAGS};

/// The CLI as clap sees it, built so that global flags and `--help` are in every subcommand.
pub(super) fn cli() -> Command {
    let mut cli = <lego_rl::cli::Cli as clap::CommandFactory>::command();
    cli.build();
    cli
}

/// The project's scripts (`scripts/`, `examples/`) with their text.
pub(super) fn scripts(root: &Path) -> Vec<(PathBuf, String)> {
    ["scripts", "examples"]
        .iter()
        .flat_map(|d| walk(root, d))
        .filter(|p| p.extension().is_some_and(|e| e == "sh" || e == "py"))
        .map(|p| {
            let text = std::fs::read_to_string(root.join(&p)).unwrap();
            (p, text)
        })
        .collect()
}

/// The files a reader goes to for flags: README.md, man/ (hand-written and generated pages) and
/// every README under examples/.
pub(super) fn doc_files(root: &Path) -> Vec<PathBuf> {
    let man = walk(root, "man").into_iter();
    let man = man.filter(|p| p.parent() == Some(Path::new("man")));
    let man = man.filter(|p| p.extension().is_some_and(|e| e == "md" || e == "1"));
    let examples = walk(root, "examples")
        .into_iter()
        .filter(|p| p.ends_with("README.md"));
    let files: Vec<PathBuf> = std::iter::once(PathBuf::from("README.md"))
        .chain(man)
        .chain(examples)
        .collect();
    assert!(files.len() >= 12, "{files:?}");
    files
}

/// Every file under `root/dir`, relative to `root`, sorted.
fn walk(root: &Path, dir: &str) -> Vec<PathBuf> {
    crate::common::files_under(&root.join(dir))
        .into_iter()
        .map(|p| Path::new(dir).join(p))
        .collect()
}

/// Whose flags the words being read are.
#[derive(Clone, Copy)]
enum Context<'a> {
    /// No command named yet: a flag of any subcommand.
    Any,
    /// After `lego-rl` (the root command) or `lego-rl SUB`.
    Lego(&'a Command),
    /// After a project script (its index in the scripts).
    Script(usize),
    /// After another program ([`FOREIGN_COMMANDS`]).
    Foreign,
    /// After a script that is not in this checkout.
    Unknown,
}

/// Code (values are checked) or prose (names only, and the subcommand is a hint).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Code,
    Prose,
}

pub(super) struct Checker<'a> {
    cli: &'a Command,
    scripts: &'a [(PathBuf, String)],
    pub(super) failures: Vec<String>,
    pub(super) mentions: usize,
    used_commands: BTreeSet<usize>,
    used_flags: BTreeSet<usize>,
}

impl<'a> Checker<'a> {
    pub(super) fn new(cli: &'a Command, scripts: &'a [(PathBuf, String)]) -> Self {
        let (used_commands, used_flags) = (BTreeSet::new(), BTreeSet::new());
        Checker {
            cli,
            scripts,
            failures: Vec::new(),
            mentions: 0,
            used_commands,
            used_flags,
        }
    }

    /// A Markdown file: fenced code blocks command by command (`\` continues a command on the
    /// next line), and the code spans of every other paragraph (a span may wrap onto the next
    /// line). Markdown prose is not read: a reader copies flags from code.
    pub(super) fn markdown(&mut self, file: &str, text: &str) {
        let (mut fence, mut para, mut command) = (None, Vec::new(), Vec::new());
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
            match (fence, marker) {
                (Some(open), Some(m)) if m == open => {
                    fence = None;
                    self.code(file, &Lines::new(&std::mem::take(&mut command)));
                }
                (Some(_), _) => {
                    command.push((i + 1, line.strip_suffix('\\').unwrap_or(line)));
                    if !line.ends_with('\\') {
                        self.code(file, &Lines::new(&std::mem::take(&mut command)));
                    }
                }
                (None, Some(m)) => {
                    self.paragraph(file, &Lines::new(&std::mem::take(&mut para)), false);
                    fence = Some(m);
                }
                (None, None) if trimmed.is_empty() => {
                    self.paragraph(file, &Lines::new(&std::mem::take(&mut para)), false)
                }
                (None, None) => para.push((i + 1, line)),
            }
        }
        self.paragraph(file, &Lines::new(&para), false);
    }

    /// A generated man page (roff): example commands (`lego-rl SUB ...` and their `\`
    /// continuations) are code; other text is prose, with its backquoted spans as code.
    pub(super) fn roff(&mut self, file: &str, text: &str) {
        let lines: Vec<(bool, String)> = text.lines().map(|l| (l.starts_with('.'), unroff(l))).collect();
        let (mut para, mut command) = (Vec::new(), Vec::new());
        for (i, (request, line)) in lines.iter().enumerate() {
            let line = line.trim_end();
            if !command.is_empty() || line.trim_start().starts_with("lego-rl ") {
                command.push((i + 1, line.strip_suffix('\\').unwrap_or(line)));
                if !line.ends_with('\\') {
                    self.code(file, &Lines::new(&std::mem::take(&mut command)));
                }
            } else if !request {
                para.push((i + 1, line));
                continue;
            }
            self.paragraph(file, &Lines::new(&std::mem::take(&mut para)), true);
        }
        self.paragraph(file, &Lines::new(&para), true);
    }

    /// A command of a code block; from a ` #` on, a comment (prose).
    fn code(&mut self, file: &str, cmd: &Lines) {
        let text = &cmd.text;
        let cut = if text.trim_start().starts_with('#') {
            0
        } else {
            text.find(" #").unwrap_or(text.len())
        };
        let ctx = self.words(file, cmd, 0..cut, Mode::Code, Context::Any);
        self.words(file, cmd, cut..text.len(), Mode::Prose, ctx);
    }

    /// A paragraph: each code span is read as code on its own; the text between them as prose
    /// when `prose` is set. A span opens with a run of backquotes and closes with the next run of
    /// the same length; an opening run that never closes is plain text.
    fn paragraph(&mut self, file: &str, para: &Lines, prose: bool) {
        let runs = backquote_runs(&para.text);
        let (mut ctx, mut plain, mut i) = (Context::Any, 0, 0);
        while i < runs.len() {
            let (open, len) = runs[i];
            let Some(j) = (i + 1..runs.len()).find(|&j| runs[j].1 == len) else {
                i += 1;
                continue;
            };
            if prose {
                ctx = self.words(file, para, plain..open, Mode::Prose, ctx);
            }
            self.words(file, para, open + len..runs[j].0, Mode::Code, Context::Any);
            plain = runs[j].0 + len;
            i = j + 1;
        }
        if prose {
            self.words(file, para, plain..para.text.len(), Mode::Prose, ctx);
        }
    }

    /// Reads the words of `lines.text[range]` from context `ctx`, checking each flag mention;
    /// command words (`lego-rl`, a subcommand, a script, another program) move the context along.
    /// Returns the context at the end.
    fn words(
        &mut self,
        file: &str,
        lines: &Lines,
        range: Range<usize>,
        mode: Mode,
        mut ctx: Context<'a>,
    ) -> Context<'a> {
        let text = &lines.text[range.clone()];
        let at = |w: &str| {
            format!(
                "{file}:{}",
                lines.line_at(range.start + (w.as_ptr() as usize - text.as_ptr() as usize))
            )
        };
        let mut words = text
            .split_whitespace()
            .map(strip)
            .filter(|w| !w.is_empty())
            .peekable();
        // In prose another program's flags follow its name at once (`srun --nodes M lego-rl`): two
        // plain words in a row (`torchrun or srun (RANK, ...`) end its context.
        let (mut outer, mut plain) = (ctx, false);
        while let Some(word) = words.next() {
            let was_plain = std::mem::replace(&mut plain, !word.starts_with('-'));
            if let (Context::Foreign, Mode::Prose, true, true) = (ctx, mode, plain, was_plain) {
                ctx = outer;
            }
            if let Some(mut rest) = word.strip_prefix("--") {
                // `--eval/--compare` names two flags.
                while let Some((name, inline, tail)) = split_flag(rest) {
                    let next =
                        inline.or_else(|| words.peek().copied().filter(|w| tail.is_empty() && is_value(w)));
                    if self.long(&at(word), ctx, mode, name, next) && inline.is_none() && next.is_some() {
                        words.next();
                    }
                    rest = tail
                        .strip_prefix("/--")
                        .or(tail.strip_prefix("|--"))
                        .unwrap_or("");
                }
            } else if let Some(short) = word
                .strip_prefix('-')
                .and_then(|s| s.parse::<char>().ok())
                .filter(char::is_ascii_alphabetic)
            {
                if let (Context::Lego(cmd), Mode::Code) = (ctx, mode) {
                    let next = words.peek().copied().filter(|w| is_value(w));
                    if self.short(&at(word), cmd, short, next) {
                        words.next();
                    }
                }
            } else if word == "lego-rl" || word.ends_with("/lego-rl") {
                ctx = Context::Lego(self.cli);
            } else if let Some(sub) = self
                .cli
                .get_subcommands()
                .find(|c| c.get_name() == word && word != "help")
            {
                // In prose `report` or `align` is as often a verb: only `lego-rl SUB` counts.
                let after_lego = matches!(ctx, Context::Lego(c) if std::ptr::eq(c, self.cli));
                if mode == Mode::Code || after_lego {
                    ctx = Context::Lego(sub);
                }
            } else if let Some(i) = FOREIGN_COMMANDS.iter().position(|(c, _)| is_program(word, c)) {
                self.used_commands.insert(i);
                (outer, ctx) = (ctx, Context::Foreign);
            } else if word.ends_with(".sh") || word.ends_with(".py") {
                ctx = self.script(file, word).map_or(Context::Unknown, Context::Script);
            }
        }
        ctx
    }

    /// The project script a word names: a path from the checkout's root or the document's
    /// directory, else the one script with that file name.
    fn script(&self, file: &str, word: &str) -> Option<usize> {
        let word = word.trim_start_matches("./");
        let dir = Path::new(file).parent().unwrap_or(Path::new(""));
        let by_path = |p: &Path| self.scripts.iter().position(|(s, _)| s == p);
        by_path(Path::new(word))
            .or_else(|| by_path(&dir.join(word)))
            .or_else(|| {
                let name = Path::new(word).file_name()?;
                let mut same = self
                    .scripts
                    .iter()
                    .enumerate()
                    .filter(|(_, (s, _))| s.file_name() == Some(name));
                match (same.next(), same.next()) {
                    (Some((i, _)), None) => Some(i),
                    _ => None,
                }
            })
    }

    /// Checks one long flag and, in code, its value; returns whether the flag takes a value
    /// (so that `value`, when it came from the next word, was its value).
    fn long(&mut self, at: &str, ctx: Context<'a>, mode: Mode, name: &str, value: Option<&str>) -> bool {
        let flag = format!("--{name}");
        let shown = value
            .filter(|_| mode == Mode::Code)
            .map_or(format!("`{flag}`"), |v| format!("`{flag} {v}`"));
        self.mentions += 1;
        let scope: Vec<&Command> = match ctx {
            Context::Foreign => return false,
            Context::Unknown => {
                self.failures.push(format!(
                    "{at}: {shown}: after a script that is not in this checkout"
                ));
                return false;
            }
            Context::Script(i) => {
                let (path, text) = &self.scripts[i];
                if !names_flag(text, &flag) {
                    self.failures
                        .push(format!("{at}: {shown}: {} has no such flag", path.display()));
                }
                return false;
            }
            Context::Lego(cmd) => vec![cmd],
            Context::Any => self.cli.get_subcommands().collect(),
        };
        let mut found = args(&scope, |a| a.get_long() == Some(name));
        if found.is_empty() && mode == Mode::Prose {
            found = args(&self.cli.get_subcommands().collect::<Vec<_>>(), |a| {
                a.get_long() == Some(name)
            });
        }
        if found.is_empty() {
            let foreign = FOREIGN_FLAGS.iter().position(|(f, _)| *f == flag);
            match (ctx, foreign) {
                (Context::Lego(cmd), _) if mode == Mode::Code => {
                    self.failures
                        .push(format!("{at}: `{flag}` is no flag of `{}`", cmd.get_name()));
                }
                (_, Some(i)) => _ = self.used_flags.insert(i),
                _ => self
                    .failures
                    .push(format!("{at}: `{flag}`: no lego-rl subcommand has this flag")),
            }
            return false;
        }
        let takes = found.iter().any(|(_, a)| a.get_action().takes_values());
        if let Some(value) = value.filter(|_| takes && mode == Mode::Code) {
            // A `|` inside a span of a GitHub table is written `\|`.
            let value = &value.replace("\\|", "|");
            let errors: Vec<String> = found
                .iter()
                .filter_map(|(c, a)| check_value(c, a, value).err())
                .collect();
            if errors.len() == found.len() {
                self.failures
                    .push(format!("{at}: {shown}: {}", errors.join("; ")));
            }
        }
        takes
    }

    /// Checks a short flag of `cmd` and its value; returns whether it takes a value.
    fn short(&mut self, at: &str, cmd: &Command, short: char, value: Option<&str>) -> bool {
        self.mentions += 1;
        let Some(arg) = cmd.get_arguments().find(|a| a.get_short() == Some(short)) else {
            self.failures
                .push(format!("{at}: `-{short}` is no flag of `{}`", cmd.get_name()));
            return false;
        };
        let takes = arg.get_action().takes_values();
        if let Some(value) = value.filter(|_| takes) {
            if let Err(e) = check_value(cmd, arg, value) {
                self.failures.push(format!("{at}: `-{short} {value}`: {e}"));
            }
        }
        takes
    }

    /// Every allow-list entry is used, and a script's flag is still in the script.
    pub(super) fn check_allow_lists(&mut self) {
        for (i, (c, _)) in FOREIGN_COMMANDS.iter().enumerate() {
            if !self.used_commands.contains(&i) {
                self.failures
                    .push(format!("FOREIGN_COMMANDS: no mention of {c} is left"));
            }
        }
        for (i, (flag, owner)) in FOREIGN_FLAGS.iter().enumerate() {
            if !self.used_flags.contains(&i) {
                self.failures
                    .push(format!("FOREIGN_FLAGS: no mention of {flag} is left"));
            }
            if let Owner::Script(path) = owner {
                let script = self.scripts.iter().find(|(p, _)| p == Path::new(path));
                if !script.is_some_and(|(_, text)| names_flag(text, flag)) {
                    self.failures.push(format!("FOREIGN_FLAGS: {path} has no {flag}"));
                }
            }
        }
    }
}

/// Lines of a document joined into one text (a paragraph, a command and its continuations), with
/// the line number each starts at.
struct Lines {
    text: String,
    starts: Vec<(usize, usize)>,
}

impl Lines {
    fn new(lines: &[(usize, &str)]) -> Self {
        let (mut text, mut starts) = (String::new(), Vec::new());
        for (n, l) in lines {
            starts.push((text.len(), *n));
            text.push_str(l);
            text.push('\n');
        }
        Lines { text, starts }
    }

    fn line_at(&self, pos: usize) -> usize {
        self.starts
            .iter()
            .rev()
            .find(|(s, _)| *s <= pos)
            .map_or(0, |(_, n)| *n)
    }
}

/// The arguments of `cmds` that `pick` accepts, with their command.
fn args<'c>(cmds: &[&'c Command], pick: impl Fn(&Arg) -> bool) -> Vec<(&'c Command, &'c Arg)> {
    cmds.iter()
        .flat_map(|c| c.get_arguments().filter(|a| pick(a)).map(move |a| (*c, a)))
        .collect()
}

/// Whether `arg` of `cmd` accepts `value`: each of `a|b|c` (and each item of a delimited list)
/// must be a possible value or parse with the argument's value parser; a placeholder that does
/// not is let through.
fn check_value(cmd: &Command, arg: &Arg, value: &str) -> Result<(), String> {
    let delimiter = arg.get_value_delimiter();
    let items = value.split('|').flat_map(|v| match delimiter {
        Some(d) => v.split(d).collect(),
        None => vec![v],
    });
    for item in items {
        let possible = arg.get_possible_values();
        let refused = if !possible.is_empty() {
            let names: Vec<&str> = possible
                .iter()
                .filter(|p| !p.is_hide_set())
                .map(|p| p.get_name())
                .collect();
            (!possible.iter().any(|p| p.matches(item, arg.is_ignore_case_set())))
                .then(|| format!("not one of {}", names.join(", ")))
        } else {
            parse(cmd, arg, item).err()
        };
        if let Some(why) = refused.filter(|_| !is_placeholder(item)) {
            return Err(why);
        }
    }
    Ok(())
}

/// Parses `value` with `arg`'s value parser, through a command that has only that argument (so
/// that its required and conflicting flags do not matter).
fn parse(cmd: &Command, arg: &Arg, value: &str) -> Result<(), String> {
    let probe = Arg::new("value")
        .long("value")
        .action(ArgAction::Set)
        .allow_hyphen_values(true)
        .value_parser(arg.get_value_parser().clone());
    let name = cmd.get_name().to_owned();
    let probe_cmd = Command::new(name.clone())
        .arg(probe)
        .color(clap::ColorChoice::Never);
    match probe_cmd.try_get_matches_from([name, format!("--value={value}")]) {
        Ok(_) => Ok(()),
        Err(e) => {
            let e = e.to_string();
            let first = e.lines().next().unwrap_or_default();
            Err(first
                .split_once("'--value <value>': ")
                .map_or(first, |(_, why)| why)
                .to_owned())
        }
    }
}

/// A stand-in a reader replaces: an upper-case word (`N`, `CKPT_DIR`, the `URL` of `vllm:URL`),
/// or single letters only (`i/n`).
fn is_placeholder(value: &str) -> bool {
    let words: Vec<&str> = value
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .collect();
    let upper = |w: &&str| {
        w.starts_with(|c: char| c.is_ascii_uppercase()) && !w.contains(|c: char| c.is_ascii_lowercase())
    };
    words.iter().any(upper)
        || (!words.is_empty()
            && words
                .iter()
                .all(|w| w.len() == 1 && w.chars().all(|c| c.is_ascii_lowercase())))
}

/// Splits `name[=value]rest` off the text after `--`: the name (lower-case words joined by `-`),
/// the value after `=`, and what follows the name otherwise (punctuation, `/--other`).
fn split_flag(rest: &str) -> Option<(&str, Option<&str>, &str)> {
    let end = rest
        .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    let name = rest[..end].trim_end_matches('-');
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return None;
    }
    match rest[name.len()..].strip_prefix('=') {
        Some(value) => Some((name, Some(value), "")),
        None => Some((name, None, &rest[name.len()..])),
    }
}

/// Whether a word after a flag is its value rather than another flag or an ellipsis.
fn is_value(word: &str) -> bool {
    word == "-" || !(word.starts_with('-') || word == "|" || word.starts_with("..."))
}

/// A word without the quotes, brackets and punctuation around it (`[--steps`, `N]`, `i/n`)`).
fn strip(word: &str) -> &str {
    word.trim_start_matches(['`', '(', '[', '{', '<', '"', '\''])
        .trim_end_matches(['`', ')', ']', '}', '>', ',', ';', ':', '"', '\''])
}

/// Whether `word` runs `program` (a command name, or `*.x` for file names ending in `.x`).
fn is_program(word: &str, program: &str) -> bool {
    match program.strip_prefix('*') {
        Some(suffix) => word.ends_with(suffix),
        None => word.rsplit('/').next() == Some(program),
    }
}

/// Whether a script's text names `flag` (`--sync)` in a case arm, `"--repeat"` for argparse).
fn names_flag(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        let next = text[i + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

/// Where each run of backquotes starts in `text`, and its length.
fn backquote_runs(text: &str) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, b) in text.bytes().enumerate() {
        match runs.last_mut() {
            Some((start, len)) if b == b'`' && *start + *len == i => *len += 1,
            _ if b == b'`' => runs.push((i, 1)),
            _ => {}
        }
    }
    runs
}

/// One line of roff as text: `\-` is `-`, font changes go, `\*(Aq` is `'`, `\\` is `\`.
fn unroff(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('f') => _ = chars.next(),
            Some(k @ ('*' | '(')) => {
                // `\*(Aq` and `\(aq` are the apostrophe; other named characters do not matter here.
                let name: String = chars.by_ref().take(if k == '*' { 3 } else { 2 }).collect();
                if name.eq_ignore_ascii_case("(aq") || name == "aq" {
                    out.push('\'');
                }
            }
            Some('&') | None => {}
            Some('e') => out.push('\\'),
            Some(other) => out.push(other),
        }
    }
    out
}
