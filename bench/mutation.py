"""Mutation testing of the modules that carry Laya's guarantees (slow: not part of CI).

    .venv/bin/pip install -e ".[test,dev]"
    nice -n 15 python bench/mutation.py           # the guarantee functions, one child (hours on two cores)
    python bench/mutation.py 'laya.router.reaper.*'      # the functions one glob names
    python bench/mutation.py --resume             # go on with what a stopped run left
    python bench/mutation.py --workdir /tmp/codec 'laya.codec.x_decode_request*' --tests tests/unit/test_schema_codec.py
    python bench/mutation.py --list --also /tmp/codec   # report, merging another run's results

mutmut changes the code one small step at a time (``==`` to ``!=``, a constant, a
deleted call) and runs the tests that reach the changed function; a change that
no test notices ("survived") is a guarantee no test protects. The modules:

* ``laya/worker/jobs.py``: the job allowlist (:func:`laya.worker.jobs.is_laya_job`), the
  duplicate-delivery guards and the job's own error results;
* ``laya/results.py``: the write-once result script and its callers;
* ``laya/router/reaper.py``: lost jobs, retries, non-Laya jobs in the started registry;
* ``laya/codec.py``: the size limits and the bad-input messages;
* ``laya/router/stages.py``: admission (per model and lane, deadlines);
* ``laya/router/ingress.py``: the atomic commit.

Only the functions that carry those guarantees are mutated (``GUARANTEES``,
mutmut's mutant-name globs; class methods are ``xǁClassǁmethod``): mutating the
router's other stages and the codec's message wording would take hours and
test things the guarantees do not rest on.

It runs in a copy of the checkout (``--workdir``, default a temporary folder),
so the working tree is never changed, and only the in-process tests of those
modules (``TESTS``): tests that start ``laya`` as a subprocess would import the
unmutated package. Results (every survivor, with its diff) go to
``bench/results/mutation_run.txt``; ``bench/results/mutation.md`` is the
reviewed account: which survivors are equivalent, and why.
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

MODULES = ["laya/worker/jobs.py", "laya/results.py", "laya/router/reaper.py", "laya/codec.py", "laya/router/stages.py",
           "laya/router/ingress.py"]
GUARANTEES = [
    "laya.worker.jobs.*",  # the allowlist, the duplicate guards, a failed job's answer
    "laya.results.*",  # the write-once script and its callers
    "laya.router.reaper.*",
    "laya.codec.x_decode_request*",  # the limits
    "laya.codec.x_salvage_identity*",
    "laya.codec.x__short_repr*",  # the bound on a hostile value's echo
    "laya.router.stages.x\u01c1AdmissionStage\u01c1*",
    "laya.router.ingress.x\u01c1Router\u01c1commit*",
    "laya.router.ingress.x\u01c1Router\u01c1_write*",
    "laya.router.ingress.x\u01c1Router\u01c1_job_data*",
    "laya.router.stages.x_accepted_at*",  # a deadline's start
    "laya.router.ingress.x__admitted*",
    "laya.router.ingress.x__fail*",
]
TESTS = [
    "tests/unit/test_schema_codec.py",
    "tests/unit/test_cache.py",
    "tests/integration/test_router.py",
    "tests/integration/test_worker.py",
    "tests/integration/test_security.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_pipeline_features.py",
    "tests/integration/test_semantic.py",  # the worker's semantic record, in _generate
    # Tests that run `laya` (or a worker script) as a subprocess see the installed, unmutated package.
    "-k", ("not password and not tls and not killed and not real_processes and not sigterm and not aof "
           "and not duplicate_delivery and not overload and not cannot_reach and not signal and not reclaimed "
           "and not stops_listening"),
]


def mutmut_config(modules: list[str], tests: list[str]) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(f'"{item}"' for item in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        f"source_paths = {toml_list(['laya'])}\n"
        f"only_mutate = {toml_list(modules)}\n"
        f"also_copy = {toml_list(['tests', 'configs'])}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(tests)}\n"
        # llama.cpp's CPU threads do not survive a fork: a mutant forked from the process that ran the
        # tests to collect coverage hangs in its first generation. The fork server has run none.
        'process_isolation = "forkserver"\n'
        # The integration tests start Valkey servers and load llama.cpp: slower than mutmut assumes.
        "timeout_multiplier = 5.0\n"
        "timeout_constant = 20.0\n"
    )


def prepare(workdir: Path, modules: list[str], tests: list[str]) -> None:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    for name in ("laya", "tests", "configs"):
        shutil.copytree(ROOT / name, workdir / name, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = (ROOT / "pyproject.toml").read_text()
    (workdir / "pyproject.toml").write_text(pyproject + mutmut_config(modules, tests))


def mutmut(workdir: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=workdir, capture_output=True, text=True,
                          check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                         f"{done.stderr[-3000:]}")
    return done.stdout


def statuses(workdir: Path, globs: list[str]) -> dict[str, str]:
    """Status of each mutant the globs select, as the run in ``workdir`` left it."""
    listing = mutmut(workdir, "results", "--all", "true", check=False)
    found = {}
    for line in listing.splitlines():
        name, _, status = line.strip().rpartition(":")
        if name and any(fnmatch.fnmatch(name.strip(), g) for g in globs):
            found[name.strip()] = status.strip()
    return found


def report(workdirs: list[Path], globs: list[str], note: str) -> str:
    """Every selected mutant's status (merged over the workdirs: a result beats "not checked"), then each
    survivor's diff and the mutants not run, by function."""
    merged: dict[str, tuple[str, Path]] = {}
    for workdir in workdirs:
        for name, status in statuses(workdir, globs).items():
            if name not in merged or merged[name][0] == "not checked":
                merged[name] = (status, workdir)
    counts: dict[str, int] = {}
    not_run: dict[str, int] = {}
    for name, (status, _) in merged.items():
        counts[status] = counts.get(status, 0) + 1
        if status == "not checked":
            function = name.rsplit("__mutmut_", 1)[0]
            not_run[function] = not_run.get(function, 0) + 1
    out = ["mutmut on " + " ".join(globs) + (f"; {note}" if note else ""),
           "tests: " + " ".join(TESTS), "",
           "status counts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    if not_run:
        out += ["not run: " + ", ".join(f"{f} ({n})" for f, n in sorted(not_run.items())), ""]
    for name, (status, workdir) in sorted(merged.items()):
        if status == "survived":
            out += [f"== {name}", mutmut(workdir, "show", name, check=False).strip(), ""]
    return "\n".join(out) + "\n"


def unfinished(workdir: Path, globs: list[str]) -> list[str]:
    return [name for name, status in statuses(workdir, globs).items() if status == "not checked"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("globs", nargs="*", default=GUARANTEES,
                        help="mutant-name globs to run (default: the guarantee functions)")
    parser.add_argument("--children", type=int, default=1, help="mutmut children (each runs the tests once)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "laya-mutation")
    parser.add_argument("--tests", nargs="+", metavar="FILE",
                        help="test files to run instead of the default ones (a fresh --workdir)")
    parser.add_argument("--resume", action="store_true",
                        help="keep --workdir and its results; run only the selected mutants it has not run")
    parser.add_argument("--also", type=Path, nargs="*", default=[], metavar="WORKDIR",
                        help="other runs' workdirs whose results the report merges in")
    parser.add_argument("--list", action="store_true", help="report the runs in the workdirs, run nothing")
    parser.add_argument("--output", default="mutation_run.txt", metavar="NAME",
                        help="the report's file name in bench/results/ (default mutation_run.txt)")
    args = parser.parse_args()
    note = ""
    if not args.list:
        names = args.globs
        if args.resume:
            names = unfinished(args.workdir, args.globs)
            if not names:  # with no names mutmut would run every unrun mutant of the modules
                raise SystemExit(f"nothing left to run in {args.workdir}")
        else:
            tests = [*(args.tests or [t for t in TESTS if t.endswith(".py")]), *TESTS[-2:]]
            prepare(args.workdir, MODULES, tests)
        started = time.monotonic()
        # Progress goes to a log (tail it); mutmut's own spinner would be captured until the end.
        with (args.workdir / "mutmut.log").open("a") as log:
            done = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(args.children),
                                   *names], cwd=args.workdir, stdout=log, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            raise SystemExit(f"mutmut run failed ({done.returncode}); see {args.workdir / 'mutmut.log'}")
        note = f"{(time.monotonic() - started) / 60:.0f} min"
    text = report([args.workdir, *args.also], args.globs, note)
    (RESULTS / args.output).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
