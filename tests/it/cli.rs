//! CLI behaviour: help, unimplemented subcommands, exit codes.

use crate::common::lego;

const SUBCOMMANDS: [&str; 7] = [
    "filter-tasks",
    "build-images",
    "rollout",
    "align",
    "train-step",
    "validate",
    "report",
];

#[test]
fn top_level_help_lists_the_seven_subcommands() {
    let out = lego().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for sub in SUBCOMMANDS {
        assert!(
            text.contains(&format!("  {sub} ")),
            "--help does not list {sub}:\n{text}"
        );
    }
    assert!(
        !text.contains("generate-docs"),
        "maintainer command must stay hidden"
    );
}

#[test]
fn every_subcommand_help_works_and_shows_an_example() {
    for sub in SUBCOMMANDS {
        let out = lego().args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "{sub} --help failed");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("Example:"), "{sub} --help has no example:\n{text}");
        assert!(
            text.contains(&format!("lego-rl {sub}")),
            "{sub} example does not invoke it"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    let out = lego().args(["validate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = lego().args(["no-such-command"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
