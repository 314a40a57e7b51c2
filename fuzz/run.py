"""Run every fuzz target (``fuzz/fuzz_*.py``) for a bounded time, one subprocess each (a crash fails that target,
not the run). ``python fuzz/run.py --seconds 60`` ; ``--runs N`` stops each after N inputs instead;
``--plain`` uses the plain mutation driver even where atheris is installed; ``--jobs N`` runs N processes of each
target at once (``--runs`` is split between them); names select targets
(``python fuzz/run.py --seconds 600 record columns``). Prints the inputs each target ran; exits 1 on a failure.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ARTIFACTS = os.path.join(HERE, "artifacts")
CORPUS = os.path.join(HERE, "corpus")


def have_atheris():
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def _command(path, seconds, runs, plain, work, job):
    if plain:
        cmd = [sys.executable, path, "--plain", "--seed", str(job)]
        return cmd + (["--runs", str(runs)] if runs else ["--seconds", str(seconds)])
    # libFuzzer writes a failing, slow or timed-out input (crash-*, slow-unit-*, timeout-*) to its artifact prefix:
    # fuzz/artifacts/ (ignored by git), not the repository's root, and kept after the run's directory goes
    os.makedirs(ARTIFACTS, exist_ok=True)
    cmd = [
        sys.executable,
        path,
        "-rss_limit_mb=4096",
        "-print_final_stats=1",
        f"-seed={job + 1}",
        f"-artifact_prefix={ARTIFACTS}{os.sep}",
    ]
    cmd += [f"-runs={runs}"] if runs else [f"-max_total_time={int(seconds)}"]
    corpus = os.path.join(work, f"corpus-{job}")
    os.makedirs(corpus)
    # the kept corpus of the target (fuzz/corpus/<name>: inputs that reached new code in earlier campaigns), read
    # after the new one; libFuzzer writes only to the first directory, so the kept one is never changed
    kept = os.path.join(CORPUS, os.path.basename(path)[5:-3])
    return cmd + [corpus] + ([kept] if os.path.isdir(kept) else [])


def run_target(path, seconds, runs, plain, jobs=1):
    """Run one target in ``jobs`` processes at once (each with its own seed and ``runs / jobs`` inputs); returns
    (exit code: the first failure's, inputs run in all, seconds, output of the failure or of the last job)."""
    work = tempfile.mkdtemp(prefix="localmq-fuzz-run-")  # the target's files and corpus, removed after it
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TMPDIR=work)
    # fuzz_open_store's stores go to a tmpfs where there is one (its _store_dir); a target ended by libFuzzer does
    # not run its exit handlers, so the directory is made and removed here
    shm = tempfile.mkdtemp(prefix="localmq-fuzz-stores-", dir="/dev/shm") if os.access("/dev/shm", os.W_OK) else work
    env.setdefault("LOCALMQ_FUZZ_STORE_DIR", shm)
    per_job = -(-runs // jobs) if runs else 0
    t0 = time.monotonic()
    procs = []
    try:
        for job in range(jobs):
            log = open(os.path.join(work, f"out-{job}.txt"), "w+")
            procs.append(
                (
                    subprocess.Popen(
                        _command(path, seconds, per_job, plain, work, job),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        text=True,
                        env=env,
                        cwd=ROOT,
                    ),
                    log,
                )
            )
        rc, total, out = 0, 0, ""
        for proc, log in procs:
            code = proc.wait()
            log.seek(0)
            text = log.read()
            log.close()
            m = re.findall(r"Done (\d+) runs", text) or re.findall(r"stat::number_of_executed_units:\s*(\d+)", text)
            total = None if total is None or not m else total + int(m[-1])
            if code == 0 and not plain and "Instrumenting localmq" not in text:
                # atheris ran without coverage of localmq's Python code (imported before instrument_imports): a
                # blind run, not the guided one this reports
                code, text = 2, text + "\nlocalmq was not instrumented: import common before localmq\n"
            if code != 0 and rc == 0:
                rc, out = code, text
            elif rc == 0:
                out = text
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    return rc, total, time.monotonic() - t0, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--runs", type=int, default=0)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="processes per target (each its own seed)")
    ap.add_argument("targets", nargs="*")
    args = ap.parse_args(argv)
    plain = args.plain or not have_atheris()
    paths = sorted(glob.glob(os.path.join(HERE, "fuzz_*.py")))
    if args.targets:
        paths = [p for p in paths if os.path.basename(p)[5:-3] in args.targets]
    failed = 0
    for p in paths:
        rc, n, took, out = run_target(p, args.seconds, args.runs, plain, max(1, args.jobs))
        name = os.path.basename(p)[5:-3]
        print(
            f"{name:16} {'ok' if rc == 0 else 'FAILED (exit %d)' % rc:18} {n if n is not None else '?':>10} inputs"
            f"  {took:6.0f} s  ({'plain' if plain else 'atheris'})",
            flush=True,
        )
        if rc != 0:
            failed += 1
            sys.stdout.write(out[-4000:] + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
