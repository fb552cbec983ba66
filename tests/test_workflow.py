"""The GitHub Actions workflow that tests the book and publishes it to GitHub Pages: valid against GitHub's workflow
schema (checked offline with check-jsonschema's vendored copy), and running what `make test` runs."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
CHECK = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")


def _validate(path: Path) -> subprocess.CompletedProcess:
    if CHECK is None:
        pytest.fail("check-jsonschema is missing: it is in requirements.txt (make setup installs it)")
    return subprocess.run([CHECK, "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True)


def test_the_workflow_is_valid_and_a_broken_one_is_not(tmp_path):
    r = _validate(WORKFLOW)
    assert r.returncode == 0, r.stdout + r.stderr
    broken = yaml.safe_load(WORKFLOW.read_text())
    broken["jobs"]["test"]["runs-on"] = None            # a job with nowhere to run
    del broken["jobs"]["deploy"]["steps"]
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    assert _validate(tmp_path / "broken.yml").returncode != 0


def test_it_tests_like_ci_and_publishes_the_built_book_from_main_only():
    w = yaml.safe_load(WORKFLOW.read_text())
    on = w[True] if True in w else w["on"]                 # YAML 1.1 reads the key `on` as True
    assert on["push"]["branches"] == ["main"] and "pull_request" in on
    test, deploy = w["jobs"]["test"], w["jobs"]["deploy"]
    runs = [s.get("run", "") for s in test["steps"]]
    assert any(r.strip() == "make test" for r in runs)
    assert any("torch==2.13.0" in r and "whl/cpu" in r for r in runs), "torch must come from the CPU index"
    py = next(s["with"]["python-version"] for s in test["steps"] if "setup-python" in s.get("uses", ""))
    assert py == "3.11"                                     # the Makefile's interpreter
    upload = next(s for s in test["steps"] if "upload-pages-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == "_build/html"
    main_only = "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert upload["if"] == main_only and deploy["if"] == main_only and deploy["needs"] == "test"
    assert any("deploy-pages" in s.get("uses", "") for s in deploy["steps"])
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
