//! The docs say what the CLI does: the committed man pages and completions match the CLI
//! definitions, the formats document covers every schema, and every flag (and flag value) that
//! README.md, the man pages and the examples' READMEs name is one the binary accepts (issue 58:
//! the README listed `--harness-mix round-robin`, which rollout refuses). How the docs are read
//! is in [`flags`]; other programs' flags that the docs show are allowed by the two lists below.

use std::path::Path;

use flags::{cli, doc_files, scripts, Checker};

mod flags;

#[test]
fn man_pages_are_up_to_date() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("man");
    let stale = lego_rl::cmd::generate_docs::stale_docs(
        &dir,
        &<lego_rl::cli::Cli as clap::CommandFactory>::command(),
    )
    .unwrap();
    assert!(
        stale.is_empty(),
        "stale generated docs {stale:?}: regenerate with `cargo run --release -- generate-docs man`"
    );
}

#[test]
fn formats_document_covers_every_schema() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/man/lego-rl-formats.md")).unwrap();
    for (_, schema) in lego_rl::records::KNOWN_SCHEMAS {
        assert!(
            doc.contains(schema),
            "man/lego-rl-formats.md does not document {schema}"
        );
    }
}

/// Programs whose flags the docs show after their name (`torchrun --nproc-per-node 8 --no-python
/// lego-rl train-step ...`): their flags are not checked, up to the next `lego-rl` or subcommand.
/// `*.x` matches any file name ending in `.x`. Each entry says why the docs show it; an entry no
/// mention uses fails the test.
const FOREIGN_COMMANDS: &[(&str, &str)] = &[
    (
        "torchrun",
        "README, train-step's help: ranks started by PyTorch's launcher",
    ),
    (
        "srun",
        "README, examples/slurm, train-step's help: ranks started by Slurm",
    ),
    (
        "*.sbatch",
        "examples/slurm's diagram: the sbatch options a job script is submitted with",
    ),
];

/// Whose flag a [`FOREIGN_FLAGS`] entry is.
enum Owner {
    /// A script of this checkout takes it or passes it on: it must appear there, so the entry
    /// cannot outlive the script's use of it.
    Script(&'static str),
    /// Another program.
    Program,
}

/// Submits the Slurm jobs of a step, with the sbatch options the docs show.
const SUBMIT_STEP: &str = "examples/slurm/submit-step.sh";

/// Flags that the docs name with no command before them and that are not lego-rl's. An entry no
/// mention uses fails the test.
const FOREIGN_FLAGS: &[(&str, Owner)] = &[
    // README's loop section: scripts/loop.sh's synchronous mode, re-filter and curriculum.
    ("--sync", Owner::Script("scripts/loop.sh")),
    ("--refilter", Owner::Script("scripts/loop.sh")),
    ("--curriculum", Owner::Script("scripts/loop.sh")),
    // examples/learn/README.md: the simulator's knob for the task family.
    ("--repeat", Owner::Script("examples/learn/simulate.py")),
    // README, examples/slurm/README.md: the sbatch options the Slurm jobs are submitted with.
    ("--dependency", Owner::Script(SUBMIT_STEP)),
    ("--nodes", Owner::Script(SUBMIT_STEP)),
    ("--ntasks-per-node", Owner::Script(SUBMIT_STEP)),
    ("--gres", Owner::Script(SUBMIT_STEP)),
    // README's vLLM section: flags of `vllm serve` (rollout adds some to the server it starts)...
    ("--enforce-eager", Owner::Program),
    ("--no-enable-chunked-prefill", Owner::Program),
    ("--max-num-batched-tokens", Owner::Program),
    ("--enable-return-routed-experts", Owner::Program),
    ("--logprobs-mode", Owner::Program),
    // ... and of the `pip install` that installs the vLLM wheel.
    ("--no-deps", Owner::Program),
];

/// Every flag the docs name, with its value, is one the CLI accepts.
#[test]
fn docs_name_only_flags_and_values_the_cli_accepts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cli = cli();
    let scripts = scripts(root);
    let mut checker = Checker::new(&cli, &scripts);
    for file in doc_files(root) {
        let text = std::fs::read_to_string(root.join(&file)).unwrap();
        let file = file.to_string_lossy();
        if file.ends_with(".1") {
            checker.roff(&file, &text);
        } else {
            checker.markdown(&file, &text);
        }
    }
    checker.check_allow_lists();
    let Checker {
        failures, mentions, ..
    } = checker;
    // A scanner that finds nothing must not pass.
    assert!(mentions > 500, "only {mentions} flag mentions found");
    assert!(
        failures.is_empty(),
        "{} of {mentions} flag mentions in the docs are wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The checker itself: a value the flag refuses, a flag no subcommand has and a flag the named
/// subcommand lacks fail; placeholders, lists, other programs' flags and prose words pass.
#[test]
fn flag_checker_catches_wrong_values_and_unknown_flags() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (cli, scripts) = (cli(), scripts(root));
    let mut checker = Checker::new(&cli, &scripts);
    let doc = "Use `rollout --harness-mix round-robin` or\n`--harness-mix task|sample`, `--no-such`,\n\
               `validate --backend X`, `--zero 3`, `align -j many`.\n\n\
               `--shard i/n`, `--backend vllm:URL`, `--is-correction geo-mask,tis`, `--zero\n1`,\n\
               `srun --nodes M lego-rl train-step --device cuda`, `--device-memory 141GB`, `-i -`.\n\
               ```sh\nlego-rl report run/ --serve --bind 127.0.0.1:8470 -o x  # or --summarize\n\
               scripts/loop.sh --sync \\\n  --no-such\n```\n";
    checker.markdown("doc.md", doc);
    let roff = ".SH DESCRIPTION\nWith \\-\\-follow, a group \\-\\-max\\-staleness versions behind;\n\
                torchrun or srun (RANK) and \\-\\-nope.\n.PP\n\
                \x20 lego\\-rl rollout \\-\\-mode \\\\\n\x20     evaluate \\-\\-seed 1\n";
    checker.roff("page.1", roff);
    let wanted = [
        "doc.md:1: `--harness-mix round-robin`: not one of task, task-hash, group, sample",
        "doc.md:2: `--no-such`: no lego-rl subcommand has this flag",
        "doc.md:3: `--backend` is no flag of `validate`",
        "doc.md:3: `--zero 3`: ",
        "doc.md:3: `-j many`: ",
        "doc.md:11: `--no-such`: scripts/loop.sh has no such flag",
        "page.1:3: `--nope`: no lego-rl subcommand has this flag",
        "page.1:5: `--mode evaluate`: not one of train, eval",
    ];
    assert_eq!(checker.failures.len(), wanted.len(), "{:#?}", checker.failures);
    for (got, want) in checker.failures.iter().zip(wanted) {
        assert!(got.starts_with(want), "{got:?} does not start with {want:?}");
    }
    assert_eq!(checker.mentions, 24, "{:#?}", checker.failures);
}
