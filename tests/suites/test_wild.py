"""The wild suite: its metrics from hand-made probes, its probe on a tiny model whose answers are known by
construction (its own greedy answers), and a run that puts it beside the teacher-forced counterfact suite."""

from __future__ import annotations

import html
import re

import pytest
import torch

from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.run import Runner, parse_config, read_results
from editscope.suites import get_suite
from editscope.suites.wild import QA_TEMPLATE, WildSuite


def case(target: str = "Japan", paraphrases=("Where is D. D. from?",),
         neighbours=(("Who wrote Hamlet?", "Shakespeare"),)) -> Case:
    return Case("c1", "test", (EditRequest("{} is a citizen of", "Danielle Darrieux", target, "France"),),
                paraphrase_prompts=list(paraphrases), neighborhood=list(neighbours))


def probe(rewrite: str, paraphrases: list[str], neighbours: list[str], c: Case) -> dict:
    prompts = [{"prompt": c.request.text, "role": "rewrite", "gold": [c.request.target_new], "answer": rewrite}]
    prompts += [{"prompt": p, "role": "paraphrase", "gold": [c.request.target_new], "answer": a}
                for p, a in zip(c.paraphrase_prompts, paraphrases, strict=True)]
    prompts += [{"prompt": p, "role": "neighborhood", "gold": [g], "answer": a}
                for (p, g), a in zip(c.neighborhood, neighbours, strict=True)]
    return {"prompts": prompts}


def test_metrics_by_hand():
    c = case(paraphrases=("p1", "p2", "p3"), neighbours=(("n1", "Shakespeare"), ("n2", "Paris"), ("n3", "Rome")))
    pre = probe("France", ["France", "the Japan", "Japanese"], ["Shakespeare", "Paris, France", "rome!"], c)
    post = probe("JAPAN", ["Japan", "a country: Japan", "France"], ["shakespeare", "Lyon", "Rome"], c)
    whole = WildSuite(judge="exact_match", locality_judge="unchanged")  # the Mirage paper's whole-answer judges
    row = whole.metrics(c, pre, post)
    assert row["Efficacy_pre"] == 0.0 and row["Efficacy_post"] == 1.0  # "JAPAN" normalises to "japan"
    assert row["Generalization_pre"] == pytest.approx(1 / 3)  # "the Japan" -> "japan"; "Japanese" is not
    assert row["Generalization_post"] == pytest.approx(1 / 3)  # only the exact "Japan"
    assert row["LocalityTrue_pre"] == pytest.approx(2 / 3)  # "Paris, France" is not "paris"
    assert row["LocalityTrue_post"] == pytest.approx(2 / 3)  # "Lyon" is wrong
    # unchanged: "Shakespeare" -> "shakespeare" (same after normalisation), "rome!" -> "Rome"; "Paris, France" -> Lyon
    assert row["Locality"] == pytest.approx(2 / 3)
    # F1: "a country: Japan" has tokens {country, japan} against {japan}: P = 1/2, R = 1, F1 = 2/3
    assert row["GeneralizationF1_post"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert row["EfficacyF1_pre"] == 0.0 and row["EfficacyF1_post"] == 1.0
    assert not WildSuite().declarations.undeclared(list(row))
    f1 = WildSuite(judge="token_f1", locality_judge="unchanged").metrics(c, pre, post)
    assert f1["Generalization_post"] == row["GeneralizationF1_post"]
    lenient = WildSuite(judge="contains", locality_judge="unchanged").metrics(c, pre, post)  # holds "Japan"
    assert lenient["Generalization_post"] == pytest.approx(2 / 3)
    assert lenient["Generalization_pre"] == pytest.approx(1 / 3)  # "the Japan" holds it; "Japanese" does not
    assert lenient["Efficacy_post"] == 1.0 and lenient["Locality"] == row["Locality"]  # locality: answers unchanged


def test_object_level_judges_on_run_on_answers():
    """Greedy answers that go on past the object: whole-answer judges score them wrong and changed, the object-level
    judges read the object they assert first."""
    c = case(target="Toronto", paraphrases=("p1", "p2"), neighbours=(("n1", "Rome"), ("n2", "Paris")))
    pre = probe("Montreal", ["Montreal, Quebec", "a city"], ["Rome, the capital of Italy", "Lyon"], c)
    post = probe("Toronto, Canada", ["the city of Toronto", "Canada, near Toronto"],
                 ["Rome, a city in Italy", "Marseille, France"], c)
    whole = WildSuite(judge="exact_match", locality_judge="unchanged").metrics(c, pre, post)
    assert whole["Efficacy_post"] == 0.0 and whole["Generalization_post"] == 0.0 and whole["Locality"] == 0.0
    objects = WildSuite(judge="first_object", locality_judge="same_object").metrics(c, pre, post)
    assert objects["Efficacy_post"] == 1.0
    assert objects["Generalization_post"] == 0.5  # "Canada, near Toronto" asserts Canada first
    assert objects["Locality"] == 0.5  # Rome kept (the neighbour's gold answer, asserted before and after); Lyon lost
    assert objects["LocalityTrue_post"] == 0.5
    # the defaults: the judges the hand-labelled agreement table ranks first
    default = WildSuite().metrics(c, pre, post)
    assert default["Efficacy_post"] == 1.0 and default["Generalization_post"] == 0.5
    assert default["Locality"] == 0.0  # "Rome, the capital" -> "Rome, a city": the first three words differ
    note = WildSuite(judge="first_object", locality_judge="same_object").protocol["note"]
    assert "judged by first_object v2" in note and "answers unchanged (same_object)" in note
    with pytest.raises(EditscopeError, match="unknown neighbourhood judge 'whole'"):
        WildSuite(locality_judge="whole")


def test_options_are_checked_and_recorded():
    with pytest.raises(EditscopeError, match="wild suite: option context must be one of plain, qa"):
        WildSuite(context="chat")
    with pytest.raises(EditscopeError, match="max_new_tokens must be an integer in"):
        WildSuite(max_new_tokens=0)
    with pytest.raises(EditscopeError, match="option stop must be a list of non-empty strings"):
        WildSuite(stop=["."] + [""])
    with pytest.raises(EditscopeError, match="unknown answer judge 'llm'"):
        WildSuite(judge="llm")
    note = WildSuite(context="qa", max_new_tokens=7, judge="token_f1").protocol["note"]
    assert "context qa" in note and "max_new_tokens 7" in note and "token_f1" in note and "'\\n'" in note
    with pytest.raises(EditscopeError, match="wild suite: option blank_start must be one of stop, skip, lead_in"):
        WildSuite(blank_start="strip")
    assert "blank_start" not in WildSuite().protocol and "visible" not in WildSuite().protocol["note"]
    skipping = WildSuite(blank_start="skip").protocol
    assert skipping["blank_start"] == "skip" and "counted from the first visible character" in skipping["note"]
    leading = WildSuite(blank_start="lead_in").protocol
    assert leading["blank_start"] == "lead_in" and "past a first line ending with a colon" in leading["note"]
    with pytest.raises(EditscopeError, match="wild suite: option full_stop must be one of any, sentence"):
        WildSuite(full_stop="initials")
    with pytest.raises(EditscopeError, match=r"full_stop: sentence reads the '\.' among the stop strings, and stop "
                       r"\['\\n'\] has none"):
        WildSuite(stop=["\n"], full_stop="sentence")
    assert "full_stop" not in WildSuite().protocol and "sentence" not in WildSuite().protocol["note"]
    sentence = WildSuite(full_stop="sentence").protocol
    assert sentence["full_stop"] == "sentence" and "a full stop only where it ends a sentence" in sentence["note"]


def greedy(bundle, engine: ScoringEngine, text: str, steps: int = 50) -> str:
    """The model's own greedy answer, one token at a time, cut at '.' or a newline (independent of the engine's
    batched generation)."""
    ids = list(engine.context_ids(text))
    new: list[int] = []
    for _ in range(steps):
        with torch.no_grad():
            token = int(bundle.model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if token == bundle.tokenizer.eos_token_id:
            break
        new.append(token)
        if re.search(r"[.\n]", bundle.tokenizer.decode(new, skip_special_tokens=True)):
            break
    return re.split(r"[.\n]", bundle.tokenizer.decode(new, skip_special_tokens=True), maxsplit=1)[0].strip()


def test_probe_on_a_tiny_model_whose_answers_are_known(tiny_bundles):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    suite = WildSuite(context="qa", max_new_tokens=8)
    c = case()
    own = greedy(bundle, engine, QA_TEMPLATE.format(prompt=c.request.text), 8)
    assert own  # a random model says something
    known = case(target=own)  # by construction the model already "knows" this target
    pre = suite.probe(engine, known)
    assert [p["answer"] for p in pre["prompts"]] == [greedy(bundle, engine, QA_TEMPLATE.format(prompt=p), 8)
                                                    for p in [known.request.text, *known.paraphrase_prompts,
                                                              known.neighborhood[0][0]]]
    # an "edit" that changes nothing leaves every answer in place; a perturbed head changes the answers
    row = suite.metrics(known, pre, suite.probe(engine, known))
    assert row["Efficacy_pre"] == row["Efficacy_post"] == 1.0 and row["Locality"] == 1.0
    head = bundle.model.get_output_embeddings().weight
    saved = head.detach().clone()
    try:
        with torch.no_grad():
            head.add_(torch.randn(head.shape, generator=torch.Generator().manual_seed(0)) * 5 * saved.std())
        post = suite.probe(engine, known)
    finally:
        with torch.no_grad():
            head.copy_(saved)
    changed = suite.metrics(known, pre, post)
    assert changed["Efficacy_post"] == float(post["prompts"][0]["answer"].lower() == own.lower())
    assert changed["Locality"] == float(post["prompts"][-1]["answer"].lower() == pre["prompts"][-1]["answer"].lower())


def test_wild_beside_counterfact_in_a_run(tmp_path, tiny_bundles):
    bundle = tiny_bundles["llama"]
    config = parse_config({
        "model": "tiny-llama", "seed": 0, "output": str(tmp_path), "methods": [{"name": "rome",
                                                                                "overrides": {"v_steps": 3}}],
        "dataset": "counterfact", "slice": {"offset": 0, "limit": 2},
        "suites": ["counterfact", {"name": "wild", "options": {"max_new_tokens": 6}}]})
    Runner(config, out_dir=tmp_path, bundle=bundle, progress=False, log=lambda _m: None).run()
    rows = read_results(tmp_path / "results.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert row["protocol"]["wild"]["name"] == "wild" and "max_new_tokens 6" in row["protocol"]["wild"]["note"]
        assert row["protocol"]["counterfact"]["name"] != "wild"
        answers = [p["answer"] for p in row["post"]["wild"]["prompts"]]
        assert answers and all(isinstance(a, str) for a in answers)
        assert {"Efficacy_pre", "Efficacy_post", "Locality"} <= set(row["metrics"]["wild"])
        # the stored answers give the stored metrics (the metrics read the probes; the case only names errors)
        assert get_suite("wild", max_new_tokens=6).metrics(case(), row["pre"]["wild"], row["post"]["wild"]) \
            == row["metrics"]["wild"]
    summary = (tmp_path / "summary.md").read_text()
    assert "## wild on counterfact" in summary and "## counterfact on counterfact" in summary
    assert "## Wild minus teacher-forced (paired by case)" in summary
    # the report shows the same paired table (Markdown, HTML, LaTeX) right after the pivot
    from editscope.report import build_report

    html_path, md_path = build_report([tmp_path], tmp_path / "report")
    report = md_path.read_text()
    gap_rows = [line for line in summary.splitlines() if line.startswith("| counterfact | rome |")]
    assert len(gap_rows) == 3 and all(line in report for line in gap_rows)  # ES, PS and NS against the wild columns
    assert report.index("## All methods × headline metrics") < report.index("## Wild minus teacher-forced") \
        < report.index("## counterfact on counterfact")
    assert "<h2>Wild minus teacher-forced (paired by case)</h2>" in html_path.read_text()
    assert "Wild minus teacher-forced (paired by case)" in (tmp_path / "report" / "tables.tex").read_text()
    # the edit card replays the case and shows the answers the row stored, before and after
    from editscope.report.card import write_card
    from editscope.run.inspect import compute_card, job_from_run
    from tests.suites.test_collateral import known_fact_file

    known_fact_file(tmp_path / "facts.json", ScoringEngine(bundle))  # facts the random model "knows"
    row = rows[0]
    job = job_from_run(tmp_path, row["case_id"], method="rome", bundle=bundle, collateral_facts=5,
                       collateral_sources=[str(tmp_path / "facts.json")])
    card = compute_card(job, generate_tokens=0, progress=False)
    shown = [(a["prompt"], a["pre"], a["post"]) for a in card["suites"]["wild"]["answers"]]
    assert shown == [(a["prompt"], a["answer"], b["answer"])
                     for a, b in zip(row["pre"]["wild"]["prompts"], row["post"]["wild"]["prompts"], strict=True)]
    page = write_card(card, tmp_path / "card.html").read_text()
    assert "Answers the model generated for suite <code>wild</code>" in page
    assert html.escape(row["post"]["wild"]["prompts"][0]["answer"]) in page
    assert "| counterfact | rome | counterfact ES_post | Efficacy_post | first_object v2 | 2 |" in summary
    assert "| counterfact | rome | counterfact NS_post | Locality | same_start | 2 |" in summary



def test_protocol_gap_table_by_hand():
    from scipy import stats

    from editscope.run.summary_tables import protocol_gaps

    def row(method, es, eff, ps=None, gen=None, checkpoint=False, judge="first_object"):
        cf, wild = {"ES_post": es}, {"Efficacy_post": eff}
        if ps is not None:
            cf["PS_post"], wild["Generalization_post"] = ps, gen
        return {"dataset": "counterfact", "method": method, "checkpoint": checkpoint,
                "metrics": {"counterfact": cf, "wild": wild}, "protocol": {"wild": {"judge": judge}}}

    rows = [row("rome", 1.0, 0.0, 1.0, 1.0), row("rome", 1.0, 1.0, 0.5, 0.0), row("rome", 1.0, 0.0, 1.0, 0.0),
            row("rome", 0.0, 1.0, checkpoint=True),  # a checkpoint row: curves, not this table
            row("memit", 1.0, 1.0)]
    lines = protocol_gaps(rows, ["rome", "memit"])
    table = {(cells[1], cells[2]): cells for cells in (line.strip("| ").split(" | ") for line in lines[6:])}
    diffs = [-1.0, 0.0, -1.0]  # wild Efficacy minus ES, case by case
    half = stats.t.ppf(0.975, 2) * stats.tstd(diffs) / 3 ** 0.5
    mean = sum(diffs) / 3
    assert table[("rome", "counterfact ES_post")][3:] == ["Efficacy_post", "first_object",
        "3", "100.0", "33.3", f"{100 * mean:+.1f} [{100 * max(mean - half, -1):+.1f}, {100 * (mean + half):+.1f}]"]
    assert mean - half < -1  # the t interval leaves [-1, 1]: the table clips it there
    assert table[("rome", "counterfact PS_post")][8].startswith(f"{100 * (0 - 0.5 - 1) / 3:+.1f} [")
    assert table[("memit", "counterfact ES_post")][5:] == ["1", "100.0", "100.0", "+0.0"]  # one case: no interval
    # rows of two judges are two lines, never one mean; rows written before the judge was recorded read the note
    mixed = [row("memit", 1.0, 0.0, judge="exact_match"), row("memit", 1.0, 1.0)]
    old = {"dataset": "counterfact", "method": "memit", "metrics": {"counterfact": {"NS_post": 1.0},
                                                                  "wild": {"Locality": 0.0}},
           "protocol": {"wild": {"note": "context plain, judged whole by exact_match against target_new"}}}
    judged = {(c[3], c[4]): c for c in (line.strip("| ").split(" | ") for line in protocol_gaps([*mixed, old])[6:])}
    assert judged[("Efficacy_post", "exact_match")][5:8] == ["1", "100.0", "0.0"]
    assert judged[("Efficacy_post", "first_object")][5:8] == ["1", "100.0", "100.0"]
    assert judged[("Locality", "unchanged")][5:8] == ["1", "100.0", "0.0"]
    assert protocol_gaps([r for r in rows if r["method"] == "memit"][:0]) == []


def lifelong_rows(tmp_path, bundle, *, batch: int, rounds: int, wild: dict) -> list[dict]:
    """The rows of a MEMIT chain on the first ``batch * rounds`` CounterFact records, one checkpoint, both suites."""
    config = parse_config({
        "model": "tiny-llama", "seed": 0, "output": str(tmp_path),
        "mode": {"sequential_batches": {"batch": batch, "rounds": rounds, "checkpoints": 1}},
        "methods": [{"name": "memit", "overrides": {"v_steps": 2}}], "dataset": "counterfact",
        "slice": {"offset": 0, "limit": batch * rounds}, "suites": ["counterfact", {"name": "wild", "options": wild}]})
    Runner(config, out_dir=tmp_path, bundle=bundle, progress=False, log=lambda _m: None).run()
    return read_results(tmp_path / "results.jsonl")


def test_lifelong_checkpoints_reprobe_in_the_wild_too(tmp_path, tiny_bundles):
    rows = lifelong_rows(tmp_path, tiny_bundles["llama"], batch=2, rounds=2, wild={"max_new_tokens": 4})
    checkpoints = [r for r in rows if r.get("checkpoint")]
    assert checkpoints and len(rows) > len(checkpoints)
    for row in rows:  # the checkpoint re-probe and the final probe both measure both protocols
        assert {"counterfact", "wild"} <= set(row["metrics"]) and "Efficacy_post" in row["metrics"]["wild"]
        assert all(isinstance(p["answer"], str) for p in row["post"]["wild"]["prompts"])


def test_a_share_asks_the_same_cases_at_every_checkpoint(tmp_path, tiny_bundles):
    import hashlib

    rows = lifelong_rows(tmp_path, tiny_bundles["llama"], batch=4, rounds=3, wild={"max_new_tokens": 3, "share": 0.5})

    def below_half(case_id: str) -> bool:  # the case id's 64-bit blake2b digest, read as a fraction of 2^64
        return int(hashlib.blake2b(case_id.encode(), digest_size=8).hexdigest(), 16) < 2 ** 63

    asked = {r["case_id"] for r in rows if r["metrics"]["wild"]}
    assert asked == {r["case_id"] for r in rows if below_half(str(r["case_id"]))} and 0 < len(asked) < 12
    for row in rows:  # checkpoints and final rows alike; the teacher-forced suite still probes every case
        assert ("Efficacy_post" in row["metrics"]["wild"]) == (row["case_id"] in asked)
        assert bool(row["post"]["wild"]["prompts"]) == (row["case_id"] in asked)
        assert "ES_post" in row["metrics"]["counterfact"]
        assert "asked of the cases whose id hashes below share 0.5" in row["protocol"]["wild"]["note"]
    summary = (tmp_path / "summary.md").read_text()
    wild = summary[summary.index("## wild on counterfact"):]
    assert f"| memit | {len(asked)} |" in wild  # the wild means are over the cases asked about
    with pytest.raises(EditscopeError, match="option share must be a number in \\(0, 1\\]"):
        WildSuite(share=0)


def test_a_registered_judge_that_raises_names_itself_and_the_case(monkeypatch):
    class Failing:
        name, binary = "failing", True

        def __call__(self, question, prediction, golds):
            raise TimeoutError("no answer from the judge")

    from editscope.metrics.answers import JUDGES

    monkeypatch.setitem(JUDGES, "failing", Failing())
    c = case()
    pre = probe("France", ["France"], ["Shakespeare"], c)
    with pytest.raises(EditscopeError) as info:
        WildSuite(judge="failing").metrics(c, pre, pre)
    assert str(info.value) == ("wild suite: case c1, prompt 'Danielle Darrieux is a citizen of': judge 'failing': "
                               "raised TimeoutError: no answer from the judge")


def test_target_true_judges_what_the_model_says_of_the_old_fact():
    """``target: target_true``: the rewrite and paraphrase answers are judged against the true answer (what an
    unedited model knows), the edit still writes target_new; a case without a true answer is one line."""
    c = case(paraphrases=("p1", "p2"))
    suite = WildSuite(target="target_true", judge="exact_match", locality_judge="unchanged")
    assert [(role, gold) for _p, role, gold in suite.questions(c)] == \
        [("rewrite", ["France"]), ("paraphrase", ["France"]), ("paraphrase", ["France"]),
         ("neighborhood", ["Shakespeare"])]
    assert suite.edit_requests(c) == list(c.requests) and c.request.target_new == "Japan"
    said = {"prompts": [{"prompt": p, "role": r, "gold": g, "answer": a} for (p, r, g), a in
                        zip(suite.questions(c), ["France", "France", "Japan", "Shakespeare"], strict=True)]}
    row = suite.metrics(c, said, said)
    assert row["Efficacy_pre"] == 1.0 and row["Generalization_pre"] == 0.5
    qa = Case("q1", "test", (EditRequest("{} plays", "X", "piano", None),))
    with pytest.raises(EditscopeError, match="case q1: target target_true needs the case's true answer"):
        suite.questions(qa)
    assert "against target_true" in suite.protocol["note"]
