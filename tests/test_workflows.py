"""The GitHub workflows: valid against the workflow schema, and doing what the project says.

Syntax: every file is validated against the GitHub workflow JSON schema that
check-jsonschema vendors (SchemaStore's), parsed as YAML 1.2 (so ``on:`` stays a key),
and every ``run:`` script is checked with ``bash -n``. Where an ``actionlint`` binary is
on PATH it runs too (it also checks expressions and action inputs).
"""
from __future__ import annotations

import functools
import importlib.resources
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))
RUNNER_LABELS = ("1gpu", "2gpu", "8gpu")

jsonschema = pytest.importorskip("jsonschema", reason="pip install jsonschema (a check-jsonschema dependency)")
ruamel = pytest.importorskip("ruamel.yaml", reason="pip install check-jsonschema (brings ruamel.yaml)")
pytest.importorskip("check_jsonschema", reason="pip install 'check-jsonschema>=0.29,<1' (vendors the workflow schema)")


@functools.lru_cache(maxsize=1)
def validator():
    text = (importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "github-workflows.json").read_text()
    schema = json.loads(text)
    return jsonschema.validators.validator_for(schema)(schema)


def load(path_or_text) -> dict:
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    return ruamel.YAML(typ="safe", pure=True).load(text)


def schema_errors(doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator().iter_errors(doc)]


def steps(doc) -> list[dict]:
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


def scripts(doc) -> str:
    """Every run: script, continuation lines joined."""
    return re.sub(r"\\\n\s*", " ", "\n".join(s["run"] for s in steps(doc) if "run" in s))


def test_the_three_workflows_exist():
    assert {p.name for p in FILES} >= {"ci.yml", "nightly-gpu.yml", "refresh-baselines.yml"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_workflow_matches_schema(path):
    assert schema_errors(load(path)) == []


def test_schema_check_can_fail():
    broken = "name: x\non: push\njobs:\n  a:\n    steps:\n      - run: echo\n        uses: actions/checkout@v4\n"
    assert schema_errors(load(broken)), "the validator accepted a job with no runs-on and a run+uses step"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_run_scripts_parse_in_bash(path, tmp_path):
    for i, step in enumerate(s for s in steps(load(path)) if "run" in s):
        script = re.sub(r"\$\{\{.*?\}\}", "EXPR", step["run"])  # expressions are substituted before bash runs
        f = tmp_path / f"step{i}.sh"
        f.write_text(script)
        proc = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name} step {step.get('name', i)}: {proc.stderr}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_user_input_is_expanded_inside_scripts(path):
    """Inputs reach scripts through env:, never as ${{ }} text (script injection)."""
    assert not re.search(r"\$\{\{\s*(github\.event\.inputs|inputs)\.", scripts(load(path)))


def test_ci_runs_the_readme_test_command_on_pull_requests():
    doc = load(WORKFLOWS / "ci.yml")
    assert "pull_request" in doc["on"]
    assert re.search(r"^bash scripts/test\.sh$", scripts(doc), re.M)
    assert any(s.get("uses", "").startswith("actions/checkout@") for s in steps(doc))


def test_nightly_selects_runners_by_label_and_fails_on_regression():
    doc = load(WORKFLOWS / "nightly-gpu.yml")
    assert "schedule" in doc["on"]
    job, page = doc["jobs"]["gpu"], doc["jobs"]["page"]
    assert tuple(job["strategy"]["matrix"]["label"]) == RUNNER_LABELS
    assert "self-hosted" in job["runs-on"] and "${{ matrix.label }}" in job["runs-on"]
    text = scripts(doc)
    assert re.search(r'pytest -m "\$LABEL" perf/ .*--perf-save results\.json --perf-markdown summary\.md', text)
    assert 'cat summary.md >> "$GITHUB_STEP_SUMMARY"' in text
    upload = [s for s in steps(doc) if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload and "results.json" in upload[0]["with"]["path"] and upload[0].get("if") == "always()"
    fail = [s for s in steps(doc) if s.get("if") == "steps.measure.outputs.rc != '0'"]
    assert fail and "exit 1" in fail[0]["run"]
    # each runner pushes to the fleet's store, named by a secret (issue 51), and one page covers every runner
    assert job["env"]["PERFGATE_RESULTS_STORE"] == page["env"]["PERFGATE_RESULTS_STORE"] == \
        "${{ secrets.PERFGATE_RESULTS_STORE }}"
    assert 'perfgate store add --as "nightly-${{ github.run_id }}-${{ github.run_attempt }}-$LABEL.json" results.json' \
        in text
    assert page["needs"] == "gpu" and page["if"] == "always()"
    # the trend alarm fails the job (issue 47: `perfgate report ... || true` never failed anything)
    (trend,) = [s for s in steps(doc) if "perfgate report" in s.get("run", "")]
    assert 'perfgate report --store "$PERFGATE_RESULTS_STORE" --html trend-html --fail-on-worse' in trend["run"]
    assert "|| true" not in trend["run"]


def test_refresh_is_manual_and_opens_a_pull_request_with_baselines():
    doc = load(WORKFLOWS / "refresh-baselines.yml")
    assert set(doc["on"]) == {"workflow_dispatch"}
    assert doc["on"]["workflow_dispatch"]["inputs"]["label"]["options"] == list(RUNNER_LABELS)
    assert 'perfgate refresh "$RESULTS" --yes' in scripts(doc)
    # the run goes to the fleet's store and its digest beside the baselines, so CI's verify-baselines finds it
    assert 'perfgate store add "$RESULTS"' in scripts(doc)
    assert 'perfgate store add --store results-store --digest "$RESULTS"' in scripts(doc)
    assert doc["jobs"]["refresh"]["env"]["PERFGATE_RESULTS_STORE"] == "${{ secrets.PERFGATE_RESULTS_STORE }}"
    assert doc["jobs"]["refresh"]["env"]["RESULTS"] == "refresh-${{ github.run_id }}.json"
    (pr,) = [s for s in steps(doc) if s.get("uses", "").startswith("peter-evans/create-pull-request@")]
    # not the .prev/.lock files beside the baselines
    assert pr["with"]["add-paths"].split() == ["baselines/**/*.json", "results-store/**"]
    assert doc["permissions"] == {"contents": "write", "pull-requests": "write"}


@pytest.mark.skipif(shutil.which("actionlint") is None,
                    reason="actionlint not on PATH (go install github.com/rhysd/actionlint/cmd/actionlint@v1.7.12); "
                           "the schema check above still ran")
def test_actionlint(tmp_path):
    config = tmp_path / "actionlint.yaml"
    config.write_text("self-hosted-runner:\n  labels: [" + ", ".join(RUNNER_LABELS) + "]\n")
    proc = subprocess.run(["actionlint", "-config-file", str(config), "-no-color", *map(str, FILES)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
