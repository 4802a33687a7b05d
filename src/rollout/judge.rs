//! How a trial ended: the sandbox's view refined by the captures and the harness's own exit status.

use crate::harness::HarnessConfig;
use crate::records::{Generation, Termination, CONTEXT_LIMIT};

/// How a trial ended, refining the sandbox's view with the captures and the harness's own exit
/// status (`status`, from [`HarnessConfig::exit_status`]): a model-side failure is
/// `infra:model`; a trial whose last request was refused for the context is `context_limit`
/// (one that recovered from an earlier refusal is judged on); a status the adapter lists
/// decides `finished` / `max_turns` / `agent_crash`; otherwise an adapter's turn-budget exit
/// code, or a main thread that used the whole turn budget, is `max_turns`.
pub fn classify(
    sandbox: &Termination,
    exit_code: Option<i64>,
    generations: &[Generation],
    harness: &HarnessConfig,
    status: Option<&str>,
) -> Termination {
    if sandbox.is_infra() {
        return sandbox.clone();
    }
    // The proxy records a prompt it refused for the context as `status: "context_limit"`. A
    // harness that recovers (compacts and goes on) is judged by what it did next; one whose last
    // request was refused ended on the context limit, whatever it then printed.
    if generations
        .last()
        .is_some_and(|g| g.status.as_deref() == Some(CONTEXT_LIMIT))
    {
        return Termination::ContextLimit;
    }
    if generations
        .iter()
        .any(|g| g.status.as_deref() == Some("infra_error"))
    {
        return Termination::Infra("model".into());
    }
    if matches!(sandbox, Termination::AgentTimeout) {
        return sandbox.clone();
    }
    if let (Some(status), Some(rule)) = (status, &harness.exit_status) {
        let listed = |l: &[String]| l.iter().any(|s| s == status);
        if listed(&rule.max_turns) {
            return Termination::MaxTurns;
        }
        if listed(&rule.agent_crash) && matches!(sandbox, Termination::Finished | Termination::AgentCrash) {
            // The harness gave up, in its own words, whatever its exit code (OpenHands' stuck
            // detector exits 0) and however many turns it used.
            return Termination::AgentCrash;
        }
        if listed(&rule.finished) && matches!(sandbox, Termination::Finished) {
            // Submitted, possibly on its last allowed turn: not a budget stop.
            return Termination::Finished;
        }
    }
    if exit_code.is_some_and(|c| harness.max_turns_exit_codes.contains(&c)) {
        return Termination::MaxTurns;
    }
    let main_turns = generations.iter().filter(|g| g.thread == 0).count();
    if harness.max_turns > 0 && main_turns >= harness.max_turns as usize {
        return Termination::MaxTurns;
    }
    sandbox.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(thread: u32, status: &str) -> Generation {
        Generation {
            thread,
            status: Some(status.into()),
            ..Default::default()
        }
    }

    /// mini-swe-agent's exit-status rule.
    const MINI_RULE: &str =
        "[exit_status]\nfile = \"{logs}/trajectory.json\"\npointer = \"/info/exit_status\"\n\
                             finished = [\"Submitted\"]\nmax_turns = [\"LimitsExceeded\"]\n";

    /// An adapter with a turn budget, turn-budget exit codes and optionally mini-swe-agent's
    /// exit-status rule.
    fn harness(max_turns: u32, codes: &[i64], status_rule: bool) -> HarnessConfig {
        harness_with(max_turns, codes, if status_rule { MINI_RULE } else { "" })
    }

    /// An adapter with a turn budget, turn-budget exit codes and the given `[exit_status]` text.
    fn harness_with(max_turns: u32, codes: &[i64], rule: &str) -> HarnessConfig {
        let text = format!(
            "name = \"h\"\ndescription = \"d\"\napi = \"openai\"\ncommand = [\"run\", \"{{instruction}}\"]\n\
             max_turns = {max_turns}\nmax_turns_exit_codes = {codes:?}\n[runtime]\n{rule}"
        );
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn classification_refines_the_sandbox() {
        let ok = vec![gen(0, "ok"), gen(0, "ok"), gen(1, "ok")];
        let fin = Termination::Finished;
        assert_eq!(classify(&fin, Some(0), &ok, &harness(50, &[], false), None), fin);
        assert_eq!(
            classify(&fin, Some(0), &ok, &harness(2, &[], false), None),
            Termination::MaxTurns
        );
        assert_eq!(
            classify(
                &Termination::AgentCrash,
                Some(3),
                &ok,
                &harness(50, &[3], false),
                None
            ),
            Termination::MaxTurns
        );
        assert_eq!(
            classify(
                &Termination::AgentCrash,
                Some(1),
                &ok,
                &harness(50, &[3], false),
                None
            ),
            Termination::AgentCrash
        );
        // The last request refused for the context: `context_limit`, however the harness exited;
        // a refusal the harness recovered from (it compacted and went on) does not decide.
        let mut ctx = ok.clone();
        ctx.push(gen(0, CONTEXT_LIMIT));
        for sandbox in [Termination::AgentCrash, Termination::Finished] {
            assert_eq!(
                classify(&sandbox, Some(1), &ctx, &harness(50, &[], false), None),
                Termination::ContextLimit
            );
        }
        let mut recovered = ctx.clone();
        recovered.push(gen(1, "ok"));
        assert_eq!(
            classify(&fin, Some(0), &recovered, &harness(50, &[], false), None),
            fin
        );
        let mut down = ok.clone();
        down.push(gen(0, "infra_error"));
        assert_eq!(
            classify(
                &Termination::AgentCrash,
                Some(1),
                &down,
                &harness(50, &[], false),
                None
            ),
            Termination::Infra("model".into())
        );
        let setup = Termination::Infra("setup".into());
        assert_eq!(classify(&setup, None, &[], &harness(50, &[], false), None), setup);
    }

    #[test]
    fn the_harness_exit_status_decides_between_finished_and_max_turns() {
        let two = vec![gen(0, "ok"), gen(0, "ok")];
        let fin = Termination::Finished;
        let h = harness(2, &[], true);
        // Submitted on the last allowed turn: finished, not a budget stop.
        assert_eq!(classify(&fin, Some(0), &two, &h, Some("Submitted")), fin);
        // The harness says its budget ran out, whatever the turn count.
        assert_eq!(
            classify(&fin, Some(0), &two[..1], &h, Some("LimitsExceeded")),
            Termination::MaxTurns
        );
        // An unlisted status, or none (no file), falls back to the turn count.
        assert_eq!(
            classify(&fin, Some(0), &two, &h, Some("KeyError")),
            Termination::MaxTurns
        );
        assert_eq!(classify(&fin, Some(0), &two, &h, None), Termination::MaxTurns);
        // "Submitted" does not hide a crash, a timeout or an infra failure.
        assert_eq!(
            classify(&Termination::AgentCrash, Some(1), &two, &h, Some("Submitted")),
            Termination::MaxTurns
        );
        assert_eq!(
            classify(&Termination::AgentTimeout, None, &two[..1], &h, Some("Submitted")),
            Termination::AgentTimeout
        );
        let rule = h.exit_status.as_ref().unwrap();
        let file = r#"{"info": {"exit_status": "Submitted", "submission": ""}, "messages": []}"#;
        assert_eq!(rule.status_in(file).as_deref(), Some("Submitted"));
        assert_eq!(rule.status_in("{\"info\": {}}"), None);
        assert_eq!(rule.status_in("not json"), None);
        // JSON Lines (Claude Code's teed stream-json stdout): the last `result` record decides.
        let h = harness_with(
            2,
            &[],
            "[exit_status]\nfile = \"{logs}/claude.jsonl\"\nformat = \"jsonl\"\npointer = \"/subtype\"\n\
             record = { \"/type\" = \"result\" }\nfinished = [\"success\"]\nmax_turns = [\"error_max_turns\"]\n",
        );
        let rule = h.exit_status.as_ref().unwrap();
        let init = "{\"type\":\"system\",\"subtype\":\"init\"}";
        let stream = format!(
            "{init}\n[SandboxDebug] not json\n{{\"subtype\":\"success\",\"is_error\":false,\"type\":\"result\"}}\n\
             {{\"type\":\"system\",\"subtype\":\"post_turn_summary\"}}\n\n"
        );
        let status = rule.status_in(&stream);
        assert_eq!(status.as_deref(), Some("success"));
        assert_eq!(classify(&fin, Some(0), &two, &h, status.as_deref()), fin);
        let out_of_turns = format!("{init}\n{{\"type\":\"result\",\"subtype\":\"error_max_turns\"}}\n");
        let status = rule.status_in(&out_of_turns);
        assert_eq!(status.as_deref(), Some("error_max_turns"));
        assert_eq!(
            classify(
                &Termination::AgentCrash,
                Some(1),
                &two[..1],
                &h,
                status.as_deref()
            ),
            Termination::MaxTurns
        );
        // Killed mid-write, before any result: no status, not the `init` record's subtype.
        assert_eq!(
            rule.status_in(&format!("{init}\n{{\"type\":\"result\",\"sub")),
            None
        );
        assert_eq!(rule.status_in(""), None);
        // Without `record`, the last JSON record is read.
        let mut any = rule.clone();
        any.record.clear();
        assert_eq!(any.status_in(&stream).as_deref(), Some("post_turn_summary"));
    }

    #[test]
    fn an_agent_crash_status_overrides_a_clean_exit_and_the_turn_count() {
        let two = vec![gen(0, "ok"), gen(0, "ok")];
        let h = harness_with(
            2,
            &[],
            "[exit_status]\nfile = \"{logs}/status.json\"\npointer = \"/status\"\n\
             finished = [\"finished\"]\nmax_turns = [\"MaxIterationsReached\"]\nagent_crash = [\"stuck\"]\n",
        );
        let fin = Termination::Finished;
        // OpenHands' stuck detector ends run() normally: exit 0, yet the agent did not finish.
        assert_eq!(
            classify(&fin, Some(0), &two[..1], &h, Some("stuck")),
            Termination::AgentCrash
        );
        assert_eq!(
            classify(&fin, Some(0), &two, &h, Some("stuck")),
            Termination::AgentCrash
        );
        assert_eq!(
            classify(&Termination::AgentCrash, Some(1), &two, &h, Some("stuck")),
            Termination::AgentCrash
        );
        // Timeouts and the model's failures still come first.
        assert_eq!(
            classify(&Termination::AgentTimeout, None, &two, &h, Some("stuck")),
            Termination::AgentTimeout
        );
        let down = vec![gen(0, "infra_error")];
        assert_eq!(
            classify(&fin, Some(0), &down, &h, Some("stuck")),
            Termination::Infra("model".into())
        );
        assert_eq!(
            classify(&fin, Some(0), &two[..1], &h, Some("MaxIterationsReached")),
            Termination::MaxTurns
        );
    }
}
