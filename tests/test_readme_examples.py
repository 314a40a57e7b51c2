"""The README's multi-process example, run as a user would paste it (in a fresh interpreter, its store path moved
into the test's directory): it must print what the README says it prints."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_block(marker):
    """The ```python block of README.md that contains ``marker``, and the value its last line's comment promises."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    at = text.index(marker)
    start = text.rindex("```python", 0, at) + len("```python")
    end = text.index("```", at)
    return text[start:end]


def test_the_multiprocessing_example_runs_as_pasted(tmp_path):
    code = readme_block('PATH = "/tmp/jobs-store"')
    promised = code.strip().splitlines()[-1].rsplit("#", 1)[1].strip()
    assert promised == "100"
    code = code.replace('"/tmp/jobs-store"', repr(str(tmp_path / "jobs-store")))
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [promised]
