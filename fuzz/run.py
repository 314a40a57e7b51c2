"""Run every fuzz target (``fuzz/fuzz_*.py``) for a bounded time, one subprocess each (a crash fails that target,
not the run). ``python fuzz/run.py --seconds 60`` ; ``--runs N`` stops each after N inputs instead;
``--plain`` uses the plain mutation driver even where atheris is installed; names select targets
(``python fuzz/run.py --seconds 600 record columns``). Prints the inputs each target ran; exits 1 on a failure.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import tempfile
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def have_atheris():
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def run_target(path, seconds, runs, plain):
    work = tempfile.mkdtemp(prefix="localmq-fuzz-run-")  # the target's files and corpus, removed after it
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TMPDIR=work)
    if plain:
        cmd = [sys.executable, path, "--plain"]
        cmd += ["--runs", str(runs)] if runs else ["--seconds", str(seconds)]
    else:
        cmd = [sys.executable, path, "-rss_limit_mb=4096", "-print_final_stats=1"]
        cmd += [f"-runs={runs}"] if runs else [f"-max_total_time={int(seconds)}"]
        os.makedirs(os.path.join(work, "corpus"))
        cmd.append(os.path.join(work, "corpus"))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = proc.stdout + proc.stderr
    m = re.findall(r"Done (\d+) runs", out) or re.findall(r"stat::number_of_executed_units:\s*(\d+)", out)
    return proc.returncode, int(m[-1]) if m else None, time.monotonic() - t0, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--runs", type=int, default=0)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("targets", nargs="*")
    args = ap.parse_args(argv)
    plain = args.plain or not have_atheris()
    paths = sorted(glob.glob(os.path.join(HERE, "fuzz_*.py")))
    if args.targets:
        paths = [p for p in paths if os.path.basename(p)[5:-3] in args.targets]
    failed = 0
    for p in paths:
        rc, n, took, out = run_target(p, args.seconds, args.runs, plain)
        name = os.path.basename(p)[5:-3]
        print(f"{name:16} {'ok' if rc == 0 else 'FAILED (exit %d)' % rc:18} {n if n is not None else '?':>10} inputs"
              f"  {took:6.0f} s  ({'plain' if plain else 'atheris'})", flush=True)
        if rc != 0:
            failed += 1
            sys.stdout.write(out[-4000:] + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
