//! The grader's defences, named so that the adversarial tests can switch one off and show that its
//! trick really scores without it. Only [`super::Trial::without_defence`] (doc-hidden, used by
//! tests alone; no subcommand or setting reaches it) changes them: a trial always runs with every
//! defence on.

/// One defence of extraction and grading.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Defence {
    /// A new module shadowing what the grader imports gets reward 0 (`shadowing`).
    Shadowing,
    /// Of [`Defence::Shadowing`], the directories found by running the task's test command at the
    /// base commit (the real `sys.path`: `$VAR` and absolute `PYTHONPATH` entries, the image's ENV,
    /// the ini's `pythonpath`); off, only the ones read from the command's text and the test paths.
    ImportPathProbe,
    /// Compiled Python is left out of the diff and planted bytecode gets reward 0 (`bytecode`).
    Bytecode,
    /// Special files (FIFOs, devices) are skipped by the scans of the agent's tree.
    SpecialFiles,
    /// `conftest.py`, every pytest ini file and `.gitattributes` of the diff are reverted.
    CollectionHooks,
    /// Package metadata, `.pth` files and `sitecustomize`/`usercustomize` are reverted.
    StartupHooks,
    /// pytest's plugin autoload is off; the image's own plugins are loaded by `-p`.
    PluginAutoload,
    /// Test-package `__init__.py` and helpers beside the tests are restored from the base commit.
    TestHelpers,
    /// The task's test files are restored from the base commit.
    ProtectedTests,
    /// git attributes come from the base commit and lego-rl's override, never from the agent.
    GitAttributes,
    /// Of [`Defence::GitAttributes`], the part that works on any git version: the `info/attributes`
    /// override and `core.attributesFile=/dev/null` (off: only `GIT_ATTR_SOURCE`, git >= 2.42).
    AttributesOverride,
    /// Nested repositories are left out of the diff instead of failing extraction.
    NestedRepo,
    /// A diff over the size limit is not read (reward 0, `diff_too_large`).
    DiffCap,
    /// Failures the diff causes while grading (a test patch that no longer applies, a killed
    /// grading shell, a missing reward file) give reward 0 with an event, not `infra:evaluate`.
    SabotageCostsReward,
    /// SWE statuses come from the grader's root-owned result stream, and junit.xml must agree with
    /// it (`result_tampering`); off, junit.xml (or the log) and the exit code decide.
    ResultChannel,
    /// Of [`Defence::ResultChannel`], the per-grading key on every line of the stream: lines
    /// without it (written to the descriptor by code under test) are ignored and counted
    /// (`result_tampering`); off, any line counts.
    KeyedResults,
    /// Of [`Defence::ResultChannel`], pytest's exit status comes only from the plugin's `finish`,
    /// and a grading script that did not exit 0 was killed (`grading_killed`) whatever exit line
    /// it printed; off, the shell's exit code and exit line stand in for them.
    PluginFinish,
    /// The test user's grading commands run under a seccomp filter that denies `ptrace` and
    /// `process_vm_readv`/`process_vm_writev`.
    NoPtrace,
    /// Result files are read with a size cap and never through a symlink (`result_tampering` /
    /// `reward_tampering`); off, `cat`.
    BoundedReads,
    /// The config file pytest used (the plugin's report) is compared with the base commit's: one
    /// the diff wrote is `config_mismatch`.
    ConfigCheck,
    /// Harbor: root owns `/logs/verifier`, pre-creates the reward files `test.sh` writes, kills
    /// the verifier user's processes before reading, and checks what is there
    /// (`reward_tampering`); off, the verifier user owns the directory and anything in it counts.
    RewardFiles,
}
