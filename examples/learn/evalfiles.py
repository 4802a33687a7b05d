"""Reading a learn run's zstd JSON Lines files, shared by words.py and seeds.py."""
import json
import sys

import zstandard


def records(path):
    """The records of one .jsonl.zst file; a line that is not JSON ends the script naming file and line."""
    with open(path, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        for n, line in enumerate(reader.read().decode().splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}: line {n}: not JSON: {e}")
