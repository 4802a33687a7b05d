_lego__rl() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="lego__rl"
                ;;
            lego__rl,align)
                cmd="lego__rl__subcmd__align"
                ;;
            lego__rl,build-images)
                cmd="lego__rl__subcmd__build__subcmd__images"
                ;;
            lego__rl,env)
                cmd="lego__rl__subcmd__env"
                ;;
            lego__rl,filter-tasks)
                cmd="lego__rl__subcmd__filter__subcmd__tasks"
                ;;
            lego__rl,generate-docs)
                cmd="lego__rl__subcmd__generate__subcmd__docs"
                ;;
            lego__rl,gpu-probe)
                cmd="lego__rl__subcmd__gpu__subcmd__probe"
                ;;
            lego__rl,help)
                cmd="lego__rl__subcmd__help"
                ;;
            lego__rl,report)
                cmd="lego__rl__subcmd__report"
                ;;
            lego__rl,rollout)
                cmd="lego__rl__subcmd__rollout"
                ;;
            lego__rl,train-step)
                cmd="lego__rl__subcmd__train__subcmd__step"
                ;;
            lego__rl,validate)
                cmd="lego__rl__subcmd__validate"
                ;;
            lego__rl__subcmd__gpu__subcmd__probe,cat)
                cmd="lego__rl__subcmd__gpu__subcmd__probe__subcmd__cat"
                ;;
            lego__rl__subcmd__gpu__subcmd__probe,decode)
                cmd="lego__rl__subcmd__gpu__subcmd__probe__subcmd__decode"
                ;;
            lego__rl__subcmd__gpu__subcmd__probe,help)
                cmd="lego__rl__subcmd__gpu__subcmd__probe__subcmd__help"
                ;;
            lego__rl__subcmd__gpu__subcmd__probe,samples)
                cmd="lego__rl__subcmd__gpu__subcmd__probe__subcmd__samples"
                ;;
            lego__rl__subcmd__gpu__subcmd__probe__subcmd__help,cat)
                cmd="lego__rl__subcmd__gpu__subcmd__probe__subcmd__help__subcmd__cat"
                ;;
            lego__rl__subcmd__gpu__subcmd__probe__subcmd__help,decode)
                cmd="lego__rl__subcmd__gpu__subcmd__probe__subcmd__help__subcmd__decode"
                ;;
            lego__rl__subcmd__gpu__subcmd__probe__subcmd__help,help)
                cmd="lego__rl__subcmd__gpu__subcmd__probe__subcmd__help__subcmd__help"
                ;;
            lego__rl__subcmd__gpu__subcmd__probe__subcmd__help,samples)
                cmd="lego__rl__subcmd__gpu__subcmd__probe__subcmd__help__subcmd__samples"
                ;;
            lego__rl__subcmd__help,align)
                cmd="lego__rl__subcmd__help__subcmd__align"
                ;;
            lego__rl__subcmd__help,build-images)
                cmd="lego__rl__subcmd__help__subcmd__build__subcmd__images"
                ;;
            lego__rl__subcmd__help,env)
                cmd="lego__rl__subcmd__help__subcmd__env"
                ;;
            lego__rl__subcmd__help,filter-tasks)
                cmd="lego__rl__subcmd__help__subcmd__filter__subcmd__tasks"
                ;;
            lego__rl__subcmd__help,generate-docs)
                cmd="lego__rl__subcmd__help__subcmd__generate__subcmd__docs"
                ;;
            lego__rl__subcmd__help,gpu-probe)
                cmd="lego__rl__subcmd__help__subcmd__gpu__subcmd__probe"
                ;;
            lego__rl__subcmd__help,help)
                cmd="lego__rl__subcmd__help__subcmd__help"
                ;;
            lego__rl__subcmd__help,report)
                cmd="lego__rl__subcmd__help__subcmd__report"
                ;;
            lego__rl__subcmd__help,rollout)
                cmd="lego__rl__subcmd__help__subcmd__rollout"
                ;;
            lego__rl__subcmd__help,train-step)
                cmd="lego__rl__subcmd__help__subcmd__train__subcmd__step"
                ;;
            lego__rl__subcmd__help,validate)
                cmd="lego__rl__subcmd__help__subcmd__validate"
                ;;
            lego__rl__subcmd__help__subcmd__gpu__subcmd__probe,cat)
                cmd="lego__rl__subcmd__help__subcmd__gpu__subcmd__probe__subcmd__cat"
                ;;
            lego__rl__subcmd__help__subcmd__gpu__subcmd__probe,decode)
                cmd="lego__rl__subcmd__help__subcmd__gpu__subcmd__probe__subcmd__decode"
                ;;
            lego__rl__subcmd__help__subcmd__gpu__subcmd__probe,samples)
                cmd="lego__rl__subcmd__help__subcmd__gpu__subcmd__probe__subcmd__samples"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        lego__rl)
            opts="-v -q -h -V --verbose --quiet --no-progress --strict --help --version filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__align)
            opts="-i -o -j -v -q -h -V --input --output --stats --match --model --jobs --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --input)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -i)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --stats)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --match)
                    COMPREPLY=($(compgen -W "strict loose-tool-args content-only" -- "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -j)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__build__subcmd__images)
            opts="-i -o -j -v -q -h -V --input --output --jobs --base-image --log-dir --harness --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --input)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -i)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -j)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --base-image)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --harness)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__env)
            opts="-v -q -h -V --json --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__filter__subcmd__tasks)
            opts="-i -o -j -v -q -h -V --input --output --decisions --funnel --dry-run --keep-going --stages --no-rules --min-statement-chars --max-statement-chars --min-patch-lines --max-patch-lines --max-patch-files --max-test-patch-lines --max-test-patch-files --no-test-file-check --languages --licenses --exclude-instances --exclude-repos-of --validity-runs --images --jobs --trials --min-solved --max-solved --trials-per-task --solved-threshold --incomplete-trials --drop-saturated --saturation-groups --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --input)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -i)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --decisions)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --funnel)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --stages)
                    COMPREPLY=($(compgen -W "rules decontamination validity difficulty saturation" -- "${cur}"))
                    return 0
                    ;;
                --min-statement-chars)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-statement-chars)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-patch-lines)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-patch-lines)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-patch-files)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-test-patch-lines)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-test-patch-files)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --languages)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --licenses)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --exclude-instances)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --exclude-repos-of)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --validity-runs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --images)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -j)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --trials)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-solved)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-solved)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --trials-per-task)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --solved-threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --incomplete-trials)
                    COMPREPLY=($(compgen -W "drop keep fail" -- "${cur}"))
                    return 0
                    ;;
                --drop-saturated)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --saturation-groups)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__generate__subcmd__docs)
            opts="-v -q -h -V --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe)
            opts="-v -q -h -V --checkpoint --device --sequences --prompt-tokens --new-tokens --seed --verbose --quiet --no-progress --strict --help --version samples decode cat help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --checkpoint)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sequences)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --new-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe__subcmd__cat)
            opts="-v -q -h -V --checkpoint --device --sequences --prompt-tokens --new-tokens --seed --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --checkpoint)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sequences)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --new-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe__subcmd__decode)
            opts="-v -q -h -V --checkpoint --device --sequences --prompt-tokens --new-tokens --seed --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --checkpoint)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sequences)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --new-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe__subcmd__help)
            opts="samples decode cat help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe__subcmd__help__subcmd__cat)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe__subcmd__help__subcmd__decode)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe__subcmd__help__subcmd__samples)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__gpu__subcmd__probe__subcmd__samples)
            opts="-o -v -q -h -V --output --checkpoint --device --sequences --prompt-tokens --new-tokens --seed --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --checkpoint)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sequences)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prompt-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --new-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help)
            opts="filter-tasks build-images rollout align train-step validate report env generate-docs gpu-probe help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__align)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__build__subcmd__images)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__env)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__filter__subcmd__tasks)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__generate__subcmd__docs)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__gpu__subcmd__probe)
            opts="samples decode cat"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__gpu__subcmd__probe__subcmd__cat)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__gpu__subcmd__probe__subcmd__decode)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__gpu__subcmd__probe__subcmd__samples)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__report)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__rollout)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__train__subcmd__step)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__help__subcmd__validate)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__report)
            opts="-o -v -q -h -V --output --max-trajectories --serve --bind --token --advisory --assistant --assistant-model --assistant-api-key-env --assistant-chat-model --assistant-context --assistant-max-tokens --conversations --summarize --summarize-jobs --summarize-tokens --summarize-retries --review --review-sample --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-trajectories)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bind)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --token)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --advisory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --assistant)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --assistant-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --assistant-api-key-env)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --assistant-chat-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --assistant-context)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --assistant-max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --conversations)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --summarize-jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --summarize-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --summarize-retries)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --review-sample)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__rollout)
            opts="-i -o -j -v -q -h -V --input --images --harness --harness-mix --backend --vllm-python --vllm-arg --vllm-ready-timeout --reload-tolerance --chat-model --output --group-size --concurrency --shard --epochs --first-group --max-trajectories --follow --max-staleness --reload-in-flight --mode --temperature --harness-sampling --top-p --top-k --min-p --max-tokens --seed --max-turns --agent-timeout --max-context --forced --run-id --base-image --cache-dir --device --prefix-cache-bytes --min-informative-groups --max-extra-groups --task-pool --pool-order --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --input)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -i)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --images)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --harness)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --harness-mix)
                    COMPREPLY=($(compgen -W "task task-hash group sample" -- "${cur}"))
                    return 0
                    ;;
                --backend)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --vllm-python)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --vllm-arg)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --vllm-ready-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --reload-tolerance)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --chat-model)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --group-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --concurrency)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -j)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --shard)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --epochs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --first-group)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-trajectories)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --follow)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-staleness)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mode)
                    COMPREPLY=($(compgen -W "train eval" -- "${cur}"))
                    return 0
                    ;;
                --temperature)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --harness-sampling)
                    COMPREPLY=($(compgen -W "pin honor" -- "${cur}"))
                    return 0
                    ;;
                --top-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top-k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-turns)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --agent-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-context)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --forced)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --run-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --base-image)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cache-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefix-cache-bytes)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-informative-groups)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-extra-groups)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --task-pool)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pool-order)
                    COMPREPLY=($(compgen -W "as-is curriculum" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__train__subcmd__step)
            opts="-i -v -q -h -V --input --checkpoint --out --metrics --device --dtype --loss --lr --min-lr --warmup-steps --schedule --total-steps --weight-decay --eps-low --eps-high --updates --micro-batch-tokens --activation-checkpointing --logprob-chunk --max-grad-norm --tis-cap --is-correction --is-mask-low --is-mask-high --is-geo-low --is-geo-high --freeze --replay --seed --nproc-per-node --zero --dist-timeout --dist-backend --bucket-mb --expert-parallel --expert-layout --plan --device-memory --world-size --format --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --input)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -i)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --checkpoint)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --out)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --metrics)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --loss)
                    COMPREPLY=($(compgen -W "gspo gspo-token sft" -- "${cur}"))
                    return 0
                    ;;
                --lr)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-lr)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --warmup-steps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --schedule)
                    COMPREPLY=($(compgen -W "constant cosine" -- "${cur}"))
                    return 0
                    ;;
                --total-steps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --weight-decay)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --eps-low)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --eps-high)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --updates)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --micro-batch-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --logprob-chunk)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-grad-norm)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tis-cap)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --is-correction)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --is-mask-low)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --is-mask-high)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --is-geo-low)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --is-geo-high)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --freeze)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --replay)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --seed)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --nproc-per-node)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --zero)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dist-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dist-backend)
                    COMPREPLY=($(compgen -W "gloo nccl" -- "${cur}"))
                    return 0
                    ;;
                --bucket-mb)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --expert-parallel)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --expert-layout)
                    COMPREPLY=($(compgen -W "keep per-expert fused" -- "${cur}"))
                    return 0
                    ;;
                --device-memory)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --world-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "table json" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        lego__subcmd__rl__subcmd__validate)
            opts="-v -q -h -V --json --health --gates --gate --all-steps --report-out --no-report --eval --compare --verbose --quiet --no-progress --strict --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --gates)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --gate)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --report-out)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --eval)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compare)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _lego__rl -o nosort -o bashdefault -o default lego-rl
else
    complete -F _lego__rl -o bashdefault -o default lego-rl
fi
