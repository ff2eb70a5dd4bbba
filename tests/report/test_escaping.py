"""The HTML pages are templates with autoescape: a case, method, suite or answer whose text holds markup (here
``<script>``) shows as text on every card section and in the report, never as a tag. The card is hand-made (every
section filled, no model); the report is built from a small run whose method label is renamed."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser

import pytest

from editscope.report.card_html import SECTIONS, render_card
from editscope.run.store import dumps_run_json, write_results

EVIL = "<script>alert(1)</script>"


def evil(name: str) -> str:
    return f"{name}{EVIL}"


class Tags(HTMLParser):
    """Tags and text of a page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.sections: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "section":
            self.sections.append(dict(attrs)["id"])

    def handle_data(self, data):
        self.text.append(data)


def candidate(role: str, kind: str, pre: float, post: float) -> dict:
    return {"role": role, "prompt": evil("prompt"), "text": evil("answer"), "kind": kind, "pre": pre, "post": post,
            "p_pre": 0.1, "p_post": 0.2, "top1_pre": False, "top1_post": True}


def suite(name: str, candidates: list[dict], answers: list[dict] = ()) -> dict:
    return {"run_suite": True, "protocol": {"name": "paper", "note": evil("note")},
            "declared": [{"name": evil("ES"), "higher_is_better": True, "pairing": "pre_post"}],
            "metrics": {f"{evil('ES')}_pre": 0.0, f"{evil('ES')}_post": 1.0}, "candidates": candidates,
            "answers": list(answers)}


def fact(shift: float) -> dict:
    return {"prompt": evil("fact"), "answer": evil("fact answer"), "relation": evil("P17"), "pre": -1.0,
            "post": -1.0 + shift, "shift": shift, "flipped": shift < -1, "shares_subject": [evil("word")],
            "shares_object": []}


def trace() -> dict:
    return {"prompt": evil("trace prompt"), "answer": evil("trace answer"), "tokens": ["a", evil("b"), "c"],
            "subject_span": [0, 2], "states": {"mlp": [[0.1, 0.2, 0.3], [0.2, 0.3, 0.4]]},
            "meta": {"clean_prob": 0.5, "corrupted_prob": 0.1, "mlp_indirect_effect": [0.1, 0.3]}}


def evil_card() -> dict:
    names = {s: evil(s) for s in ("logprobs", "siblings", "peak", "evk", "collateral", "wild")}
    cands = [candidate("rewrite", "new", -5.0, -1.0), candidate("neighborhood", "true", -2.0, -2.5)]
    return {
        "model": {"name": evil("model"), "fingerprint": evil("fp")},
        "case": {"dataset": evil("dataset"), "case_id": evil("case"),
                 "requests": [{"prompt": evil("The capital of {} is"), "subject": evil("subject"),
                               "target_new": evil("new"), "target_true": evil("true")}]},
        "method": {"display": evil("display"), "label": evil("method"), "hparams": {evil("key"): evil("value")},
                   "conventions": {evil("convention"): evil("paper")}},
        "source": {evil("run"): evil("dir")}, "edit_info": {evil("info"): evil("x")}, "timing": {evil("edit"): 1.0},
        "sections": {"logprobs": names["logprobs"], "siblings": names["siblings"], "peak-answers": names["peak"],
                     "evk-stability": names["evk"], "collateral-damage": names["collateral"]},
        "suites": {names["logprobs"]: suite("cf", cands), names["siblings"]: suite("1n", cands),
                   names["peak"]: suite("peak", cands), names["evk"]: suite("evk", []),
                   names["collateral"]: suite("col", []),
                   names["wild"]: suite("wild", [], [{"role": evil("rewrite"), "prompt": evil("q"), "gold": [evil("g")],
                                                      "pre": evil("pre"), "post": evil("post")}])},
        "generation": [{"prompt": evil("gen"), "pre": evil("before"), "post": evil("after")}],
        "delta": [{"name": evil("layers.1.mlp"), "layer": 1, "shape": [4, 4], "norm": 1.0, "w_norm": 2.0,
                   "relative": 0.5, "rank": 1, "spectral": 1.0, "spectral_relative": 0.1, "nonzero": 16, "numel": 16,
                   "singular": [1.0, 0.1]}],
        "evk_curves": {"suite": names["evk"], "sigma": 0.3, "curves": {evil("subject drift"): [[0.1, 0.99], [1, 0.9]]}},
        "collateral_scan": {"flipped": 1, "counted": 3, "n": 3, "sources": [evil("facts.json")], "excluded": [],
                            "mean_shift": -0.5, "shifts": [-2.0, 0.1, 0.2], "flipped_facts": [fact(-2.0)],
                            "largest_drops": [fact(-2.0), fact(0.1)],
                            "by_overlap": [{"group": evil("group"), "n": 1, "flipped": 1, "mean_shift": -2.0,
                                            "min_shift": -2.0}],
                            "by_relation": [{"group": evil("P17"), "n": 3, "flipped": 1, "mean_shift": -0.5,
                                             "min_shift": -2.0}]},
        "trace": {"pre": trace(), "post": trace()},
        "run_row": {"metrics": {}},
    }


def test_card_escapes_markup_in_every_section():
    page = render_card(evil_card())
    assert "<script" not in page.lower() and page.count("&lt;script&gt;") > 40
    parsed = Tags(page)
    assert parsed.sections == list(SECTIONS) and "script" not in parsed.tags
    text = "".join(parsed.text)
    for shown in ("subject", "display", "method", "dataset", "case", "gen", "layers.1.mlp", "fact", "P17",
                  "trace prompt", "note", "value", "logprobs", "wild", "q"):
        assert evil(shown) in text, shown  # the markup is shown as text


@pytest.fixture(scope="module")
def evil_run(two_method_run, tmp_path_factory):
    """The report tests' small run (tests/report/conftest.py), copied with its method labels renamed to hold
    markup."""
    out = tmp_path_factory.mktemp("evil") / "run"
    shutil.copytree(two_method_run[0], out, ignore=shutil.ignore_patterns("report"))
    meta = json.loads((out / "run.json").read_text())
    for m in meta["config"]["methods"]:
        m["label"] = evil(m["label"])
    (out / "run.json").write_text(dumps_run_json(meta))
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # written by editscope's own writer (each row sealed with its digest): rows as a run with such labels writes them
    write_results(out / "results.jsonl", [{**r, "method": evil(r["method"])} for r in rows])
    return out


def test_report_escapes_markup_in_method_and_card_names(evil_run, tmp_path):
    from editscope.report import build_report

    rows = [json.loads(line) for line in (evil_run / "results.jsonl").read_text().splitlines()]
    cards = {(evil(rows[0]["dataset"]), evil(str(rows[0]["case_id"])), rows[0]["method"]): "cards/x'><b>.html"}
    html_path, md_path = build_report([evil_run], tmp_path / "report", cards=cards)
    page = html_path.read_text()
    assert "<script" not in page.lower() and "&lt;script&gt;" in page and "<b>" not in page
    parsed = Tags(page)
    assert "script" not in parsed.tags and "b" not in parsed.tags
    text = "".join(parsed.text)
    assert evil("rome") in text and evil(rows[0]["dataset"]) in text
    assert f"| {evil('rome')} |" in md_path.read_text()  # Markdown shows the label as written
