#!/usr/bin/env python3
"""Regenerate testdata/tasks/: real SWE-bench-style tasks built from small PyPI projects.

For each project: download its sdist (pip download), prune docs, and build a git repository with real
history, the way SWE-bench repositories leak their fixes:

    c1  Import <project> <version>          (upstream code, tag v<version>)
    c2  <a plausible refactor>              (one function mutated: the injected bug) = base_commit
    c3  Fix <function> (#<n>)               (gold patch + a regression test file = test patch; branch fix/…)
    c4  Release notes                       (main)

The repository is stored as `repos/<id>.bundle` (all refs). FAIL_TO_PASS / PASS_TO_PASS are measured, not
written by hand: the tests run in the base image (`lego-rl/base:trixie`, see bootstrap-base-image.sh) on
base+test_patch and on gold+test_patch; F2P = failed then passed, P2P = passed both times. The script fails
if a task has no F2P test. Harbor tasks under testdata/tasks/harbor/ are hand-written; their records are
appended as written below.

Deterministic (fixed commit dates and identities). Needs: pip, git, docker, the base image.
Usage: scripts/make_testdata_tasks.py [--out testdata/tasks]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

BASE_IMAGE = "lego-rl/base:trixie"
TEST_CMD = "python3 -m pytest -p no:cacheprovider -o addopts="

PROJECTS = [
    dict(
        id="inflection__ordinal-teens",
        sdist="inflection==0.5.1",
        repo="jpvanhal/inflection",
        prune=["docs"],
        file="inflection/__init__.py",
        old="    if number % 100 in (11, 12, 13):",
        new="    if number % 10 in (11, 12, 13):",
        refactor="Simplify ordinal suffix lookup",
        func="ordinal",
        instruction="`inflection.ordinal` returns the wrong suffix for 11, 12 and 13 (and 111, 112, ...): "
        "`ordinalize(11)` gives '11st' instead of '11th'. Fix it without changing other results.",
        env="PYTHONPATH=.",
        tests=["test_inflection.py"],
        regression="""\
import inflection


def test_teens_take_th():
    assert [inflection.ordinal(n) for n in (11, 12, 13, 111, 1012)] == ["th"] * 5


def test_other_suffixes_unchanged():
    assert inflection.ordinalize(21) == "21st"
    assert inflection.ordinalize(102) == "102nd"
""",
    ),
    dict(
        id="semver__bump-minor-patch",
        sdist="semver==3.1.2",
        repo="python-semver/python-semver",
        prune=["docs", "changelog.d", "uv.lock", "CHANGELOG.rst", "CONTRIBUTORS", "CITATION.cff"],
        file="src/semver/version.py",
        old="        return cls(self._major, self._minor + 1)\n",
        new="        return cls(self._major, self._minor + 1, self._patch)\n",
        refactor="Keep version fields when bumping",
        func="Version.bump_minor",
        instruction="`semver.Version.parse('3.4.5').bump_minor()` returns 3.5.5; bumping the minor part must "
        "reset the patch part to 0 (3.5.0), as the SemVer spec requires.",
        env="PYTHONPATH=src",
        tests=["tests/test_bump.py"],
        regression="""\
import semver


def test_bump_minor_resets_patch():
    assert str(semver.Version.parse("3.4.5").bump_minor()) == "3.5.0"


def test_bump_minor_drops_prerelease():
    assert str(semver.Version.parse("1.2.3-rc.1+b5").bump_minor()) == "1.3.0"
""",
    ),
    dict(
        id="cachetools__lru-recency",
        sdist="cachetools==8.0.2",
        repo="tkem/cachetools",
        prune=["docs"],
        prune_tests_except=["__init__.py", "test_lru.py", "test_cache.py", "test_fifo.py", "test_keys.py"],
        file="src/cachetools/__init__.py",
        old="        value = cache_getitem(self, key)\n        try:\n            self.__order.move_to_end(key)\n",
        new="        value = cache_getitem(self, key)\n        try:\n            self.__order.move_to_end(key, last=False)\n",
        refactor="Avoid reordering on cache reads",
        func="LRUCache.__getitem__",
        instruction="`cachetools.LRUCache` evicts the wrong entry: reading a key should make it the most "
        "recently used, but after `c[a]` the entry `a` is the first to be evicted. Fix the eviction order.",
        env="PYTHONPATH=src",
        tests=["tests/test_lru.py", "tests/test_cache.py"],
        regression="""\
import cachetools


def test_read_refreshes_recency():
    cache = cachetools.LRUCache(maxsize=2)
    cache["a"] = 1
    cache["b"] = 2
    assert cache["a"] == 1
    cache["c"] = 3
    assert sorted(cache) == ["a", "c"]
""",
    ),
    dict(
        id="ordered-set__discard-index",
        sdist="ordered-set==4.1.0",
        repo="rspeer/ordered-set",
        prune=[],
        file="ordered_set/__init__.py",
        old="                    self.map[k] = v - 1\n",
        new="                    self.map[k] = v\n",
        refactor="Speed up discard",
        func="OrderedSet.discard",
        instruction="After `OrderedSet.discard`, `index()` of the later items is off by one "
        "(`s = OrderedSet('abc'); s.discard('a'); s.index('c')` gives 2, not 1). Fix discard.",
        env="PYTHONPATH=.",
        tests=["test/test_ordered_set.py"],
        regression="""\
from ordered_set import OrderedSet


def test_index_after_discard():
    s = OrderedSet("abcd")
    s.discard("b")
    assert [s.index(x) for x in "acd"] == [0, 1, 2]
""",
    ),
    dict(
        id="iniconfig__semicolon-comments",
        sdist="iniconfig==2.3.1",
        repo="pytest-dev/iniconfig",
        prune=["uv.lock"],
        file="src/iniconfig/_parse.py",
        old="    return c in COMMENTCHARS\n",
        new='    return c == "#"\n',
        refactor="Treat only hash lines as comments",
        func="iscommentline",
        instruction="iniconfig no longer treats lines starting with ';' as comments; "
        "`IniConfig('x', data='; note\\n[s]\\na=1')` raises a ParseError. Restore ';' comment lines.",
        env="PYTHONPATH=src",
        tests=["testing/test_iniconfig.py"],
        regression="""\
from iniconfig import IniConfig


def test_semicolon_comment_line():
    config = IniConfig("x.ini", data="; note\\n[s]\\n  ; indented\\na = 1\\n")
    assert config["s"]["a"] == "1"
""",
    ),
    dict(
        id="xmltodict__attr-namespace",
        sdist="xmltodict==1.0.4",
        repo="martinblech/xmltodict",
        prune=[],
        file="xmltodict.py",
        old="        i = full_name.rfind(self.namespace_separator)\n",
        new="        i = full_name.find(self.namespace_separator)\n",
        refactor="Split namespaced names once",
        func="_DictSAXHandler._build_name",
        instruction="xmltodict.parse(xml, process_namespaces=True, namespaces={...}) no longer collapses "
        "namespaced names: with namespaces={'http://a.com/': 'ns_a'}, '<a:x>' stays 'http://a.com/:x' "
        "instead of 'ns_a:x'. Namespace URIs contain ':' themselves.",
        env="PYTHONPATH=.",
        tests=["tests/test_xmltodict.py"],
        regression="""\
import xmltodict


def test_namespaced_element_is_collapsed():
    xml = '<root xmlns:a="http://a.com/"><a:x>1</a:x></root>'
    res = xmltodict.parse(xml, process_namespaces=True, namespaces={"http://a.com/": "ns_a"})
    assert res["root"]["ns_a:x"] == "1"
""",
    ),
]

HARBOR = [
    dict(
        id="harbor__hello-world",
        dir="harbor/hello-world",
        instruction_file="harbor/hello-world/instruction.md",
        workdir="/app",
        agent_s=120.0,
        eval_s=120.0,
    ),
    dict(
        id="harbor__multi-reward",
        dir="harbor/multi-reward",
        instruction_file="harbor/multi-reward/instruction.md",
        workdir="/app",
        agent_s=300.0,
        eval_s=180.0,
    ),
    # lego-rl's own: a verifier that writes only reward.txt and runs the agent's module (the
    # adversarial tests' reward-file tricks need one).
    dict(
        id="harbor__reward-txt",
        dir="harbor/reward-txt",
        instruction_file="harbor/reward-txt/instruction.md",
        workdir="/app",
        agent_s=120.0,
        eval_s=120.0,
    ),
]


def sh(*args, cwd=None, env=None, check=True, capture=False):
    res = subprocess.run(args, cwd=cwd, env=env, check=False, text=True,
                         stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)
    if check and res.returncode != 0:
        sys.exit(f"command failed ({res.returncode}): {' '.join(args)}\n{res.stderr if capture else ''}")
    return res


def git_env(n):
    env = dict(os.environ)
    date = f"2024-01-{10 + n:02d}T12:00:00+00:00"
    env.update(GIT_AUTHOR_NAME="Upstream Maintainer", GIT_AUTHOR_EMAIL="maintainer@example.org",
               GIT_COMMITTER_NAME="Upstream Maintainer", GIT_COMMITTER_EMAIL="maintainer@example.org",
               GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return env


def commit(repo, n, msg):
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-q", "--no-verify", "-m", msg, cwd=repo, env=git_env(n))
    return sh("git", "rev-parse", "HEAD", cwd=repo, capture=True).stdout.strip()


def fetch_sdist(spec, cache):
    name, ver = spec.split("==")
    cache.mkdir(parents=True, exist_ok=True)
    for f in cache.iterdir():
        if f.name.lower().replace("_", "-").startswith(f"{name}-{ver}".lower()) and f.name.endswith(".tar.gz"):
            return f
    sh(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", spec,
       "-d", str(cache))
    return fetch_sdist(spec, cache)


def run_tests(repo, p):
    """Run the task's tests in the base image; returns {nodeid: status} from JUnit XML."""
    cmd = f"cd /testbed && {p['env']} {TEST_CMD} --junitxml=/tmp/j.xml {' '.join(p['tests'])} " \
          f"tests_lego/test_regression.py >/dev/null 2>&1; cat /tmp/j.xml"
    res = sh("docker", "run", "--rm", "--network", "none", "-v", f"{repo}:/src:ro", BASE_IMAGE, "bash", "-c",
             f"cp -r /src /testbed && {cmd}", capture=True)
    files = p["tests"] + ["tests_lego/test_regression.py"]
    out = {}
    for case in ET.fromstring(res.stdout).iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        node = None
        for f in files:
            mod = f[:-3].replace("/", ".")
            if cls == mod or cls.startswith(mod + "."):
                rest = cls[len(mod):].lstrip(".")
                node = "::".join([f] + ([*rest.split(".")] if rest else []) + [name])
        if node is None:
            continue
        tags = {c.tag for c in case}
        status = "FAILED" if "failure" in tags else "ERROR" if "error" in tags else \
            "SKIPPED" if "skipped" in tags else "PASSED"
        out[node] = status
    return out


def build_task(p, out, cache, work):
    sdist = fetch_sdist(p["sdist"], cache)
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    sh("tar", "xzf", str(sdist), "-C", str(src))
    (top,) = list(src.iterdir())
    repo = work / p["id"]
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(top, repo)
    for rel in p["prune"]:
        t = repo / rel
        shutil.rmtree(t) if t.is_dir() else t.unlink(missing_ok=True)
    if "prune_tests_except" in p:
        for f in (repo / "tests").iterdir():
            if f.name not in p["prune_tests_except"]:
                f.unlink()
    for junk in list(repo.rglob("*.egg-info")) + list(repo.rglob("__pycache__")):
        shutil.rmtree(junk)
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    version = p["sdist"].split("==")[1]
    c1 = commit(repo, 0, f"Import {p['sdist'].split('==')[0]} {version}")
    sh("git", "tag", f"v{version}", cwd=repo)
    target = repo / p["file"]
    text = target.read_text()
    assert text.count(p["old"]) == 1, f"{p['id']}: mutation anchor not unique"
    target.write_text(text.replace(p["old"], p["new"]))
    base = commit(repo, 1, p["refactor"])
    target.write_text(text)
    (repo / "tests_lego").mkdir()
    (repo / "tests_lego/test_regression.py").write_text(p["regression"])
    fix = commit(repo, 2, f"Fix {p['func']} regression (#{100 + len(p['id'])})")
    sh("git", "branch", f"fix/{p['func'].lower().replace('.', '-')}", cwd=repo)
    (repo / "RELEASE_NOTES.md").write_text(f"# Unreleased\n\n- Fixed {p['func']}.\n")
    commit(repo, 3, "Release notes")
    gold = sh("git", "diff", base, fix, "--", ".", ":!tests_lego", cwd=repo, capture=True).stdout
    test_patch = sh("git", "diff", base, fix, "--", "tests_lego", cwd=repo, capture=True).stdout
    (out / "repos").mkdir(parents=True, exist_ok=True)
    bundle = out / "repos" / f"{p['id']}.bundle"
    sh("git", "bundle", "create", "-q", str(bundle), "--all", cwd=repo)

    # Measure F2P/P2P: base + test patch, then gold + test patch.
    sh("git", "checkout", "-q", base, cwd=repo)
    subprocess.run(["git", "apply"], input=test_patch, text=True, cwd=repo, check=True)
    before = run_tests(repo, p)
    subprocess.run(["git", "apply"], input=gold, text=True, cwd=repo, check=True)
    after = run_tests(repo, p)
    sh("git", "checkout", "-q", "-f", "main", cwd=repo)
    sh("git", "clean", "-qfdx", cwd=repo)
    f2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) in ("FAILED", "ERROR", None))
    p2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
    if not f2p:
        sys.exit(f"{p['id']}: no FAIL_TO_PASS test (before={before})")
    broken = sorted(t for t, s in after.items() if s in ("FAILED", "ERROR"))
    print(f"{p['id']}: base {base[:8]}  F2P {len(f2p)}  P2P {len(p2p)}  broken-after-gold {len(broken)}",
          file=sys.stderr)
    return {
        "schema": "lego-rl/task/v1",
        "id": p["id"],
        "source": "lego_rl",
        "repo": p["repo"],
        "base_commit": base,
        "instruction": p["instruction"],
        "gold_patch": gold,
        "test_patch": test_patch,
        "fail_to_pass": f2p,
        "pass_to_pass": p2p,
        "environment": {
            "repo_source": {"kind": "bundle", "path": f"repos/{p['id']}.bundle"},
            "workdir": "/testbed",
        },
        "grader": {"kind": "swebench", "test_cmd": f"{p['env']} {TEST_CMD}",
                   "test_files": p["tests"] + ["tests_lego/test_regression.py"]},
        "timeouts": {"setup_s": 120.0, "agent_s": 600.0, "eval_s": 300.0},
        "metadata": {"upstream": p["sdist"], "injected_function": p["func"], "fix_commit": fix,
                     "import_commit": c1},
    }


def harbor_task(h, out):
    d = out / h["dir"]
    return {
        "schema": "lego-rl/task/v1",
        "id": h["id"],
        "source": "harbor",
        "instruction": (out / h["instruction_file"]).read_text(),
        "environment": {
            "dockerfile": (d / "environment/Dockerfile").read_text(),
            "context": f"{h['dir']}/environment",
            "workdir": h["workdir"],
        },
        "grader": {"kind": "harbor", "tests_dir": f"{h['dir']}/tests"},
        "timeouts": {"setup_s": 120.0, "agent_s": h["agent_s"], "eval_s": h["eval_s"]},
        "metadata": {"solution_dir": f"{h['dir']}/solution"},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "testdata/tasks"))
    ap.add_argument("--cache", default=str(Path.home() / ".cache/lego-rl/sdists"))
    args = ap.parse_args()
    out = Path(args.out)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in PROJECTS:
            records.append(build_task(p, out, Path(args.cache), Path(tmp)))
    records += [harbor_task(h, out) for h in HARBOR]
    with open(out / "tasks.jsonl.part", "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(out / "tasks.jsonl.part", out / "tasks.jsonl")
    print(f"wrote {len(records)} tasks to {out / 'tasks.jsonl'}", file=sys.stderr)


if __name__ == "__main__":
    main()
