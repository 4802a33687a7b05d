#!/bin/bash
# Adapted from Harbor's multi-reward recipe: the base image already has pytest (no network in the verifier),
# and the workdir is put on the path as many Harbor verifiers do (the tests import the agent's module).
mkdir -p /logs/verifier
correctness=0
performance=0

PYTHONPATH=/app python3 -m pytest -p no:cacheprovider /tests/test_correctness.py -rA && correctness=1
PYTHONPATH=/app python3 -m pytest -p no:cacheprovider /tests/test_performance.py -rA && performance=1

python3 -c "
import json
json.dump({'correctness': $correctness, 'performance': $performance}, open('/logs/verifier/reward.json', 'w'))
"
