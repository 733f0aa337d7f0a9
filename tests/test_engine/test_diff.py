"""engine/diff/: semantic spec diffs (files, git revisions, evidence-backed) and the spec CI workflow.

Golden files live in tests/golden/diff/; regenerate them after an intended output change with
    SPECPROBE_UPDATE_GOLDEN=1 /work/venv/bin/pytest tests/test_engine/test_diff.py
and review the golden diff like any other.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from engine_helpers import git

from engine.cli import main as engine_main
from engine.diff import command as diff
from engine.diff.compare import same
from engine.diff.model import Budget
from engine.diff.render import _budget_line, _operands
from engine.text import argv_delta

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "specs" / "diff"
GOLDEN = ROOT / "tests" / "golden" / "diff"
UPDATE = os.environ.get("SPECPROBE_UPDATE_GOLDEN") == "1"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"{path} missing: run with SPECPROBE_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8"), f"output differs from {path}"


def run_diff(
    old: str | Path,
    new: str | Path | None = None,
    base: str | None = None,
    evidence: str | Path | None = None,
    markdown: str | None = None,
    mode: str | None = None,
) -> tuple[int, str, str]:
    """`engine diff` with these arguments (`markdown`: the `--markdown` value, `-` or a FILE)."""
    args = argparse.Namespace(
        old=str(old),
        new=None if new is None else str(new),
        base=base,
        evidence=None if evidence is None else str(evidence),
        markdown=markdown,
        mode=mode,
    )
    out, err = io.StringIO(), io.StringIO()
    rc = diff.diff_main(args, out, err)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Paths in the output are shown relative to the cwd: run from the repo root, as CI does."""
    monkeypatch.chdir(ROOT)
    return ROOT


# ---------------------------------------------------------------- two files

CASES = ["checks", "legs", "values", "budget", "output", "modes"]


@pytest.mark.parametrize("case", CASES)
def test_each_kind_of_change_matches_its_golden_text_and_markdown(case: str, in_root: Path) -> None:
    old, new = f"tests/specs/diff/{case}/old.yaml", f"tests/specs/diff/{case}/new.yaml"
    rc, text, err = run_diff(old, new)
    assert (rc, err) == (1, "")
    golden(f"{case}.txt", text)
    rc, md, _ = run_diff(old, new, markdown="-")
    assert rc == 1
    golden(f"{case}.md", md)


def test_reordered_keys_and_reformatted_yaml_make_an_empty_diff(in_root: Path) -> None:
    old, new = "tests/specs/diff/reformat/old.yaml", "tests/specs/diff/reformat/new.yaml"
    assert Path(old).read_text() != Path(new).read_text()
    rc, text, err = run_diff(old, new)
    assert (rc, err) == (0, "")
    assert text == (f"engine diff demo_probe: {old} -> {new}\nno semantic change\n")
    rc, md, _ = run_diff(old, new, markdown="-")
    assert rc == 0 and "No semantic change." in md


def test_a_spec_compared_with_itself_is_unchanged(in_root: Path) -> None:
    rc, text, _ = run_diff("tests/specs/diff/base.yaml", "tests/specs/diff/base.yaml")
    assert rc == 0 and text.endswith("no semantic change\n")


def test_changes_shared_by_every_mode_are_shown_once_and_the_rest_per_mode(in_root: Path) -> None:
    report = diff.build_report("tests/specs/diff/values/old.yaml", "tests/specs/diff/values/new.yaml", None)
    assert [(c.subject, c.new) for c in report.common] == [("lr", 0.0006)]
    soak = next(m for m in report.modes if m.mode == "soak")
    assert [(c.section, c.subject, c.field, c.old, c.new) for c in soak.changes if c.section == "values"] == [
        ("values", "steps", "", 240, 300),
        ("values", "stop1", "", 120, 150),
    ]
    smoke = next(m for m in report.modes if m.mode == "smoke")
    assert smoke.changes == [] and smoke.budget is None


def test_budget_reports_worst_case_and_headroom_before_and_after(in_root: Path) -> None:
    report = diff.build_report("tests/specs/diff/budget/old.yaml", "tests/specs/diff/budget/new.yaml", None)
    soak = next(m for m in report.modes if m.mode == "soak")
    assert soak.budget == Budget(600, 420.0, 500, 480.0)
    assert _budget_line(soak.budget) == "worst case 420 s -> 480 s of budget_s 600 s -> 500 s, headroom 180 s -> 20 s"


def test_an_invalid_spec_on_either_side_exits_2_naming_file_and_line(in_root: Path) -> None:
    rc, out, err = run_diff("tests/specs/diff/invalid/old.yaml", "tests/specs/diff/invalid/new.yaml")
    assert (rc, out) == (2, "")
    assert (
        "tests/specs/diff/invalid/new.yaml:6:11: $.budget_s: mode 'soak': worst case 520 s "
        "exceeds budget_s 500 s" in err
    )
    rc, _, err = run_diff("tests/specs/diff/invalid/new.yaml", "tests/specs/diff/invalid/old.yaml")
    assert rc == 2 and "invalid/new.yaml:6:11" in err


def test_usage_errors_exit_2(in_root: Path) -> None:
    assert run_diff("tests/specs/diff/base.yaml")[0] == 2
    rc, _, err = run_diff("tests/specs/diff/base.yaml", "tests/specs/diff/base.yaml", base="HEAD")
    assert rc == 2 and "not both" in err
    rc, _, err = run_diff("tests/specs/diff/base.yaml", "tests/specs/diff/modes/new.yaml", mode="nope")
    assert rc == 2 and "--mode nope: in neither side (modes: smoke, long, soak)" in err


def test_mode_option_limits_the_diff_to_one_mode(in_root: Path) -> None:
    rc, text, _ = run_diff("tests/specs/diff/values/old.yaml", "tests/specs/diff/values/new.yaml", mode="smoke")
    assert rc == 1
    assert "mode smoke:" in text and "+ lr = 0.0006" in text and "soak" not in text


SECRET_SPEC = """\
version: 1
name: secretive
description: a leg that gets a token
budget_s: 60
values:
  api_token: "{token}"
  host: "https://user:{token}@example.com"
steps:
  - name: leg1
    run:
      argv: ["${{python}}", "-c", "pass", "--host", "${{host}}"]
      env: {{API_TOKEN: "${{api_token}}", HF_TOKEN: "{token}"}}
      timeout_s: 10
checks:
  - name: leg1_ok
    why: it exits 0
    expr: "steps.leg1.rc == `0`"
"""


def test_secrets_are_never_shown_though_their_change_is(tmp_path: Path) -> None:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(SECRET_SPEC.format(token="old-s3cr3t-value"))
    new.write_text(SECRET_SPEC.format(token="new-s3cr3t-value"))
    for markdown in (None, "-"):
        rc, text, _ = run_diff(old, new, markdown=markdown)
        assert rc == 1
        assert "s3cr3t" not in text
        assert "changed (in a secret, not shown)" in text and "env.HF_TOKEN" in text
    rc, text, _ = run_diff(old, new)
    assert f"    ~ leg1 argv: changed (in a secret, not shown)  ({new}:11)\n" in text
    assert f"    ~ host: changed (in a secret, not shown)  ({new}:7)\n" in text


# ---------------------------------------------------------------- small pure parts


def test_argv_delta_names_the_flag_of_a_changed_argument() -> None:
    old = ["py", "-m", "t", "--no-grad-ckpt", "--stop-after-steps", "10"]
    new = ["py", "-m", "t", "--grad-ckpt", "--stop-after-steps", "20"]
    assert argv_delta(old, new) == (
        "`--no-grad-ckpt` -> `--grad-ckpt`; `--stop-after-steps 10` -> `--stop-after-steps 20`"
    )
    assert argv_delta(old, old + ["--prune"]) == "added `--prune` after `10`"
    assert argv_delta(["a", "--x", "b"], ["a", "b"]) == "removed `--x`"


def test_operands_use_the_shortest_unique_path_suffix() -> None:
    result = {
        "explain": [
            ["steps.leg1.harvest.run_json.final_step", "10"],
            ["steps.leg2.harvest.run_json.final_step", "20"],
            ["values.stop1", "10"],
            ["steps.leg1.rc == `0`", "true"],
            ["steps.leg2.harvest.run_json.first_step", "missing"],
        ]
    }
    assert _operands(result) == (
        "leg1.harvest.run_json.final_step = 10, leg2.harvest.run_json.final_step = 20, stop1 = 10, first_step = missing"
    )


def test_expressions_compare_by_syntax_tree_and_prose_by_words() -> None:
    assert same("expr", "a==b && c", "a == b  &&  c")
    assert not same("expr", "a == b", "a == c")
    assert same("why", "Leg 1 must\n stop.", "Leg 1 must stop.")
    assert not same("run.argv", ["a  b"], ["a b"])  # argv text is exact


# ---------------------------------------------------------------- --base REV (real git history)


def _put(repo: Path, version: str) -> None:
    shutil.rmtree(repo / "specs", ignore_errors=True)
    shutil.copytree(FIXTURES / "git" / version / "specs", repo / "specs")


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repo whose HEAD holds v1 of the spec family; the working tree holds v1 too."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    _put(repo, "v1")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "v1")
    monkeypatch.chdir(repo)
    return repo


def test_base_revision_resolves_includes_and_extends_at_that_revision(repo: Path) -> None:
    # Working tree: the include names a new fragment (checks_v1.yaml is deleted), the parent moved stop1.
    _put(repo, "v2")
    assert not (repo / "specs/lib/checks_v1.yaml").exists()
    rc, text, err = run_diff("specs/probe.yaml", base="HEAD")
    assert (rc, err) == (1, "")
    golden("git_include.txt", text)
    rc, md, _ = run_diff("specs/probe.yaml", base="HEAD", markdown="-")
    golden("git_include.md", md)


def test_base_revision_with_no_change_exits_0(repo: Path) -> None:
    rc, text, _ = run_diff("specs/probe.yaml", base="HEAD")
    assert rc == 0 and text == "engine diff git_probe: HEAD:specs/probe.yaml -> specs/probe.yaml\nno semantic change\n"


def test_base_is_a_merge_base_of_a_branch(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "feature")
    _put(repo, "v2")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "v2")
    merge_base = git(repo, "merge-base", "main", "HEAD").strip()
    rc, text, _ = run_diff("specs/probe.yaml", base=merge_base)
    assert rc == 1
    assert "+ leg1_reported_a_segment [gate]" in text and "- leg1_stopped_at_stop [gate]" in text
    assert "~ stop1: 10 -> 20" in text


def test_a_spec_new_since_the_base_is_shown_whole(repo: Path) -> None:
    (repo / "specs/extra.yaml").write_text((repo / "specs/probe.yaml").read_text().replace("git_probe", "extra_probe"))
    rc, text, _ = run_diff("specs/extra.yaml", base="HEAD")
    assert rc == 1
    assert text.startswith(
        "engine diff extra_probe: new spec (no HEAD:specs/extra.yaml) -> specs/extra.yaml\n"
        "new spec; mode added: smoke\n"
    )
    assert "    + leg1 [run]  (specs/lib/common.yaml:" in text and "    + leg1_ok [gate]  (specs/" in text
    assert "    + stop1 = 10  (specs/" in text


def test_a_spec_deleted_since_the_base_is_shown_removed(repo: Path) -> None:
    (repo / "specs/probe.yaml").unlink()
    rc, text, _ = run_diff("specs/probe.yaml", base="HEAD")
    assert rc == 1
    assert text.startswith("engine diff git_probe: HEAD:specs/probe.yaml -> specs/probe.yaml (deleted)\n")
    assert "spec deleted; mode removed: smoke\n" in text
    assert "    - leg1 [run]  (HEAD:specs/lib/common.yaml:" in text and "    - leg1_ok [gate]  (HEAD:specs/" in text


def test_an_invalid_spec_at_the_base_is_located_at_rev_and_path(repo: Path) -> None:
    (repo / "specs/lib/common.yaml").write_text("version: 1\nname: common\nbudget_s: [\n")
    git(repo, "commit", "-q", "-am", "broken")
    _put(repo, "v1")
    rc, out, err = run_diff("specs/probe.yaml", base="HEAD")
    assert (rc, out) == (2, "")
    assert err.startswith("HEAD:specs/probe.yaml: invalid spec\nHEAD:specs/lib/common.yaml:4:1: ")
    assert "specprobe-diff-" not in err


def test_an_unknown_revision_exits_2(repo: Path) -> None:
    rc, _, err = run_diff("specs/probe.yaml", base="no-such-rev")
    assert rc == 2 and "--base no-such-rev: not a revision" in err


# ---------------------------------------------------------------- --evidence RUN_DIR (a real run)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real `engine run`s of base.yaml (its legs are `python -c` printing RUN_JSON), smoke and soak."""
    out = {}
    for mode in ("smoke", "soak"):
        run_dir = tmp_path_factory.mktemp("runs") / f"demo_probe-{mode}"
        rc = engine_main(["run", str(FIXTURES / "base.yaml"), "--mode", mode, "--run-dir", str(run_dir)])
        assert rc == 0, f"the fixture run of {mode} failed"
        out[mode] = run_dir
    return out


def _stable(text: str, run_dir: Path) -> str:
    """The run's directory and start minute differ per test run."""
    text = text.replace(str(run_dir), "<RUN_DIR>")
    return re.sub(r"run \d{4}-\d\d-\d\dT\d\d:\d\d", "run <STARTED>", text)


def test_added_and_changed_checks_are_evaluated_on_the_saved_run(runs: dict[str, Path], in_root: Path) -> None:
    old, new = "tests/specs/diff/checks/old.yaml", "tests/specs/diff/checks/new.yaml"
    rc, text, err = run_diff(old, new, evidence=runs["smoke"])
    assert (rc, err) == (1, "")
    assert "(smoke): resumed_from_step = 10, stop1 = 10  (tests/specs/diff/checks/new.yaml:22)\n" in text
    assert "    + new check leg2_resumed_from_stop would PASS on run " in text
    golden("evidence_checks.txt", _stable(text, runs["smoke"]))
    rc, md, _ = run_diff(old, new, evidence=runs["smoke"], markdown="-")
    golden("evidence_checks.md", _stable(md, runs["smoke"]))


def test_a_value_feeding_a_leg_makes_the_run_not_comparable_and_says_so(runs: dict[str, Path], in_root: Path) -> None:
    rc, text, _ = run_diff(
        "tests/specs/diff/values/old.yaml", "tests/specs/diff/values/new.yaml", evidence=runs["soak"]
    )
    assert rc == 1
    golden("evidence_values.txt", _stable(text, runs["soak"]))
    report = diff.build_report(
        "tests/specs/diff/values/old.yaml", "tests/specs/diff/values/new.yaml", None, str(runs["soak"])
    )
    by_name = {r.name: r for r in report.evidence.checks}
    # stop1 moved, and with it leg 1's argv: the leg, not the value, is why the run cannot answer.
    assert by_name["leg1_stopped_at_stop"].status == "moved"
    assert by_name["leg1_stopped_at_stop"].blockers == [
        "leg `leg1` changed since the run (argv `--stop-after-steps 120` -> `--stop-after-steps 150`)"
    ]
    # An equality asked for another value: a different requirement, said so, and not a loosening.
    assert by_name["leg1_stopped_at_stop"].shift.retarget
    assert by_name["leg2_exit_clean"].status == "affected"  # reads leg2, which ran after the changed leg1
    # The same change does not touch smoke: a smoke run can still vouch for every check.
    report = diff.build_report(
        "tests/specs/diff/values/old.yaml", "tests/specs/diff/values/new.yaml", None, str(runs["smoke"])
    )
    assert report.evidence.checks == []


def test_changed_output_rules_are_flagged_for_checks_reading_the_harvest(runs: dict[str, Path], in_root: Path) -> None:
    report = diff.build_report(
        "tests/specs/diff/output/old.yaml", "tests/specs/diff/output/new.yaml", None, str(runs["smoke"])
    )
    blocked = {r.name: r.blockers for r in report.evidence.checks}
    assert list(blocked) == ["leg1_stopped_at_stop"]
    assert blocked["leg1_stopped_at_stop"][0].startswith(
        "leg `leg1`'s output rules changed (output.strip_prefix, output.echo_prefixes, "
        "output.harvest.run_json.pick, output.failure_patterns, output.tail_lines): the saved harvest "
        "was made with the old rules"
    )


def test_a_longer_timeout_does_not_void_a_run_that_finished(runs: dict[str, Path], in_root: Path) -> None:
    report = diff.build_report(
        "tests/specs/diff/budget/old.yaml", "tests/specs/diff/budget/new.yaml", None, str(runs["soak"])
    )
    assert report.evidence.checks == []
    assert len(report.evidence.notes) == 2
    assert report.evidence.notes[0].startswith(
        "leg `leg1` changed only its time limits (timeout_s 200 -> 220); it finished in "
    )


def test_a_run_of_another_spec_version_is_not_guessed_about(
    runs: dict[str, Path], tmp_path: Path, in_root: Path
) -> None:
    run_dir = tmp_path / "edited"
    shutil.copytree(runs["smoke"], run_dir)
    doc = json.loads((run_dir / "evidence.json").read_text())
    doc["fingerprints"]["leg2"] = "0" * 64  # leg2 ran with a definition neither side has
    (run_dir / "evidence.json").write_text(json.dumps(doc))
    report = diff.build_report(
        "tests/specs/diff/checks/old.yaml", "tests/specs/diff/checks/new.yaml", None, str(run_dir)
    )
    by_name = {r.name: r for r in report.evidence.checks}
    assert by_name["leg2_resumed_from_stop"].new is None
    assert by_name["leg2_resumed_from_stop"].blockers == [
        "leg `leg2` as it ran matches neither side of this diff (the evidence was made with another "
        "version of the spec)"
    ]
    assert by_name["leg1_stopped_at_stop"].new["outcome"] == "PASS"  # leg1 still matches


def test_a_leg_added_or_removed_upstream_voids_the_checks_downstream(runs: dict[str, Path], tmp_path: Path) -> None:
    base = (FIXTURES / "base.yaml").read_text()
    steps_at = base.index("  - name: leg2\n")
    new = tmp_path / "new.yaml"
    # A wipe between the legs (runs) and a preflight for a mode that does not exist here (skipped).
    new.write_text(
        base[:steps_at] + '  - name: wipe\n    remove: "${run_dir}/train"\n'
        "  - name: preflight\n    when: \"mode == 'real'\"\n    run:\n"
        '      argv: ["${python}", "-c", "pass"]\n      timeout_s: 5\n' + base[steps_at:]
    )
    report = diff.build_report(str(FIXTURES / "base.yaml"), str(new), None, str(runs["smoke"]))
    blocked = {r.name: r.blockers for r in report.evidence.checks}
    assert blocked == {
        name: ["leg `wipe` is new: the run has no record of it, and it ran before what this check reads"]
        for name in ("leg2_finished", "leg2_exit_clean")
    }
    # The other way round: the run had a wipe between the legs that the spec no longer has.
    run_dir = tmp_path / "with_wipe"
    shutil.copytree(runs["smoke"], run_dir)
    doc = json.loads((run_dir / "evidence.json").read_text())
    steps = doc["steps"]
    doc["steps"] = {"leg1": steps["leg1"], "wipe": {"kind": "remove", "status": "ok"}, "leg2": steps["leg2"]}
    (run_dir / "evidence.json").write_text(json.dumps(doc))
    report = diff.build_report(str(FIXTURES / "base.yaml"), str(FIXTURES / "base.yaml"), None, str(run_dir))
    blocked = {r.name: r.blockers for r in report.evidence.checks}
    assert blocked == {
        name: ["leg `wipe` ran before what this check reads and is gone from the new spec"]
        for name in ("leg2_finished", "leg2_exit_clean")
    }


def test_a_check_added_to_the_real_soak_spec_is_judged_on_a_saved_soak_run(tmp_path: Path) -> None:
    """specs/p4_soak.yaml gains `leg2_resumed_from_stop`; a saved soak run (an evidence document
    built from the real plan, legs reporting what the trainer's RUN_JSON says) answers it."""
    from engine.run import evidence as evmod
    from engine.spec.load import load_spec
    from engine.spec.plan import build_plan

    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    run_dir = tmp_path / "runs" / "p4_soak-soak-20261128T210412Z"
    plan = build_plan(
        load_spec(ROOT / "specs" / "p4_soak.yaml"),
        mode="soak",
        environ={},
        builtins={"run_dir": str(run_dir), "run_id": "20261128T210412Z"},
    )
    doc = evmod.new_document(plan, run_dir, "0.1.0")
    doc["started_at"] = "2026-11-28T21:04:12.000000Z"
    for name in ("leg1", "leg2"):
        doc["steps"][name] = {
            "kind": "run",
            "status": "ok",
            "rc": 0,
            "seconds": 2000.0,
            "timed_out": False,
            "harvest": {
                "run_json": {
                    "final_step": 120 if name == "leg1" else 180,
                    "resumed_from_step": None if name == "leg1" else 120,
                    "first_step": 1 if name == "leg1" else 121,
                }
            },
        }
    evmod.write(run_dir, doc)
    new = specs / "p4_soak.yaml"
    line = len(new.read_text().splitlines()) + 2  # the added check's `- name:` line
    new.write_text(new.read_text() + "\n" + ADDED_CHECK.replace("the stop step", "where leg 1 stopped"))
    rc, text, err = run_diff(ROOT / "specs" / "p4_soak.yaml", new, evidence=run_dir)
    assert (rc, err) == (1, "")
    assert (
        "    + new check leg2_resumed_from_stop would PASS on run 2026-11-28T21:04 (soak): "
        f"resumed_from_step = 120, stop1 = 120  ({new}:{line})\n" in text
    )


def test_new_check_is_evaluated_on_the_committed_real_run(tmp_path: Path, in_root: Path) -> None:
    """evidence/p4_soak is a real `engine run specs/p4_soak.yaml` (the bundle the spec-PR workflow
    re-checks): a check added in a PR is answered from it, with the values it read."""
    new = tmp_path / "specs" / "p4_soak.yaml"
    shutil.copytree(ROOT / "specs", new.parent)
    new.write_text(
        new.read_text()
        + """
  - name: leg2_trained_each_step_once
    why: A resume one step early trains a step twice; one step late skips one.
    expr: "sort(map(&to_number(@), keys(steps.leg2.harvest.run_json.losses))) == range(add(values.stop1, `1`), add(values.steps, `1`))"
"""
    )
    saved = json.loads((ROOT / "evidence" / "p4_soak" / "evidence.json").read_text())
    rc, text, err = run_diff("specs/p4_soak.yaml", new, evidence="evidence/p4_soak")
    assert (rc, err) == (1, "")
    stamp = saved["started_at"][:16]
    assert f"+ new check leg2_trained_each_step_once would PASS on run {stamp} (soak): " in text
    assert "stop1 = 120, steps = 180" in text


def test_unreadable_evidence_exits_2(tmp_path: Path, in_root: Path) -> None:
    rc, _, err = run_diff("tests/specs/diff/base.yaml", "tests/specs/diff/base.yaml", evidence=tmp_path)
    assert rc == 2 and "no evidence document" in err


# ---------------------------------------------------------------- the engine CLI and the CI workflow


def test_engine_registers_diff_like_every_command(capsys: pytest.CaptureFixture) -> None:
    from engine.cli import _parser, cmd_diff

    args = _parser().parse_args(
        ["diff", "specs/p4_soak.yaml", "--base", "origin/main", "--markdown", "-", "--evidence", "evidence/p4_soak"]
    )
    assert (args.old, args.new, args.base, args.evidence, args.markdown, args.mode) == (
        "specs/p4_soak.yaml",
        None,
        "origin/main",
        "evidence/p4_soak",
        "-",
        None,
    )
    assert args.func is cmd_diff
    assert engine_main(["diff", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "--base REV" in help_text and "--markdown FILE" in help_text
    assert "0 no semantic change, 1 a semantic change, 2 invalid spec or usage" in help_text


def test_markdown_given_a_path_writes_it_and_prints_text(in_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "pr" / "diff.md"
    rc, text, _ = run_diff(
        "tests/specs/diff/budget/old.yaml", "tests/specs/diff/budget/new.yaml", markdown=str(out)
    )  # the `--markdown FILE` form of `engine run`/`check`
    assert rc == 1
    assert text == (GOLDEN / "budget.txt").read_text()
    assert out.read_text() == (GOLDEN / "budget.md").read_text()


def test_markdown_dash_prints_markdown_instead_of_text(in_root: Path, capsys: pytest.CaptureFixture) -> None:
    rc = engine_main(
        ["diff", "tests/specs/diff/budget/old.yaml", "tests/specs/diff/budget/new.yaml", "--markdown", "-"]
    )
    assert rc == 1 and capsys.readouterr().out == (GOLDEN / "budget.md").read_text()
    assert not Path("-").exists()


ADDED_CHECK = """\
  - name: leg2_resumed_from_stop
    why: Leg 2 must resume from the stop step, not from scratch.
    expr: "steps.leg2.harvest.run_json.resumed_from_step == values.stop1"
"""
