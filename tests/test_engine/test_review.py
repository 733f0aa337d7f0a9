"""`engine review --base REV`: real git repositories with real commits, one per class of change.

The template repository holds tests/specs/review/specs (a two-leg probe extending a lib fragment) and
a real `engine run` of it committed as evidence/probe/, as a project keeps its last real run. Each test
copies it, commits one change on a branch and reviews the branch against main: every risky class
exits 1 (and 0 with --accept-risk), every safe class exits 0, an invalid spec on either side 2.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import pytest
from engine_helpers import git

from engine.cli import main as engine_main
from engine.diff.review import EXIT_INVALID, EXIT_RISKY, EXIT_SAFE, WHY_RISKY, build_review, render_review

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "specs" / "review" / "specs"


def run_probe(repo: Path, run_dir: str = "evidence/probe", mode: str = "smoke") -> None:
    """A real `engine run` of the repo's probe, kept where the project keeps saved runs."""
    cwd = Path.cwd()
    os.chdir(repo)
    try:
        shutil.rmtree(run_dir, ignore_errors=True)
        assert engine_main(["run", "specs/probe.yaml", "--mode", mode, "--run-dir", run_dir]) == 0
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("template") / "repo"
    shutil.copytree(FIXTURE, repo / "specs")
    git(repo, "init", "-q", "-b", "main")
    run_probe(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the probe and its last real run")
    return repo


@pytest.fixture
def repo(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the template on a branch `pr`, the working directory of the test."""
    copy = tmp_path / "repo"
    shutil.copytree(template, copy)
    git(copy, "checkout", "-q", "-b", "pr")
    monkeypatch.chdir(copy)
    return copy


def edit(repo: Path, path: str, old: str, new: str) -> None:
    f = repo / path
    text = f.read_text()
    assert old in text, f"{old!r} not in {path}"
    f.write_text(text.replace(old, new, 1))


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def review(*args: str) -> tuple[int, str, str]:
    """`engine review --base main ARGS` in the current directory: (exit code, stdout, stderr)."""
    from engine.cli import _parser

    parsed = _parser().parse_args(["review", "--base", "main", *args])
    out, err = io.StringIO(), io.StringIO()
    from engine.diff.review import review_main

    rc = review_main(parsed, out, err)
    return rc, out.getvalue(), err.getvalue()


LIB = "specs/lib/common.yaml"
PROBE = "specs/probe.yaml"

# ---------------------------------------------------------------- the risky classes

CHECK_BLOCK = re.compile(r"  - name: (\w+)\n(?:    .*\n)+")


def _remove_check(repo: Path, name: str) -> None:
    f = repo / LIB
    f.write_text(CHECK_BLOCK.sub(lambda m: "" if m.group(1) == name else m.group(0), f.read_text()))


def _other_specs_run(repo: Path) -> None:
    doc = repo / "evidence" / "probe" / "evidence.json"
    doc.write_text(doc.read_text().replace('"name": "probe"', '"name": "another_probe"', 1))


RISKY: dict[str, tuple[str, str, Callable[[Path], None]]] = {
    # case: (risk kind, a phrase its line must hold, the change)
    "gate_removed": (
        "gate removed",
        "gate `leg2_exit_clean` removed (it checked: Leg 2 exits 0.)",
        lambda r: _remove_check(r, "leg2_exit_clean"),
    ),
    "gate_disabled": (
        "gate disabled",
        "gate `peak_below_gate` DISABLED: measured elsewhere now",
        lambda r: edit(
            r, PROBE, "budget_s: 300\n", "budget_s: 300\ndisable:\n  peak_below_gate: measured elsewhere now\n"
        ),
    ),
    "gate_demoted": (
        "gate demoted",
        "gate `leg2_exit_clean` demoted to warn",
        lambda r: edit(r, LIB, 'expr: "steps.leg2.rc == `0`"', 'expr: "steps.leg2.rc == `0`"\n    severity: warn'),
    ),
    "gate_given_a_when": (
        "gate given a when",
        "gate `loss_below_max` given `when: mode == 'soak'`",
        lambda r: edit(
            r,
            LIB,
            'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"',
            'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"\n    when: "mode == \'soak\'"',
        ),
    ),
    "value_threshold_loosened": (
        "gate loosened",
        "gate `loss_below_max` loosened on run ",
        lambda r: edit(r, LIB, "loss_max: 3.0", "loss_max: 4.5"),
    ),
    "literal_threshold_loosened": (
        "gate loosened",
        "12.5 <= 13.6 PASS (margin 1.1) -> 12.5 <= 20 PASS (margin 7.5)",
        lambda r: edit(r, LIB, "<= `13.6`", "<= `20`"),
    ),
    "gate_rewritten_beyond_telling": (
        "gate rewritten",
        "gate `leg1_stopped_at_stop` changed and it cannot be told whether it asks less",
        lambda r: edit(
            r,
            LIB,
            "steps.leg1.harvest.run_json.final_step == values.stop1",
            "steps.leg1.harvest.run_json.final_step >= values.stop1 || steps.leg1.rc == `0`",
        ),
    ),
    "legs_changed_without_a_new_run": (
        "legs changed",
        "legs changed in smoke: `leg1` argv added `--log-every 1` after `10` (and in soak); evidence/probe "
        "is a run of other legs (`leg1` differ: `engine check` refuses it)",
        lambda r: edit(
            r, LIB, '"--stop-after-steps", "${stop1}"]', '"--stop-after-steps", "${stop1}", "--log-every", "1"]'
        ),
    ),
    "gate_let_pinned_to_a_constant": (
        "gate pinned to a constant",
        "gate `loss_below_max`: `loss` is now the literal 1.0  (specs/lib/common.yaml:",
        lambda r: edit(
            r,
            LIB,
            'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"',
            'expr: "let.loss < values.loss_max"\n    let:\n      loss: "`1.0`"',
        ),
    ),
    "gate_given_a_when_false_in_every_mode": (
        "gate never runs",
        "gate `loss_below_max`: `when: mode == 'nightly'` is false in every mode (smoke, soak): the check never runs",
        lambda r: edit(
            r,
            LIB,
            'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"',
            'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"\n    when: "mode == \'nightly\'"',
        ),
    ),
    "budget_raised": (
        "budget raised",
        "budget_s 300 s -> 900 s",
        lambda r: edit(r, PROBE, "budget_s: 300", "budget_s: 900"),
    ),
    "exit_codes_widened": (
        "exit codes widened",
        "leg `leg2` ok_exit_codes [0] -> [0,1]",
        lambda r: edit(
            r,
            LIB,
            "      timeout_s: 60\n      grace_s: 5\n      output:\n        harvest:\n"
            '          run_json: {marker: "RUN_JSON ", pick: last}\nchecks:',
            "      timeout_s: 60\n      grace_s: 5\n      ok_exit_codes: [0, 1]\n"
            "      output:\n        harvest:\n"
            '          run_json: {marker: "RUN_JSON ", pick: last}\nchecks:',
        ),
    ),
    "saved_run_fails_the_new_spec": (
        "saved run fails",
        "evidence/probe (smoke) fails under the new spec: `leg1_reported_memory_below_12`",
        lambda r: edit(
            r,
            LIB,
            "checks:\n",
            "checks:\n  - name: leg1_reported_memory_below_12\n    why: A tighter card.\n"
            '    expr: "steps.leg1.harvest.run_json.peak_gb < `12`"\n',
        ),
    ),
    "spec_deleted": ("gate removed", "spec deleted: its 5 gate checks no longer run", lambda r: (r / PROBE).unlink()),
    "mode_removed": ("gate removed", "mode `soak` removed", lambda r: edit(r, PROBE, "  soak: {stop1: 20}\n", "")),
    "evidence_removed": ("evidence removed", "evidence/probe removed", lambda r: shutil.rmtree(r / "evidence")),
    # A bundle committed for the spec that is another spec's run: nothing re-checks the probe any more.
    "saved_run_of_another_spec": (
        "saved run refused",
        "evidence/probe (renewed in this change) is refused by `engine check`: refusing",
        lambda r: _other_specs_run(r),
    ),
}


@pytest.mark.parametrize("case", list(RISKY))
def test_each_risky_class_exits_1_names_the_change_and_why_and_accept_risk_exits_0(repo: Path, case: str) -> None:
    kind, phrase, change = RISKY[case]
    change(repo)
    commit(repo, case)
    rc, text, err = review()
    assert (rc, err) == (EXIT_RISKY, ""), text
    risky_lines = [line for line in text.splitlines() if line.startswith("  ! ")]
    line = next((x for x in risky_lines if x.startswith(f"  ! {kind} in ")), None)
    assert line is not None, f"no `{kind}` risk in:\n{text}"
    assert len(risky_lines) == 1, f"one change, one risk:\n{text}"
    assert phrase in line, line
    assert f"      why risky: {WHY_RISKY[kind]}" in text
    assert text.splitlines()[1].startswith("RISKY: ")
    rc, accepted, _ = review("--accept-risk")
    assert rc == EXIT_SAFE
    assert "accepted (--accept-risk)" in accepted.splitlines()[1] and line in accepted


# ---------------------------------------------------------------- the safe classes


def _new_run_of_new_legs(repo: Path) -> None:
    RISKY["legs_changed_without_a_new_run"][2](repo)
    run_probe(repo)  # the new legs, run for real, committed with the change


SAFE: dict[str, Callable[[Path], None]] = {
    "add_a_check": lambda r: edit(
        r,
        LIB,
        "checks:\n",
        "checks:\n  - name: leg2_resumed_from_stop\n"
        "    why: Leg 2 resumes from the stop step.\n"
        '    expr: "steps.leg2.harvest.run_json.resumed_from_step == values.stop1"\n',
    ),
    "tighten_a_value_threshold": lambda r: edit(r, LIB, "loss_max: 3.0", "loss_max: 2.5"),
    "tighten_a_literal_threshold": lambda r: edit(r, LIB, "<= `13.6`", "< `13`"),
    "reword_a_why": lambda r: edit(
        r,
        LIB,
        "why: Leg 2 must reach the horizon.",
        "why: >\n      Leg 2 must reach the horizon;\n      a leg that exits early still has rc 0.",
    ),
    "reformat_the_yaml": lambda r: (
        edit(
            r,
            PROBE,
            "modes:\n  default: smoke\n  smoke: {stop1: 10}\n  soak: {stop1: 20}\n",
            "modes:\n  soak:\n    stop1: 20\n  smoke:\n    stop1: 10\n  default: smoke\n",
        ),
        edit(r, LIB, 'expr: "steps.leg2.rc == `0`"', "expr: >-\n      steps.leg2.rc   ==   `0`"),
    ),
    "rewrite_a_check_through_let": lambda r: edit(
        r,
        LIB,
        'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"',
        'expr: "let.loss < values.loss_max"\n    let:\n      loss: steps.leg2.harvest.run_json.final_loss',
    ),
    # A name for a spec value beside the run's loss: the gate still reads the run, nothing is pinned.
    "name_a_spec_value_through_let": lambda r: edit(
        r,
        LIB,
        'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"',
        'expr: "steps.leg2.harvest.run_json.final_loss < let.ceiling"\n    let:\n      ceiling: values.loss_max',
    ),
    "legs_changed_with_a_new_run_committed": _new_run_of_new_legs,
    # stop1 moves leg 1's stop AND what `leg1_stopped_at_stop` asks: the old check fails the new run,
    # which says nothing of the new check (an equality asked for another value, not a looser one).
    "stop_step_moved_with_a_new_run_committed": lambda r: (
        edit(r, PROBE, "smoke: {stop1: 10}", "smoke: {stop1: 15}"),
        run_probe(r),
    ),
    "a_longer_timeout": lambda r: edit(r, LIB, "timeout_s: 60", "timeout_s: 90"),
    # What the progress line says after its total and phases: display, not what the leg does.
    "a_progress_line_that_reads_better": lambda r: edit(
        r, LIB, "every_s: 30}", "every_s: 30, total: \"${stop1}\", phases: {pushing: '^CKPT save '}}"
    ),
}


@pytest.mark.parametrize("case", list(SAFE))
def test_each_safe_class_exits_0(repo: Path, case: str) -> None:
    SAFE[case](repo)
    commit(repo, case)
    rc, text, err = review()
    assert (rc, err) == (EXIT_SAFE, ""), text
    assert text.splitlines()[1] == "nothing risky"
    assert "  ! " not in text
    # Reformatted YAML means nothing; every other safe change is a change, shown.
    status = text.splitlines()[2].split(None, 1)[1]
    assert (status == "unchanged") == (case == "reformat_the_yaml"), text


def test_a_gate_the_saved_run_failed_already_at_the_base_is_no_new_risk(repo: Path) -> None:
    git(repo, "checkout", "-q", "main")
    RISKY["saved_run_fails_the_new_spec"][2](repo)
    commit(repo, "a gate the saved run fails, on main")
    git(repo, "checkout", "-q", "-B", "pr")
    SAFE["reword_a_why"](repo)
    commit(repo, "reword")
    rc, text, _ = review()
    assert rc == EXIT_SAFE, text
    assert "saved run: FAIL (5/6 gates pass)" in text


def risky_lines() -> tuple[list[str], str]:
    """The lines `engine review` marks risky, and its whole text (it exits 1 and says nothing on stderr)."""
    rc, text, err = review()
    assert (rc, err) == (EXIT_RISKY, ""), text
    return [line for line in text.splitlines() if line.startswith("  ! ")], text


def safe_change_reviewed(repo: Path, case: str) -> str:
    """The review of the safe change `case`, committed on the branch: what it says (it exits 0)."""
    SAFE[case](repo)
    commit(repo, case)
    rc, text, _ = review()
    assert rc == EXIT_SAFE, text
    return text


def test_a_tightened_threshold_is_classified_with_its_numbers(repo: Path) -> None:
    text = safe_change_reviewed(repo, "tighten_a_value_threshold")
    assert "    ~ check loss_below_max (unchanged; reads a changed value) on run " in text
    assert ": tightened  (specs/lib/common.yaml:" in text
    assert "on this run: 2.25 < 3 PASS (margin 0.75) -> 2.25 < 2.5 PASS (margin 0.25)" in text


def test_a_let_rewrite_is_unchanged_on_the_saved_run(repo: Path) -> None:
    text = safe_change_reviewed(repo, "rewrite_a_check_through_let")
    assert "changed check loss_below_max on run " in text
    assert ": unchanged on this run (the same expression once its `let:` names are written out)" in text


def test_an_uncommitted_change_in_the_working_tree_is_reviewed_too(repo: Path) -> None:
    edit(repo, LIB, "loss_max: 3.0", "loss_max: 4.5")  # not committed: the working tree is the new side
    rc, text, _ = review()
    assert rc == EXIT_RISKY and "  ! gate loosened in specs/probe.yaml" in text


def test_a_bidirectional_override_in_a_spec_reaches_the_review_escaped(repo: Path) -> None:
    # U+202E makes "...exits 0 <RLO>!trats" read backwards: the reviewer must see the character.
    edit(repo, LIB, "why: Leg 2 exits 0.", "why: Leg 2 exits 0. \u202eevitisop eslaf\u202c")
    rc, text, _ = review("--markdown", "review.md")
    markdown = (repo / "review.md").read_text(encoding="utf-8")
    assert rc == EXIT_SAFE
    for shown in (text, markdown):
        assert "\u202e" not in shown and "\u202c" not in shown
        assert "\\u202eevitisop eslaf\\u202c" in shown


def test_a_pr_spec_that_includes_a_file_outside_the_repository_is_refused_not_read(repo: Path, tmp_path: Path) -> None:
    """A PR's spec is untrusted: `include:` or `extends:` may name only files of the repository, on either
    side of the review; reading a file of the CI machine (its contents surface as key names in errors) is
    refused, naming the file and the line."""
    outside = tmp_path / "outside.yaml"
    outside.write_text("values: {host_secret: s3cr3t}\n")
    spec = repo / "specs" / "probe.yaml"
    spec.write_text(
        spec.read_text().replace("extends: lib/common.yaml", f"extends: lib/common.yaml\ninclude: [{outside}]")
    )
    rc, text, _ = review()
    assert rc == EXIT_INVALID, text
    assert f"{outside} is outside {repo.resolve()}" in text and "specs/probe.yaml:" in text, text
    assert "s3cr3t" not in text and "host_secret" not in text


def test_a_saved_run_linked_out_of_the_repository_is_refused(repo: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(repo / "evidence" / "probe", elsewhere)
    shutil.rmtree(repo / "evidence" / "probe")
    (repo / "evidence" / "probe").symlink_to(elsewhere)
    rc, text, _ = review()
    assert rc == EXIT_INVALID, text
    assert "evidence/probe/evidence.json leads outside the repository" in text, text


# ---------------------------------------------------------------- exit 2


def test_an_invalid_spec_on_either_side_exits_2_naming_file_and_line(repo: Path) -> None:
    edit(
        repo,
        LIB,
        "      timeout_s: 60\n      grace_s: 5\n      output:",
        "      timeout_s: sixty\n      grace_s: 5\n      output:",
    )
    rc, text, _ = review()
    assert rc == EXIT_INVALID
    assert text.splitlines()[1].startswith("INVALID: specs/probe.yaml")
    assert re.search(r"specs/lib/common\.yaml:\d+:\d+: \$\.steps\[0\]\.run\.timeout_s", text), text
    commit(repo, "broken")
    git(repo, "branch", "-f", "main", "HEAD")  # the broken one is now the base; the tree is fixed
    git(repo, "checkout", "-q", "HEAD~1", "--", LIB)
    rc, text, _ = review("--accept-risk")  # accepting risk does not accept an invalid spec
    assert rc == EXIT_INVALID
    assert re.search(r"main:specs/lib/common\.yaml:\d+:\d+: ", text), text


def test_an_unknown_base_or_a_directory_outside_git_exits_2(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.cli import _parser
    from engine.diff.review import review_main

    err = io.StringIO()
    assert review_main(_parser().parse_args(["review", "--base", "no-such-rev"]), io.StringIO(), err) == EXIT_INVALID
    assert err.getvalue().startswith("--base no-such-rev: not a revision of the repository at ")
    outside = tmp_path / "outside"
    (outside / "specs").mkdir(parents=True)
    monkeypatch.chdir(outside)
    err = io.StringIO()
    assert review_main(_parser().parse_args(["review", "--base", "main"]), io.StringIO(), err) == EXIT_INVALID
    assert "not inside a git work tree" in err.getvalue()


def test_corrupt_saved_evidence_exits_2_naming_the_file(repo: Path) -> None:
    (repo / "evidence" / "probe" / "evidence.json").write_text("{not json")
    rc, text, _ = review()
    assert rc == EXIT_INVALID
    assert "evidence/probe/evidence.json:1:2: not valid JSON" in text


# ---------------------------------------------------------------- which specs, and the outputs


def test_fragments_are_reviewed_through_the_specs_that_use_them_and_new_specs_are_labelled_new(repo: Path) -> None:
    (repo / "specs" / "probe2.yaml").write_text((repo / PROBE).read_text().replace("name: probe", "name: probe2"))
    commit(repo, "a second probe")
    review_ = build_review("main")
    assert [s.path for s in review_.specs] == ["specs/probe.yaml", "specs/probe2.yaml"]  # not lib/common.yaml
    by_path = {s.path: s for s in review_.specs}
    assert by_path["specs/probe2.yaml"].status == "new" and by_path["specs/probe2.yaml"].risks == []
    text = render_review(review_)
    assert "engine diff probe2: new spec (no main:specs/probe2.yaml) -> specs/probe2.yaml" in text
    assert "saved run: no saved run under evidence/probe2/" in text


def test_markdown_file_and_dash_have_one_meaning(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    RISKY["gate_removed"][2](repo)
    commit(repo, "drop a gate")
    out = tmp_path / "review.md"
    assert engine_main(["review", "--base", "main", "--markdown", str(out)]) == EXIT_RISKY
    printed = capsys.readouterr().out
    assert printed.startswith("engine review: 1 spec, base main (")  # FILE: text printed, Markdown written
    md = out.read_text()
    assert md.startswith("## Spec review: RISKY: 1 risky change needs approval\n")
    assert "- **gate removed** in `specs/probe.yaml` [mode smoke, soak]: gate `leg2_exit_clean` removed" in md
    assert "  - *why risky*: a gate that no longer exists can no longer fail a run" in md
    assert "<details><summary>specs/probe.yaml: checks: 1 removed</summary>" in md
    assert engine_main(["review", "--base", "main", "--markdown", "-"]) == EXIT_RISKY
    assert capsys.readouterr().out == md  # `-`: the Markdown instead of the text
    assert not Path("-").exists()


def test_engine_review_is_registered_with_its_exit_codes(capsys: pytest.CaptureFixture) -> None:
    assert engine_main(["review", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "--base REV" in help_text and "--accept-risk" in help_text and "--markdown FILE" in help_text
    assert "0 nothing risky (or --accept-risk), 1 risky changes need approval, 2 invalid" in " ".join(help_text.split())


def test_the_shipped_specs_and_saved_runs_review_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shipped spec is valid, its saved run re-checks with it, and an unchanged tree is not risky
    (the shipped specs and evidence, committed in a repository of their own)."""
    repo = tmp_path / "shipped"
    for part in ("specs", "evidence"):
        shutil.copytree(ROOT / part, repo / part)
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "shipped")
    monkeypatch.chdir(repo)
    review_ = build_review("HEAD")
    assert review_.exit_code == EXIT_SAFE, render_review(review_)
    assert {s.path for s in review_.specs} >= {"specs/p4_smoke.yaml", "specs/p4_soak.yaml", "specs/p4_preempt.yaml"}
    rechecked = [s for s in review_.specs if s.saved is not None and s.saved.mode is not None]
    assert len(rechecked) >= 3
    for s in rechecked:
        assert s.recheck.startswith("PASS ("), (s.path, s.recheck)


def test_review_markdown_draws_each_saved_runs_plots_as_engine_check_does(tmp_path, monkeypatch):
    """The PR comment shows the saved runs' pictures: the same Mermaid section `engine check --markdown`
    draws from the same evidence with the new spec."""
    import json

    from engine.show import mermaid
    from engine.show.plots import for_spec
    from engine.spec.load import load_spec

    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "specs", repo / "specs")
    shutil.copytree(ROOT / "evidence", repo / "evidence")
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "the shipped specs and their saved runs")
    monkeypatch.chdir(repo)
    rc, out, err = review("--markdown", "-")
    assert (rc, err) == (EXIT_SAFE, ""), out
    soak = json.loads((repo / "evidence" / "p4_soak" / "evidence.json").read_text())
    drawn = mermaid.section(for_spec(load_spec("specs/p4_soak.yaml"), soak)).rstrip("\n")
    assert "specs/p4_soak.yaml: plots of the saved run evidence/p4_soak/" in out
    assert drawn in out and drawn.count("xychart-beta") == 2  # the memory plot: no data on the CPU, said as such


def test_a_let_pinned_to_a_constant_names_what_it_read_before(repo: Path) -> None:
    git(repo, "checkout", "-q", "main")
    SAFE["rewrite_a_check_through_let"](repo)
    commit(repo, "the check reads its loss through a let, on main")
    git(repo, "checkout", "-q", "-B", "pr")
    edit(repo, LIB, "loss: steps.leg2.harvest.run_json.final_loss", 'loss: "sub(values.loss_max, `1`)"')
    commit(repo, "pin the loss one under the ceiling")
    risky, text = risky_lines()
    assert risky == [
        "  ! gate pinned to a constant in specs/probe.yaml [mode smoke, soak]: gate `loss_below_max`: `loss` is "
        "now ``sub(values.loss_max, `1`)``, the spec's 2.0 on every run (it was "
        "`steps.leg2.harvest.run_json.final_loss`)  (specs/lib/common.yaml:41)"
    ], text


# ---------------------------------------------------------------- the shipped specs and their saved runs


@pytest.fixture(scope="module")
def shipped_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped specs and saved runs, committed in a repository of their own."""
    repo = tmp_path_factory.mktemp("shipped") / "repo"
    for part in ("specs", "evidence"):
        shutil.copytree(ROOT / part, repo / part)
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "shipped")
    return repo


@pytest.fixture
def shipped(shipped_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "shipped"
    shutil.copytree(shipped_template, copy)
    monkeypatch.chdir(copy)
    return copy


SEGMENT = "specs/lib/p4_segment.yaml"
SMOKE_TIMEOUTS = "smoke: {steps: 20, push_every: 10, stop1: 10, val_tokens_real: 200000, t_fetch: 1500, t_leg1: 1200,"


def line_of(path: str, text: str) -> int:
    """The line of the shipped spec file where `text` first occurs, as the review names a change."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


def saved_smoke_leg1() -> tuple[float, str]:
    """(seconds the saved smoke run's leg 1 took, the run as the review names it): the bundle's own numbers."""
    doc = json.loads((ROOT / "evidence" / "p4_smoke" / "evidence.json").read_text())
    return doc["steps"]["leg1"]["seconds"], f"run {doc['started_at'][:16]} (smoke), evidence/p4_smoke"


def test_a_timeout_cut_below_what_the_saved_run_took_is_risky_with_both_numbers(shipped: Path) -> None:
    """Smoke's `t_leg1` 1200 -> 3 s: the saved smoke run's leg 1 took longer, so it could not pass as it ran."""
    took, run = saved_smoke_leg1()
    assert took > 3
    edit(shipped, SEGMENT, SMOKE_TIMEOUTS, SMOKE_TIMEOUTS.replace("t_leg1: 1200,", "t_leg1: 3,"))
    risky, text = risky_lines()
    assert risky == [
        "  ! time limit under the saved run in specs/p4_smoke.yaml [mode smoke]: leg `leg1`'s timeout 1200 s -> 3 s "
        f"(`t_leg1`), and the saved run's leg1 took {took:.1f} s ({run})  "
        f"(specs/lib/p4_segment.yaml:{line_of(SEGMENT, SMOKE_TIMEOUTS)})"
    ], text
    assert f"      why risky: {WHY_RISKY['time limit under the saved run']}" in text


def test_a_timeout_close_above_what_the_saved_run_took_is_a_note_not_a_risk(shipped: Path) -> None:
    took, run = saved_smoke_leg1()
    tight, ample = math.ceil(took) + 1, math.ceil(took * 1.5) + 1  # above it, under 1.5 times it; past that
    assert tight < took * 1.5
    edit(shipped, SEGMENT, SMOKE_TIMEOUTS, SMOKE_TIMEOUTS.replace("t_leg1: 1200,", f"t_leg1: {tight},"))
    rc, text, _ = review()
    assert rc == EXIT_SAFE, text
    assert (
        f"note: tight: leg `leg1`'s timeout 1200 s -> {tight} s (`t_leg1`), and the saved run's leg1 took {took:.1f} s "
        f"({run}): less than 1.5 times what it took"
    ) in text
    rc, md, _ = review("--markdown", "-")
    assert f"- `specs/p4_smoke.yaml`: tight: leg `leg1`'s timeout 1200 s -> {tight} s" in md
    edit(shipped, SEGMENT, f"t_leg1: {tight},", f"t_leg1: {ample},")  # 1.5 times what it took and more
    rc, text, _ = review()
    assert rc == EXIT_SAFE and "note:" not in text, text


def test_a_value_that_leaves_a_gates_when_false_in_every_mode_and_target_is_risky(shipped: Path) -> None:
    """`gate_peak` reads `target`, which SPECPROBE_TARGET sets: true for soak on a GPU target. Changed so that
    no mode and no target the spec lists makes it true, the memory gate never runs."""
    edit(shipped, SEGMENT, "target != 'local'", "target == 'tpu'")
    risky, text = risky_lines()
    assert risky == [
        "  ! gate never runs in specs/p4_soak.yaml [mode smoke, soak]: gate `peak_memory_during_training_below_gate`: "
        "`when: values.gate_peak` is false in every mode (smoke, soak) and every `target` (gpu, local, real): "
        f"the check never runs  (specs/lib/p4_segment.yaml:{line_of(SEGMENT, 'gate_peak:')})"
    ], text


def test_a_new_gate_whose_when_holds_only_on_a_target_the_spec_lists_is_safe(shipped: Path) -> None:
    """False in every mode on the local default, true on `target: gpu`: the gate runs on GPU runs."""
    edit(
        shipped,
        "specs/p4_soak.yaml",
        "checks:\n",
        "checks:\n  - name: gpu_only_gate\n    why: Only a GPU run reports device memory.\n"
        "    when: \"values.target == 'gpu'\"\n"
        '    expr: "steps.leg1.harvest.run_json.peak_reserved_gb_max_rank <= values.peak_gate_gb"\n',
    )
    rc, text, _ = review()
    assert rc == EXIT_SAFE, text
    assert "never runs" not in text
