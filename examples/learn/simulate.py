#!/usr/bin/env python3
"""Can the benchmark's model learn to copy the word at all? A fast check outside the pipeline.

The pipeline's runs (run.sh) cost about an hour each on 2 CPU cores, almost all of it harness
start-up. This script answers the design question first, in minutes, with transformers alone: the
same random model (make_model.config, the seed), the same prompts (the real tokenizer and chat
template, mini-swe-agent's system prompt and bash tool, make_tasks.py's phrasings) and the same
correct outputs. It runs

1. SFT on the demonstration tasks (make_tasks.py's choice; one AdamW update on all of them per step,
   as run.sh does), then
2. group-relative RL on the word alone: per step one training task of each word, GROUP samples of
   the word at temperature 1 at its position in the correct output, reward 1 when it is the task's
   word, advantages (r − mean)/std within the group, one AdamW update — what GSPO does when the
   rest of the call is already right,

and prints p(correct word) (teacher-forced, at the word's position) on training and held-out tasks.
It is an idealisation: the pipeline samples the whole call, and a malformed call earns 0. It was
used to choose the family (REPEAT) and the learning rates (README "Choosing the family").

With --arms it compares batch construction at an equal budget of sampled trials instead (issue 39,
README "Dynamic sampling"): every arm starts from the same warm start and the same random state, and
runs RL until it has sampled --budget trials, every sampled trial counted, those of dropped groups
included.
- `fixed`: the plain RL above (one training task per word, GROUP samples each, one update per batch;
  a zero-variance group gets zero advantage but still costs its trials and counts in the mean).
- `dynamic`: DAPO-style dynamic sampling as `rollout --min-informative-groups N --max-extra-groups M
  --task-pool` does it (examples/learn/run.sh's LEGO_RL_MIN_INFORMATIVE): the same planned groups,
  then extra groups from the training pool (further word-balanced triples of random tasks, as run.sh's
  pool continues order.txt) until the batch holds N informative groups (reward variance > 0) or M
  extra groups are spent; zero-variance groups are dropped and the update is on the informative ones.
The policy at budget checkpoint C is the one trained on at most C sampled trials: it is evaluated
before the first group that would take the count past C. A batch cut by the budget still updates on
the informative groups it holds. Lines starting `ckpt` and `result` are for scripts
(scripts/bench/dynamic_sampling.sh).

Usage: simulate.py [--repeat N] [--sft-steps N] [--sft-lr X] [--rl-steps N] [--rl-lr X] [--group N] [--seed N]
       simulate.py --arms fixed,dynamic --budget TRIALS [--min-informative N] [--max-extra M] [--checkpoints K] ...
"""
import argparse
import os
import random
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model  # noqa: E402
import make_tasks  # noqa: E402

SYSTEM = "You are a helpful assistant that can interact with a computer."
# mini-swe-agent 2.4.6's bash tool, as it sends it (testdata/harness-traffic/mini-swe-agent).
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
                   "required": ["command"]}}}]


def tasks(tok, repeat):
    """Every task: token ids of prompt + correct output, the word's position and id, split."""
    out = []
    for i, w in enumerate(make_tasks.WORDS):
        (wid,) = tok(" " + w, add_special_tokens=False)["input_ids"]
        for j, t in enumerate(make_tasks.phrasings(repeat)):
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t.format(w=w)}]
            prompt = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, tokenize=False)
            pid = tok(prompt, add_special_tokens=False)["input_ids"]
            oid = tok(make_tasks.output(w) + "<|im_end|>", add_special_tokens=False)["input_ids"]
            wpos = len(pid) + max(k for k, x in enumerate(oid) if x == wid)
            out.append(dict(id=make_tasks.task_id(w, j), word=i, wid=wid, ids=pid + oid, plen=len(pid), wpos=wpos,
                            held=make_tasks.heldout(j)))
    return out


class Sim:
    def __init__(self, model):
        self.m = model

    def hidden(self, batch):
        n = max(len(t["ids"]) for t in batch)
        ids = torch.full((len(batch), n), 151643)
        att = torch.zeros(len(batch), n, dtype=torch.long)
        for k, t in enumerate(batch):
            ids[k, : len(t["ids"])] = torch.tensor(t["ids"])
            att[k, : len(t["ids"])] = 1
        return self.m.model(input_ids=ids, attention_mask=att).last_hidden_state, ids

    def sft_loss(self, batch):
        """Mean NLL per output token (train-step --loss sft)."""
        h, ids = self.hidden(batch)
        total, n = 0.0, 0
        for k, t in enumerate(batch):
            pos = torch.arange(t["plen"] - 1, len(t["ids"]) - 1)
            lp = self.m.lm_head(h[k, pos]).log_softmax(-1)
            total = total - lp.gather(1, ids[k, pos + 1].unsqueeze(1)).sum()
            n += len(pos)
        return total / n

    def word_logprobs(self, batch):
        h, _ = self.hidden(batch)
        return [self.m.lm_head(h[k, t["wpos"] - 1]).log_softmax(-1) for k, t in enumerate(batch)]

    @torch.no_grad()
    def p_correct(self, batch):
        return sum(lp[t["wid"]].exp().item() for lp, t in zip(self.word_logprobs(batch), batch)) / len(batch)


def word_balanced(rng, by_word):
    """Endless training tasks, one of each word per consecutive triple (order.txt's rule), random within."""
    while True:
        words = list(range(len(by_word)))
        rng.shuffle(words)
        for i in words:
            yield rng.choice(by_word[i])


@torch.no_grad()
def sample_group(sim, task, group):
    """GROUP samples of the word at temperature 1 and their rewards."""
    (lp,) = sim.word_logprobs([task])
    sample = torch.multinomial(lp.exp(), group, replacement=True)
    return sample, (sample == task["wid"]).float()


def update(sim, opt, groups, denom):
    """One AdamW update on the groups (task, sample, rewards) with reward variance, the loss summed
    over them and divided by DENOM (the batch's groups for `fixed`, as the plain RL loop does; the
    informative ones for `dynamic`, whose dropped groups are not in the batch). False: nothing to do."""
    informative = [g for g in groups if g[2].std() > 0]
    if not informative:
        return False
    loss = 0.0
    for lp, (t, sample, r) in zip(sim.word_logprobs([g[0] for g in informative]), informative):
        adv = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
        loss = loss - (adv * lp[sample]).mean() / denom
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(sim.m.parameters(), 1.0)
    opt.step()
    return True


def run_arm(sim, warm, arm, a, by_word, probe, held):
    """RL from the warm start until --budget trials are sampled; prints `ckpt` and `result` lines."""
    sim.m.load_state_dict(warm)
    opt = torch.optim.AdamW(sim.m.parameters(), lr=a.rl_lr, weight_decay=0.01)
    # The same sampling noise and planned tasks at the start of every arm: a paired comparison.
    torch.manual_seed(1000 + a.seed)
    plan_rng = random.Random(a.seed)
    extras = word_balanced(random.Random(2000 + a.seed), by_word)
    marks = [a.budget * k // a.checkpoints for k in range(a.checkpoints + 1)]
    st = dict(trials=0, groups=0, informative=0, extra=0, updates=0, batches=0, short=0, reward=0.0)
    done = []

    def reach(upto):
        """Evaluate the current policy at every checkpoint below UPTO not yet evaluated."""
        while len(done) < len(marks) and marks[len(done)] < upto:
            done.append((sim.p_correct(probe), sim.p_correct(held)))
            print(f"ckpt arm={arm} seed={a.seed} budget={marks[len(done) - 1]} trials={st['trials']} "
                  f"updates={st['updates']} train={done[-1][0]:.4f} heldout={done[-1][1]:.4f}", flush=True)

    while st["trials"] + a.group <= a.budget:
        planned, groups, informative, spent = [plan_rng.choice(ts) for ts in by_word], [], 0, 0
        while st["trials"] + a.group <= a.budget:
            if planned:
                task = planned.pop(0)
            elif arm == "dynamic" and informative < a.min_informative and spent < a.max_extra:
                task, spent = next(extras), spent + 1
            else:
                break
            reach(st["trials"] + a.group)
            sample, r = sample_group(sim, task, a.group)
            groups.append((task, sample, r))
            informative += int(r.std() > 0)
            st["trials"] += a.group
            st["reward"] += r.sum().item()
        st["groups"] += len(groups)
        st["informative"] += informative
        st["extra"] += spent
        st["batches"] += 1
        st["short"] += int(arm == "dynamic" and informative < a.min_informative)
        denom = len(groups) if arm == "fixed" else informative
        st["updates"] += int(update(sim, opt, groups, denom))
    reach(float("inf"))
    dropped = (st["groups"] - st["informative"]) / max(st["groups"], 1)
    words = ",".join(f"{w}:{sim.p_correct([t for t in held if t['word'] == i]):.3f}" for i, w in enumerate(make_tasks.WORDS))
    print(f"result arm={arm} seed={a.seed} budget={a.budget} trials={st['trials']} batches={st['batches']} "
          f"updates={st['updates']} groups={st['groups']} informative={st['informative']} "
          f"zero_variance={dropped:.4f} extra={st['extra']} short_batches={st['short']} "
          f"sampled_reward={st['reward'] / max(st['trials'], 1):.4f} "
          f"train={done[-1][0]:.4f} heldout={done[-1][1]:.4f} heldout_by_word={words}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=make_tasks.REPEAT, help="extra mentions of the word")
    ap.add_argument("--sft-steps", type=int, default=30)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--rl-steps", type=int, default=40)
    ap.add_argument("--rl-lr", type=float, default=1e-3)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--every", type=int, default=10, help="print every N steps")
    ap.add_argument("--arms", help="compare at an equal trial budget instead: fixed, dynamic or fixed,dynamic")
    ap.add_argument("--budget", type=int, default=960, help="sampled trials per arm (--arms)")
    ap.add_argument("--checkpoints", type=int, default=4, help="evaluations over the budget (--arms)")
    ap.add_argument("--min-informative", type=int, default=3, help="N: informative groups per batch (dynamic)")
    ap.add_argument("--max-extra", type=int, help="M: extra groups per batch (dynamic) [4 x N, rollout's default]")
    a = ap.parse_args()
    arms = a.arms.split(",") if a.arms else []
    if any(x not in ("fixed", "dynamic") for x in arms):
        ap.error(f"--arms {a.arms}: each arm must be fixed or dynamic")
    if a.max_extra is None:
        a.max_extra = 4 * a.min_informative
    torch.set_num_threads(1)
    tok = transformers.AutoTokenizer.from_pretrained(make_model.TOKENIZER)
    all_tasks = tasks(tok, a.repeat)
    train = [t for t in all_tasks if not t["held"]]
    held = [t for t in all_tasks if t["held"]]
    probe = train[:: len(train) // 24]
    demos = [t for t in train if t["id"] in make_tasks.demo_ids()]
    torch.manual_seed(a.seed)
    sim = Sim(transformers.Qwen3ForCausalLM(make_model.config()))
    rng = random.Random(a.seed)
    print(f"{len(train)} train / {len(held)} held-out tasks, {len(demos)} demonstrations, "
          f"prompt {held[0]['plen']} tokens, repeat {a.repeat}")
    print(f"{'phase':>5} {'step':>4} {'loss/reward':>11} {'p(word) train':>13} {'held-out':>8}")
    show = lambda phase, s, x: print(f"{phase:>5} {s:>4} {x:>11.4f} {sim.p_correct(probe):>13.3f} {sim.p_correct(held):>8.3f}", flush=True)
    show("init", 0, float("nan"))
    opt = torch.optim.AdamW(sim.m.parameters(), lr=a.sft_lr, weight_decay=0.01)
    for s in range(1, a.sft_steps + 1):
        opt.zero_grad()
        loss = sim.sft_loss(demos)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(sim.m.parameters(), 1.0)
        opt.step()
        if s % a.every == 0 or s == a.sft_steps:
            show("sft", s, loss.item())
    by_word = [[t for t in train if t["word"] == i] for i in range(len(make_tasks.WORDS))]
    if arms:
        warm = {k: v.detach().clone() for k, v in sim.m.state_dict().items()}
        for arm in arms:
            run_arm(sim, warm, arm, a, by_word, probe, held)
        return
    # A fresh optimizer for RL, as run.sh starts GSPO without SFT's optimizer state.
    opt = torch.optim.AdamW(sim.m.parameters(), lr=a.rl_lr, weight_decay=0.01)
    for s in range(1, a.rl_steps + 1):
        batch = [rng.choice(ts) for ts in by_word]
        loss, rewards = 0.0, []
        for lp, t in zip(sim.word_logprobs(batch), batch):
            sample = torch.multinomial(lp.exp().detach(), a.group, replacement=True)
            r = (sample == t["wid"]).float()
            rewards.append(r.mean().item())
            if r.std() > 0:
                adv = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
                loss = loss - (adv * lp[sample]).mean() / len(batch)
        if torch.is_tensor(loss):
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(sim.m.parameters(), 1.0)
            opt.step()
        if s % a.every == 0 or s == a.rl_steps:
            show("rl", s, sum(rewards) / len(rewards))


if __name__ == "__main__":
    main()
