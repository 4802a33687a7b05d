#!/bin/bash
# A verifier like most Harbor tasks': it runs the agent's module (the workdir on the path) and writes
# only reward.txt (no JSON reward). lego-rl's adversarial tests use it for the reward-file tricks (a planted
# JSON reward, a read-only or rewritten reward.txt), which need a verifier that runs the agent's code.
mkdir -p /logs/verifier
if PYTHONPATH=/app python3 -m pytest -p no:cacheprovider /tests/test_greet.py -rA; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
