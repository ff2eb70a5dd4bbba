"""The unedited model's probes shared between runs (``Runner(pre_probes=...)``, what a tune's candidates use): a run
that takes its pre probes from the cache writes the rows a run computing them itself writes, each group is probed
once across runs that differ only in their methods, and a run of other settings does not reuse them."""

from __future__ import annotations

from editscope.run import Runner, parse_config, read_results
from editscope.run.trial import PreProbeCache, Probes
from tests.run.helpers import close


def cfg(lr: float, **changes):
    data = {"model": "tiny-llama", "seed": 0, "output": "unused",
            "methods": [{"name": "ft", "overrides": {"lr": lr, "steps": 2}}],
            "dataset": "counterfact", "slice": {"offset": 0, "limit": 3}, "suites": ["counterfact"]}
    return parse_config(data | changes)


def run_into(out, bundle, config, cache=None):
    Runner(config, out_dir=out, bundle=bundle, progress=False, log=lambda _m: None, pre_probes=cache).run()
    return sorted(read_results(out / "results.jsonl"), key=lambda r: r["index"])


def test_runs_share_the_unedited_probes_and_write_the_rows_of_a_run_without_the_cache(tmp_path, tiny_llama):
    cache = PreProbeCache()
    run_into(tmp_path / "a", tiny_llama, cfg(1e-3), cache)
    assert (cache.misses, cache.hits) == (3, 0)  # single edits: one group, one pre probe per case
    shared = run_into(tmp_path / "b", tiny_llama, cfg(5e-3), cache)
    assert (cache.misses, cache.hits) == (3, 3)
    alone = run_into(tmp_path / "c", tiny_llama, cfg(5e-3))
    assert [r["case_id"] for r in shared] == [r["case_id"] for r in alone]
    for s, a in zip(shared, alone, strict=True):
        assert close(s["pre"], a["pre"]) and close(s["post"], a["post"]) and close(s["metrics"], a["metrics"])
    # another seed or other cases: other pre probes, computed again
    run_into(tmp_path / "d", tiny_llama, cfg(1e-3, seed=1), cache)
    run_into(tmp_path / "e", tiny_llama, cfg(1e-3, slice={"offset": 1, "limit": 3}), cache)
    assert (cache.misses, cache.hits) == (9, 3)


def test_a_sequential_chain_probes_its_cases_once_for_every_method(tmp_path, tiny_llama):
    cache = PreProbeCache()
    seq = {"sequential_batches": {"batch": 2, "rounds": 2, "checkpoints": 2}}
    run_into(tmp_path / "a", tiny_llama, cfg(1e-3, mode=seq, slice={"offset": 0, "limit": 4}), cache)
    rows = run_into(tmp_path / "b", tiny_llama, cfg(5e-3, mode=seq, slice={"offset": 0, "limit": 4}), cache)
    assert (cache.misses, cache.hits) == (1, 1)
    alone = run_into(tmp_path / "c", tiny_llama, cfg(5e-3, mode=seq, slice={"offset": 0, "limit": 4}))
    assert len(rows) == len(alone) == 4
    assert all(close(s["pre"], a["pre"]) and close(s["metrics"], a["metrics"]) for s, a in zip(rows, alone,
                                                                                               strict=True))


def test_each_lookup_gets_its_own_copy_and_the_oldest_entry_makes_room():
    calls = []

    def compute(tag: str):
        def probe() -> Probes:
            calls.append(tag)
            return Probes({"s": [{"x": [1.0, 2.0], "tag": tag}]}, 0.5)
        return probe

    cache = PreProbeCache(max_entries=2)
    first = cache.get(("a",), compute("a"))
    first.by_suite["s"][0]["x"].append(3.0)  # a run's rows never reach another run's probe
    again = cache.get(("a",), compute("a"))
    assert again.by_suite == {"s": [{"x": [1.0, 2.0], "tag": "a"}]} and calls == ["a"]
    cache.get(("b",), compute("b"))
    cache.get(("c",), compute("c"))  # evicts "a"
    cache.get(("a",), compute("a"))
    assert calls == ["a", "b", "c", "a"] and (cache.hits, cache.misses) == (1, 4)

