"""The README is a manual that works: its Python example runs as written on a fresh clone, and the page keeps
to its limits (length, no dates, no issue numbers, every result linked to docs/results.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def test_python_blocks_are_found():
    text = "intro\n```python\nprint(1)\n```\n```bash\nls\n```\n```python\nx = 2\n```\n"
    assert python_blocks(text) == ["print(1)\n", "x = 2\n"]


def test_readme_example_runs_as_written(tmp_path):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) == 1, f"the README should hold one Python example, found {len(blocks)}"
    code = blocks[0]
    assert len(code.splitlines()) <= 25, "the README's Python example should stay within 25 lines"
    script = tmp_path / "readme_example.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"the README's example failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    last = done.stdout.strip().splitlines()[-1]
    assert "pays" in last, f"the example should end with a verdict on drafting; it printed {last!r}"
    assert (tmp_path / "my-run" / "run.json").is_file(), "the example should have written its trace run"


def test_readme_stays_a_manual():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert not re.search(r"20\d{2}-\d{2}-\d{2}", text), "no dates in the README (history lives in git)"
    assert not re.search(r"(?<![\w&/])#\d+\b", text), "no internal issue numbers in the README"


def test_readme_results_link_sections_of_results_md():
    text = README.read_text(encoding="utf-8")
    anchors = re.findall(r"docs/results\.md#([\w-]+)", text)
    assert anchors, "the README's results should link their sections of docs/results.md"
    headings = re.findall(r"^#{2,3} (.+)$", RESULTS.read_text(encoding="utf-8"), flags=re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    missing = sorted(set(anchors) - slugs)
    assert not missing, f"README links sections that docs/results.md does not have: {missing}"
