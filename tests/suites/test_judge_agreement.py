"""The judge-agreement table: the packaged hand labels load and cover what they claim, each judge's figures equal
a count over the labels done here by hand, the wild suite's default judges are the ones the table ranks first, and
the command prints the table; malformed label files are one line naming file, record and field."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from editscope.cli import main
from editscope.data.judge_labels import load_judge_labels
from editscope.errors import DataError, EditscopeError
from editscope.metrics.answers import exact_match, first_object
from editscope.suites.judge_agreement import best_judges, judge_agreement, shown_question
from editscope.suites.wild import DEFAULT_JUDGE, DEFAULT_LOCALITY_JUDGE, QA_TEMPLATE

ANSWER_JUDGES = ["exact_match", "contains", "first_object"]
NEIGHBOUR_JUDGES = ["unchanged", "same_start", "same_object"]


@pytest.fixture(scope="module")
def labels():
    return load_judge_labels()


@pytest.fixture(scope="module")
def table(labels):
    return judge_agreement(labels, ANSWER_JUDGES, NEIGHBOUR_JUDGES)


def test_the_packaged_labels_cover_datasets_roles_stages_and_editors(labels):
    assert len(labels) >= 300
    assert len({i.id for i in labels}) == len(labels)
    by = Counter((i.dataset, i.role) for i in labels)
    for dataset in ("counterfact", "zsre", "qaedit"):
        for role in ("rewrite", "paraphrase", "neighborhood"):
            assert by[(dataset, role)] >= 10, (dataset, role)
    assert {i.stage for i in labels} == {"pre", "post"}
    assert len({i.method for i in labels if i.stage == "post"}) >= 4
    assert {i.context for i in labels if i.dataset == "counterfact"} == {"plain"}
    assert {i.context for i in labels if i.dataset != "counterfact"} == {"qa"}
    assert all(i.before is not None for i in labels if i.role == "neighborhood")
    assert Counter(i.split for i in labels).keys() == {"dev", "test"}


def test_figures_equal_a_count_by_hand(labels, table):
    group = [i for i in labels if i.dataset == "counterfact" and i.role == "rewrite"]
    for name, judge in (("exact_match", exact_match), ("first_object", first_object)):
        verdicts = [judge(i.answer, list(i.gold)) for i in group]
        hits = sum(v == i.label for v, i in zip(verdicts, group, strict=True))
        fp = sum(v == 1 and i.label == 0 for v, i in zip(verdicts, group, strict=True))
        negatives = sum(i.label == 0 for i in group)
        row = next(r for r in table if (r.dataset, r.role, r.judge) == ("counterfact", "rewrite", name))
        assert row.figures.n == len(group) and row.figures.positives == len(group) - negatives
        assert row.figures.accuracy[0] == pytest.approx(hits / len(group))
        if negatives:
            assert row.figures.false_positive_rate[0] == pytest.approx(fp / negatives)
    qa = next(i for i in labels if i.context == "qa")
    assert shown_question(qa) == QA_TEMPLATE.format(prompt=qa.prompt)


def test_the_wild_suites_default_judges_are_the_ones_the_table_chose(table):
    best = best_judges(table)
    assert best[("all", "rewrite+paraphrase")] == DEFAULT_JUDGE
    assert best[("all", "neighborhood")] == DEFAULT_LOCALITY_JUDGE
    kappa = {(r.dataset, r.role, r.judge): r.figures.kappa[0] for r in table}
    for dataset in ("counterfact", "zsre", "qaedit"):  # per dataset the default is first or level with the first
        top = kappa[(dataset, "rewrite+paraphrase", best[(dataset, "rewrite+paraphrase")])]
        assert kappa[(dataset, "rewrite+paraphrase", DEFAULT_JUDGE)] == top, dataset
    assert best[("counterfact", "rewrite+paraphrase")] == DEFAULT_JUDGE
    # the whole-answer judges the wild suite used before are not the ones the labels favour
    assert kappa[("all", "rewrite+paraphrase", "first_object")] > kappa[("all", "rewrite+paraphrase", "exact_match")]
    assert kappa[("all", "neighborhood", DEFAULT_LOCALITY_JUDGE)] > kappa[("all", "neighborhood", "unchanged")]


def test_the_command_prints_the_table(capsys):
    assert main(["judge-agreement", "--split", "test", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| dataset | role | judge |" in out and "| all | neighborhood | same_object |" in out
    assert main(["judge-agreement", "--judges", "token_f1"]) != 0
    assert "graded, not binary" in capsys.readouterr().err


@pytest.mark.parametrize(("record", "message"), [
    ({"label": 2}, "field label: expected 0 or 1, got 2"),
    ({"gold": []}, "field gold: expected a non-empty list of non-empty strings"),
    ({"role": "neighbour"}, "field role: expected one of rewrite, paraphrase, neighborhood, got 'neighbour'"),
    ({"answer": None}, "field answer: expected a string, got null"),
    ({"role": "neighborhood"}, "field before: missing"),
])
def test_malformed_label_files_are_one_line(tmp_path, record, message):
    good = {"id": "a", "dataset": "counterfact", "context": "plain", "method": "rome", "stage": "post",
            "split": "dev", "role": "rewrite", "prompt": "p", "gold": ["x"], "answer": "x", "label": 1}
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", **record}) + "\n")
    with pytest.raises(DataError, match=f"labels.jsonl:record 1: {message}"):
        load_judge_labels(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(DataError, match="field id: duplicate id 'a' \\(first at record 0\\)"):
        load_judge_labels(path)
    with pytest.raises(EditscopeError, match="labelled answers not found"):
        load_judge_labels(tmp_path / "none.jsonl")


def test_the_docs_table_is_the_commands_output(capsys):
    """docs/judges.md's agreement table cannot drift from the labels: each of its rows is a row the command prints."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "judges.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ") and ("| rewrite+paraphrase |" in line
                                                                             or "| neighborhood |" in line)]
    assert len(rows) >= 20
    assert main(["judge-agreement", "--format", "markdown"]) == 0
    out = set(capsys.readouterr().out.splitlines())
    assert [r for r in rows if r not in out] == []
