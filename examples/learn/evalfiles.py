"""Reading a learn run's zstd JSON Lines files, shared by words.py and seeds.py."""
import json
import sys

import zstandard


def records(path):
    """The records of one .jsonl.zst file; a line that is not JSON ends the script naming file and line.

    Lines end at "\n" only: str.splitlines() would also break at U+2028, U+2029 and U+0085, which
    serde_json leaves unescaped inside strings (a random policy's output can hold them)."""
    with open(path, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        for n, line in enumerate(reader.read().decode().split("\n"), 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}: line {n}: not JSON: {e}")


def graded(r):
    """Whether a trajectory counts towards a reward: graded, and not failed by the infrastructure
    (`infra_failure`, or a termination `infra:STAGE`), as in `report` and `validate`."""
    infra = r.get("infra_failure") or str(r.get("termination", "")).startswith("infra")
    return not infra and r.get("reward") is not None
