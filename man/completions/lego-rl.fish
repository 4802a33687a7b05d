# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_lego_rl_global_optspecs
    string join \n v/verbose q/quiet no-progress strict h/help V/version
end

function __fish_lego_rl_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_lego_rl_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_lego_rl_using_subcommand
    set -l cmd (__fish_lego_rl_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c lego-rl -n "__fish_lego_rl_needs_command" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "filter-tasks" -d 'Filter a task pool into a training set, reporting the funnel'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "build-images" -d 'Build (or find cached) container images for tasks'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "rollout" -d 'Run harnesses on tasks in sandboxes and record trajectories'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "align" -d 'Align trajectories into token-exact training samples'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "train-step" -d 'Update the policy with GSPO on aligned samples, replaying rollout routing'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "validate" -d 'Check record files, judge a run\'s health against gates, or score held-out trajectories'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "report" -d 'Write CSV tables and an HTML report of a run, or serve it live'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "generate-docs" -d 'Writes the man pages and shell completions (for maintainers)'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s i -l input -d 'Task pool: SWE-bench JSONL, Harbor task directories or lego-rl task records' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s o -l output -d 'Kept tasks (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s i -l input -d 'Tasks (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s o -l output -d 'Image manifest (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s j -l jobs -d 'Parallel builds' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s i -l input -d 'Tasks (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s o -l output -d 'Trajectories (zstd JSONL, appended as groups complete)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l group-size -d 'Trials per task' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s i -l input -d 'Trajectories (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s o -l output -d 'Samples (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s i -l input -d 'Samples (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l checkpoint -d 'Checkpoint to start from (Hugging Face layout)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l out -d 'Directory of the new checkpoint' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l gates -d 'TOML gate file: `all_steps = bool`, `[thresholds] NAME = number`, `disable = [NAME, ...]`' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l gate -d 'Override one gate: NAME=NUMBER, or NAME=off to disable it (repeatable)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l report-out -d 'Append the validation-report record here instead of RUN_DIR/validation.jsonl.zst' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l eval -d 'Score held-out trajectories (files or run directories)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l compare -d 'Compare two evaluations: B − A with a 95% interval' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l json -d 'Print the result as JSON instead of a table'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l health -d 'Judge explicit files as one run (health and gates) instead of checking their records'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l all-steps -d 'Judge every step, not only the latest'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l no-report -d 'Do not append a validation-report record'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s o -l output -d 'Output directory for index.html and the CSV files (default RUN/report)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l max-trajectories -d 'Trajectories whose full detail the static page embeds' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l bind -d 'Address to serve on (port 0 picks a free port; the address is printed on stdout)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l serve -d 'Serve the live UI instead of writing files'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -l strict -d 'Fail on the first bad input record instead of skipping and counting it'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -s h -l help -d 'Print help'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "filter-tasks" -d 'Filter a task pool into a training set, reporting the funnel'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "build-images" -d 'Build (or find cached) container images for tasks'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "rollout" -d 'Run harnesses on tasks in sandboxes and record trajectories'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "align" -d 'Align trajectories into token-exact training samples'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "train-step" -d 'Update the policy with GSPO on aligned samples, replaying rollout routing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "validate" -d 'Check record files, judge a run\'s health against gates, or score held-out trajectories'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "report" -d 'Write CSV tables and an HTML report of a run, or serve it live'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "generate-docs" -d 'Writes the man pages and shell completions (for maintainers)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report generate-docs help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
