"""The report on a real (tiny-model) run through the registered suites: HTML parses, every figure is an
embedded decodable PNG, tables hold the summary values, several runs combine."""

from __future__ import annotations

import base64
import csv
import io
import shutil
from html.parser import HTMLParser

import matplotlib.image as mpimg
import numpy as np
import pytest

from editscope.report import build_report
from editscope.run import Runner, parse_config, read_results

CONFIG = {
    "model": "tiny-llama",
    "methods": [{"name": "rome", "overrides": {"v_steps": 2}}],
    "datasets": [
        {"dataset": "counterfact", "slice": {"limit": 2}, "suites": ["counterfact"]},
        {"dataset": "peak-cf", "slice": {"limit": 2},
         "suites": ["peak", {"name": "one_to_n", "options": {"edits": "append"}}]},
    ],
}


class Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tags: list[str] = []
        self.cells: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        self._in_td = tag == "td"

    def handle_data(self, data):
        if self._in_td:
            self.cells.append(data)

    def handle_endtag(self, tag):
        self._in_td = False


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from editscope.lm import load

    out = tmp_path_factory.mktemp("run")
    Runner(parse_config(CONFIG), out_dir=out, bundle=load("tiny-llama"), progress=False, log=lambda _m: None).run()
    return out


def decode_images(html_text: str) -> list[np.ndarray]:
    parser = Collect()
    parser.feed(html_text)
    parser.close()
    arrays = []
    for src in parser.images:
        assert src.startswith("data:image/png;base64,")
        raw = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        arrays.append(mpimg.imread(io.BytesIO(raw), format="png"))
    return arrays


def test_report_renders(run_dir, tmp_path):
    html_path, md_path = build_report([run_dir], tmp_path / "rep")
    text = html_path.read_text()
    images = decode_images(text)
    # bars for (counterfact, counterfact), (peak-cf, peak), (peak-cf, one_to_n) + 1-to-N case + PEAK shift
    assert len(images) == 5
    for img in images:
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
        assert img[..., :3].std() > 0.01  # not a blank canvas
    parser = Collect()
    parser.feed(text)
    assert parser.tags.count("table") >= 4 and "h2" in parser.tags
    md = md_path.read_text()
    assert "## counterfact on counterfact" in md and "## peak on peak-cf" in md and "## one_to_n on peak-cf" in md
    for line in md.splitlines():
        if line.startswith("![") and "](" in line:
            assert (md_path.parent / line.split("](", 1)[1].rstrip(")")).is_file()
    assert "1-to-N distribution" in md and "Probability shift" in md


def test_report_table_values_match_summary(run_dir, tmp_path):
    html_path, md_path = build_report([run_dir], tmp_path)
    rows = list(csv.DictReader((run_dir / "summary.csv").open()))
    es = next(r for r in rows if r["suite"] == "counterfact" and r["metric"] == "ES_post")
    md = md_path.read_text().split("## counterfact on counterfact", 1)[1]
    compact, md = md.split("All metrics:", 1)  # the paper-style table first, then every metric
    header = next(line for line in md.splitlines() if line.startswith("| method"))
    rome = next(line for line in md.splitlines() if line.startswith("| rome"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    vals = [c.strip() for c in rome.strip("|").split("|")]
    # compact: ×100, no interval with n = 2 (anecdotal), the unedited row from ES_pre
    pcols = [c.strip() for c in next(ln for ln in compact.splitlines() if ln.startswith("| method")).split("|")]
    prome = [c.strip() for c in next(ln for ln in compact.splitlines() if ln.startswith("| rome")).split("|")]
    assert prome[pcols.index("ES ↑ (%)")] == f"{100 * float(es['mean']):.1f}"
    es_pre = next(r for r in rows if r["suite"] == "counterfact" and r["metric"] == "ES_pre" and r["method"] == "rome")
    unedited = [c.strip() for c in next(ln for ln in compact.splitlines() if ln.startswith("| unedited")).split("|")]
    assert unedited[pcols.index("ES ↑ (%)")] == f"{100 * float(es_pre['mean']):.1f}"
    assert "Anecdotal" in compact and "EM" not in pcols and "EasyEdit_rewrite_acc" not in compact
    cell = vals[cols.index("ES_post ↑ (share, paper ×100)")]  # direction, unit, paper scale from the spec
    assert cell.startswith(f"{float(es['mean']):.3f}")
    assert vals[cols.index("n")] == es["n"] == "2"
    # the Score is the aggregate of the dataset-level means, bootstrapped
    score = next(r for r in rows if r["suite"] == "counterfact" and r["metric"] == "Score_post")
    means = [float(next(r for r in rows if r["suite"] == "counterfact" and r["metric"] == f"{k}_post")["mean"])
             for k in ("ES", "PS", "NS")]
    want = 0.0 if min(means) == 0 else 3 / sum(1 / m for m in means)
    assert float(score["mean"]) == pytest.approx(want, abs=1e-5) and score["ci"] == "bootstrap"
    assert vals[cols.index("Score_post ↑ (share, paper ×100)")].startswith(f"{want:.3f}")
    assert "NKL_post ↓ (nats)" in md_path.read_text()


def test_report_of_two_runs_labels_methods_by_run(run_dir, tmp_path):
    other = tmp_path / "again"
    shutil.copytree(run_dir, other)
    html_path, md_path = build_report([run_dir, other], tmp_path / "both")
    md = md_path.read_text()
    assert f"| rome [{run_dir.name}] |" in md and "| rome [again] |" in md
    assert len(decode_images(html_path.read_text())) == 5


def test_runs_split_by_dataset_block_report_as_the_whole_run(run_dir, tmp_path):
    """A config run as one run per dataset block (one per core) keeps its method labels, and its pivot rows equal
    the rows of the run of both blocks at once (an edit's seed depends on its dataset, method and group only)."""
    from editscope.lm import load

    bundle = load("tiny-llama")
    parts = []
    for block in CONFIG["datasets"]:
        out = tmp_path / block["dataset"]
        Runner(parse_config({**CONFIG, "datasets": [block]}), out_dir=out, bundle=bundle, progress=False,
               log=lambda _m: None).run()
        parts.append(out)
    _, split_md = build_report(parts, tmp_path / "split")
    _, whole_md = build_report([run_dir], tmp_path / "whole")

    def pivot_rows(md: str) -> list[str]:
        lines = md.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("| method") and "peak" in line)
        return [line for line in lines[start:] if line.startswith(("| rome", "| unedited"))][:2]

    split, whole = pivot_rows(split_md.read_text()), pivot_rows(whole_md.read_text())
    assert "[" not in "".join(r.split("|")[1] for r in split)
    assert split == whole and len(split) == 2


def test_report_has_no_suite_names():
    """Suite-specific figures come from the suites' ``figures`` hooks; the report code names no suite."""
    from pathlib import Path

    import editscope.report as report
    from editscope.suites import SUITES

    for path in Path(report.__file__).parent.glob("*.py"):
        text = path.read_text()
        for name in SUITES:
            assert f'"{name}"' not in text and f"'{name}'" not in text, (path.name, name)


def test_report_needs_results(tmp_path):
    from editscope.errors import EditscopeError

    with pytest.raises(EditscopeError, match="not a run directory"):
        build_report([tmp_path])


def test_report_of_a_probe_only_one_to_n_run(tmp_path):
    """``methods: [none]`` (paper 000 Table 3's probing) has no post-edit state: the report still builds, and its
    1-to-N figure shows the model's distribution and Q."""
    from editscope.lm import load

    config = {"model": "tiny-llama", "methods": ["none"], "dataset": "peak-cf", "slice": {"limit": 2},
              "suites": [{"name": "one_to_n", "options": {"k": 3}}]}
    Runner(parse_config(config), out_dir=tmp_path / "run", bundle=load("tiny-llama"), progress=False,
           log=lambda _m: None).run()
    html, md = build_report([tmp_path / "run"], tmp_path / "report")
    text = md.read_text(encoding="utf-8")
    assert "## one_to_n on peak-cf" in text and "| unedited | 2 |" in text
    # the pivot's unedited row holds the probed values (naive means of the rows); no row for the 'none' method
    rows = read_results(tmp_path / "run" / "results.jsonl")
    pivot = text.split("## All methods × headline metrics")[1].split("\n## ")[0]
    unedited = next(line for line in pivot.split("\n") if line.startswith("| unedited |")).strip("|").split("|")
    nkl = sum(r["metrics"]["one_to_n"]["NKL_pre"] for r in rows) / len(rows)
    assert unedited[1].strip() == f"{nkl:.2f}"
    assert "| none |" not in pivot
    figures = sorted(p.name for p in (tmp_path / "report" / "figures").glob("one-to-n-*.png"))
    assert len(figures) == 1 and html.is_file()  # the build raised KeyError on the missing post-edit state before
