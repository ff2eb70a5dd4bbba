"""Edit cards on a tiny model: the card's numbers equal the rows the runner wrote for the same case (every suite's
metrics and raw candidate log-probs, the collateral flip count), ΔW equals the patch the runner saved, the page has
every section with every figure embedded and decodable, the model is restored, and the command and the report's
--cards option write and link cards."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from editscope.cli import main
from editscope.edit.patch import Patch, tensor_checksum
from editscope.errors import EditscopeError
from editscope.report.card import choose_cases, write_card
from editscope.report.card_html import SECTIONS, scores_figure
from editscope.run import Runner, parse_config, read_results
from editscope.run.inspect import compute_card, job_from_run
from tests.suites.test_collateral import known_fact_file


class Page(HTMLParser):
    """Section ids, image sources and the text of an HTML page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.images: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs.get("id"))
        if tag == "img":
            self.images.append(attrs.get("src", ""))

    def handle_data(self, data):
        self.text.append(data)


def weights(bundle) -> dict[str, str]:
    return {name: tensor_checksum(p) for name, p in bundle.model.named_parameters()}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_bundles):
    """A run of ROME and MEMIT on 2 CounterFact cases with counterfact, evk (σ sweep) and collateral suites."""
    bundle = tiny_bundles["llama"]
    from editscope.lm.engine import ScoringEngine

    root = tmp_path_factory.mktemp("card")
    known_fact_file(root / "facts.json", ScoringEngine(bundle))
    config = parse_config({
        "model": "tiny-llama", "seed": 3, "output": str(root / "run"), "save_patches": True,
        "methods": [{"name": "rome", "overrides": {"v_steps": 4, "v_lr": 1.0}},
                    {"name": "memit", "overrides": {"v_steps": 3}}],
        "dataset": "counterfact", "slice": {"offset": 0, "limit": 2},
        "suites": ["counterfact", {"name": "evk", "options": {"sigmas": [0.1, 1.0]}},
                   {"name": "collateral", "options": {"facts": 12, "sources": [str(root / "facts.json")]}}]})
    Runner(config, out_dir=root / "run", bundle=bundle, progress=False, log=lambda _m: None).run()
    return root, bundle


@pytest.mark.parametrize("method", ["rome", "memit"])
def test_card_equals_the_runners_row(tiny_run, method):
    root, bundle = tiny_run
    run = root / "run"
    rows = [r for r in read_results(run / "results.jsonl") if r["method"] == method]
    row = rows[1]  # the second case: group 1, so the runner's per-group seeds matter
    before = weights(bundle)
    job = job_from_run(run, row["case_id"], method=method, bundle=bundle)
    lines: list[str] = []
    card = compute_card(job, generate_tokens=4, trace=method == "rome", trace_samples=2, progress=False,
                        log=lines.append)
    assert weights(bundle) == before  # restored
    # the step counter counts the steps there are, in order; the statistics are timed apart from the edit
    n = 6 if method == "rome" else 4
    assert [line.split("]")[0] for line in lines if line.startswith("card [")] == \
        [f"card [{k}/{n}" for k in range(1, n + 1)]
    assert "statistics" in card["timing"] and "edit" in card["timing"]
    # the run's own suites (the card adds none: the run measured EVK and collateral damage itself)
    assert set(job.run_suites) == set(job.trial.suites) == {"counterfact", "evk", "collateral"}
    for name in job.run_suites:
        assert card["suites"][name]["metrics"] == row["metrics"][name], name
    # raw candidate log-probs, pre and post, equal the row's probes
    probe_pre, probe_post = row["pre"]["counterfact"]["prompts"], row["post"]["counterfact"]["prompts"]
    stored = [(p["prompt"], c["text"], c["logprob_sum"], q["candidates"][k]["logprob_sum"])
              for p, q in zip(probe_pre, probe_post, strict=True) for k, c in enumerate(p["candidates"])]
    shown = [(c["prompt"], c["text"], c["pre"], c["post"]) for c in card["suites"]["counterfact"]["candidates"]]
    assert shown == stored
    assert card["collateral_scan"]["flipped"] == row["metrics"]["collateral"]["Flipped"]
    assert len(card["collateral_scan"]["flipped_facts"]) == card["collateral_scan"]["flipped"]
    # EVK curves are the row's EVK_ES_{drift}@σ values
    curves = card["evk_curves"]["curves"]
    assert dict(map(tuple, curves["subject drift"])) == {0.1: row["metrics"]["evk"]["EVK_ES_subject@0.1"],
                                                        0.3: row["metrics"]["evk"]["EVK_ES_subject"],
                                                        1.0: row["metrics"]["evk"]["EVK_ES_subject@1"]}
    # ΔW equals the patch the runner saved for this case
    (saved,) = sorted((run / "patches" / method).glob("*-g00001-0.safetensors"))
    patch = Patch.load(saved)
    params = dict(bundle.model.named_parameters())
    assert [d["name"] for d in card["delta"]] == list(patch.deltas)
    for d in card["delta"]:
        delta = patch.deltas[d["name"]].double()
        assert d["norm"] == pytest.approx(float(delta.norm()), rel=1e-6)
        assert d["relative"] == pytest.approx(float(delta.norm() / params[d["name"]].double().norm()), rel=1e-6)
        assert d["singular"][0] == pytest.approx(float(torch.linalg.svdvals(delta)[0]), rel=1e-6)
    if method == "rome":  # ROME's update is rank one
        assert [d["rank"] for d in card["delta"]] == [1]
        assert set(card["trace"]) == {"pre", "post"} and card["trace"]["post"]["answer"].strip() == \
            row["requests"][0]["target_new"]
    # the page: every section, every figure embedded and decodable, the numbers it states
    page_path = write_card(card, root / f"{method}.html", root / f"{method}.json")
    page = Page(page_path.read_text())
    assert page.sections == list(SECTIONS)
    assert len(page.images) == (7 if method == "rome" else 4)  # + 2 heatmaps and the indirect-effect curve
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1], validate=True)[:8] == b"\x89PNG\r\n\x1a\n"
    text = "".join(page.text)
    col = card["collateral_scan"]
    assert f"{col['flipped']} of {col['counted']} facts" in text
    assert f"{row['metrics']['counterfact']['ES_post']:.3f}" in text
    assert json.loads((root / f"{method}.json").read_text())["suites"]["counterfact"]["metrics"] == \
        row["metrics"]["counterfact"]


def _arrows_cut(rows) -> list[str]:
    """The rows whose pre -> post arrow the chart's x axis does not hold whole."""
    import matplotlib.pyplot as plt

    fig = scores_figure(rows)
    low, high = fig.axes[0].get_xlim()
    plt.close(fig)
    return [r["text"] for r in rows if not (low <= r["pre"] <= high and low <= r["post"] <= high)]


def test_arrow_chart_holds_every_arrow(tiny_run):
    # by hand: the edit lifts the new target far above every pre-edit log-prob and sinks the true answer below
    rows = [{"role": "edit", "kind": "new", "text": " Japan", "pre": -9.0, "post": -0.2},
            {"role": "edit", "kind": "true", "text": " France", "pre": -1.0, "post": -14.0},
            {"role": "paraphrase", "kind": "new", "text": " Japan", "pre": -8.0, "post": -7.5}]
    assert _arrows_cut(rows) == []
    # a real card whose edit moves a log-prob past the pre-edit range: an axis set from the pre-edit points alone
    # would cut that arrow
    root, bundle = tiny_run
    row = read_results(root / "run" / "results.jsonl")[0]
    card = compute_card(job_from_run(root / "run", row["case_id"], method="rome", bundle=bundle), generate_tokens=0,
                        progress=False)
    rows = card["suites"]["counterfact"]["candidates"]
    pres = [r["pre"] for r in rows]
    assert any(not min(pres) <= r["post"] <= max(pres) for r in rows)
    assert _arrows_cut(rows) == []


def test_inspect_command_and_report_cards(tiny_run, tmp_path, capsys):
    root, _ = tiny_run
    run = root / "run"
    rows = read_results(run / "results.jsonl")
    case = rows[0]["case_id"]
    assert main(["inspect", str(run), "--case", case, "--method", "memit", "--out", str(tmp_path), "--json",
                 "--no-progress", "--generate", "2"]) == 0
    (js,) = tmp_path.glob("*.json")
    row = next(r for r in rows if r["case_id"] == case and r["method"] == "memit")
    assert json.loads(js.read_text())["suites"]["collateral"]["metrics"] == row["metrics"]["collateral"]
    assert Page(js.with_suffix(".html").read_text()).sections == list(SECTIONS)
    run_page = js.with_suffix(".html").read_text()
    assert run_page.count("EVK_ES_subject@0.1") == 1, "the EVK metric table is shown once (metrics section)"
    # an edit given on the command line: CounterFact suite on its prompts plus the card's own suites
    assert main(["inspect", "--model", "tiny-llama", "--method", "rome", "--prompt", "{} was born in",
                 "--subject", "Toko Yasuda", "--target", "Paris", "--target-true", "Tokyo", "--paraphrase",
                 "{} is from", "--neighbour", "Apple A5 was born in=Tokyo", "--set", "v_steps=2",
                 "--facts", "5", "--facts-from", str(root / "facts.json"), "--out", str(tmp_path / "cli"),
                 "--no-progress", "--json", "--generate", "2"]) == 0
    (cli_json,) = (tmp_path / "cli").glob("*.json")
    card = json.loads(cli_json.read_text())
    assert set(card["suites"]) == {"counterfact", "evk", "collateral"}
    assert [c["role"] for c in card["suites"]["counterfact"]["candidates"]] == \
        ["rewrite", "rewrite", "paraphrase", "paraphrase", "neighborhood", "neighborhood"]
    page = cli_json.with_suffix(".html").read_text()
    assert "cli True" not in page and "the command line (editscope inspect with a request, no run)" in page
    assert "hparams were derived" not in page  # ROME has a shipped tiny-llama file
    # an editor without one (GRACE): the card says its hparams were derived and points to tune
    assert main(["inspect", "--model", "tiny-llama", "--method", "grace", "--prompt", "{} was born in",
                 "--subject", "Toko Yasuda", "--target", "Paris", "--target-true", "Tokyo", "--set", "n_iter=2",
                 "--facts", "5", "--facts-from", str(root / "facts.json"), "--out", str(tmp_path / "derived"),
                 "--no-progress", "--json"]) == 0
    (derived_json,) = (tmp_path / "derived").glob("*.json")
    assert "no shipped grace hparams" in json.loads(derived_json.read_text())["source"]["derived_hparams"]
    derived_page = derived_json.with_suffix(".html").read_text()
    assert "its hparams were derived, not chosen" in derived_page and "editscope tune" in derived_page
    # the editor's diagnostics with four significant digits, not float repr
    import re

    info = re.search(r"edit info</t[hd]>\s*<td>([^<]*)</td>", page)
    assert info is not None and not re.search(r"\d\.\d{6,}", info.group(1)), info.group(1) if info else page[:500]
    # bad input: one line, exit status 2, no traceback
    capsys.readouterr()
    assert main(["inspect", str(run)]) == 2
    assert capsys.readouterr().err.strip() == "editscope: error: inspect RUN_DIR needs --case ID"
    assert main(["inspect", str(run), "--case", "nope"]) == 2
    assert "--case 'nope': no such case" in capsys.readouterr().err
    # the report links the cards of the chosen cases, one per method
    out = tmp_path / "report"
    assert main(["report", str(run), "--out", str(out), "--cards-for", case]) == 0
    html = (out / "report.html").read_text()
    for method in ("rome", "memit"):
        link = f"cards/card-counterfact-{case}-{method}.html"
        assert f"href='{link}'" in html and Path(out / link).is_file()


def test_choose_cases():
    rows = [{"dataset": d, "case_id": c, "method": m} for d in ("a", "b") for c in ("1", "2", "3") for m in "xy"]
    sample = choose_cases(rows, n=2, seed=5)
    assert len(sample) == 2 and sample == choose_cases(rows, n=2, seed=5)
    assert sample == sorted(sample, key=[(r["dataset"], r["case_id"]) for r in rows].index)  # run order
    assert choose_cases(rows, n=100) == [(d, c) for d in "ab" for c in "123"]
    assert choose_cases(rows, ids=["2"]) == [("a", "2"), ("b", "2")]
    with pytest.raises(EditscopeError, match="--cards-for 9: no such case"):
        choose_cases(rows, ids=["9"])


def test_card_in_a_real_browser(tiny_run, tmp_path):
    """The card as a reader sees it in headless Chromium (tests/browser.py; skipped with the reason where it is
    missing): every section there, every figure loaded, no sideways scroll at 1,400 px, and the ES the page shows
    is the runner's row."""
    from tests.browser import headless_chromium, missing

    if missing() is not None:
        pytest.skip(str(missing()))
    root, bundle = tiny_run
    run = root / "run"
    row = next(r for r in read_results(run / "results.jsonl") if r["method"] == "memit")
    card = compute_card(job_from_run(run, row["case_id"], method="memit", bundle=bundle), generate_tokens=2,
                        trace=False, progress=False)
    page = write_card(card, tmp_path / "card.html", tmp_path / "card.json")
    with headless_chromium(width=1400, height=900) as driver:
        driver.get(page.as_uri())
        assert driver.execute_script("return Array.from(document.querySelectorAll('section')).map(s => s.id)") \
            == list(SECTIONS)
        images = driver.execute_script(
            "return Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)")
        assert len(images) == 4 and all(images)
        width = driver.execute_script("return [document.documentElement.scrollWidth, "
                                      "document.documentElement.clientWidth]")
        assert width[0] <= width[1]
        assert f"{row['metrics']['counterfact']['ES_post']:.3f}" in driver.execute_script(
            "return document.body.innerText")


def test_card_of_a_peak_case_shows_its_answer_lists(tmp_path, tiny_bundles):
    """A PEAK-CF case carries correct and hard false answers: the card's PEAK and 1-to-N sections equal the rows the
    runner wrote with those suites, and the page lists every answer instead of 'not measured'."""
    bundle = tiny_bundles["llama"]
    config = parse_config({
        "model": "tiny-llama", "seed": 1, "output": str(tmp_path / "run"),
        "methods": [{"name": "rome", "overrides": {"v_steps": 3}}],
        "dataset": "peak-cf", "slice": {"offset": 0, "limit": 1},
        "suites": ["peak", {"name": "one_to_n", "options": {"edits": "append"}}]})
    Runner(config, out_dir=tmp_path / "run", bundle=bundle, progress=False, log=lambda _m: None).run()
    (row,) = read_results(tmp_path / "run" / "results.jsonl")
    from editscope.lm.engine import ScoringEngine

    known_fact_file(tmp_path / "facts.json", ScoringEngine(bundle))
    job = job_from_run(tmp_path / "run", row["case_id"], method="rome", bundle=bundle, collateral_facts=5,
                       collateral_sources=[str(tmp_path / "facts.json")])
    card = compute_card(job, generate_tokens=2, trace=False, progress=False)
    for name in ("peak", "one_to_n"):
        assert card["suites"][name]["metrics"] == row["metrics"][name], name
    assert card["sections"]["peak-answers"] == "peak" and card["sections"]["siblings"] == "one_to_n"
    text = "".join(Page(write_card(card, tmp_path / "c.html", tmp_path / "c.json").read_text()).text)
    assert "no PEAK answer lists" not in text and "no 1-to-N answer list" not in text
    answers = {c["text"].strip() for c in card["suites"]["peak"]["candidates"] if c["role"] != "neighborhood"}
    assert len(answers) >= 2 and all(a in text for a in answers)


def test_report_cards_of_a_chain_run_say_why_there_are_none(tmp_path, tiny_bundles, capsys):
    """A card replays one case's edit alone; a chain's edits were not alone: --cards writes none and says why in one
    line, and the report is still written."""
    from editscope.cli import main
    from editscope.run import Runner, parse_config

    config = parse_config({
        "model": "tiny-llama", "seed": 0, "output": str(tmp_path / "chain"),
        "mode": {"sequential_batches": {"batch": 1, "rounds": 2, "checkpoints": 1}},
        "methods": [{"name": "memit", "overrides": {"v_steps": 2}}], "dataset": "counterfact",
        "slice": {"offset": 0, "limit": 2}, "suites": ["counterfact"]})
    Runner(config, out_dir=tmp_path / "chain", bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "chain"), "--cards", "1", "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert "cards: none written:" in err and "mode sequential_batches" in err and "only in mode single" in err
    assert (tmp_path / "rep" / "report.html").is_file() and not (tmp_path / "rep" / "cards").exists()
