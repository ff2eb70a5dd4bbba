"""One owner of the edited model: the bundle's fingerprint follows applied patches, so layer statistics of
edited weights are cached apart from the unedited model's, and an edit session applies and reverts in order."""

from __future__ import annotations

import warnings

import pytest
import torch
from safetensors.torch import load_file

from editscope.data.records import EditRequest
from editscope.edit.patch import Patch, tensor_checksum
from editscope.edit.session import EditSession
from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.lm.bundle import fingerprint_model
from editscope.lm.engine import ScoringEngine
from editscope.stats import Corpus, cache_file, corpus_rows
from editscope.stats.second_moment import second_moment
from tests.stats.test_second_moment import naive_second_moment

BUDGET, SEQ = 256, 32
LAYER = 2  # the MLP keys of layer 2 depend on layer 1's down projection, which ROME edits on tiny-llama
REQUEST_A = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France")
REQUEST_B = EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch")


@pytest.fixture
def session(monkeypatch, tmp_path):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path))
    with EditSession(load("tiny-llama")) as s:
        yield s
    assert not s.bundle.applied


def stats(bundle, **kw):
    return second_moment(bundle, LAYER, token_budget=BUDGET, seq_len=SEQ, progress=False, **kw)


def checksums(bundle):
    return {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()}


def test_stats_of_an_edited_model_never_land_under_the_base_key(session):
    bundle = session.bundle
    base_fp = bundle.base_fingerprint
    assert session.fingerprint == base_fp == fingerprint_model(bundle.model)
    digest = Corpus.default().digest
    base_path = cache_file(base_fp, LAYER, digest, BUDGET, SEQ)
    rows = corpus_rows(ScoringEngine(bundle), Corpus.default(), BUDGET, SEQ)
    base = stats(bundle)
    assert base_path.is_file()

    patch = session.apply("rome", REQUEST_A)
    assert session.patches == (patch,) and session.fingerprint not in (base_fp, fingerprint_model(bundle.model))
    edited = stats(bundle)
    edited_path = cache_file(session.fingerprint, LAYER, digest, BUDGET, SEQ)
    assert edited_path.is_file() and edited_path != base_path
    assert torch.allclose(edited, naive_second_moment(bundle, rows, LAYER), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(edited, base)
    assert torch.equal(load_file(base_path)["mom2"], base)  # the base file still holds the base values
    # ROME/MEMIT's convention during sequential editing: C of the unedited model, read with the edit applied
    before = checksums(bundle)
    assert torch.equal(stats(bundle, weights="base"), base)
    assert checksums(bundle) == before and session.patches == (patch,)

    assert session.revert() is patch and session.fingerprint == base_fp and not patch.applied
    again = stats(bundle)
    assert torch.equal(again, base)
    assert torch.allclose(again, naive_second_moment(bundle, rows, LAYER), rtol=1e-5, atol=1e-7)
    assert torch.equal(load_file(base_path)["mom2"], base)


def test_base_stats_computed_during_an_edit_are_of_the_unedited_weights(session):
    bundle = session.bundle
    rows = corpus_rows(ScoringEngine(bundle), Corpus.default(), BUDGET, SEQ)
    want = naive_second_moment(bundle, rows, LAYER)
    with session.edited("rome", REQUEST_A):
        before = checksums(bundle)
        got = stats(bundle, weights="base")  # not cached yet: computed on the reverted weights
        assert checksums(bundle) == before
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)
    assert torch.equal(load_file(cache_file(bundle.base_fingerprint, LAYER, Corpus.default().digest, BUDGET,
                                            SEQ))["mom2"], got)


def test_weights_changed_outside_a_patch_are_not_served_stale_stats(session):
    bundle = session.bundle
    base = stats(bundle)
    weight = bundle.model.get_parameter(bundle.arch.weight_name(0))
    original = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(1.5)
    try:
        assert session.fingerprint == bundle.base_fingerprint  # not tracked: no patch
        with pytest.warns(UserWarning, match="other weights"):
            changed = stats(bundle)
        rows = corpus_rows(ScoringEngine(bundle), Corpus.default(), BUDGET, SEQ)
        assert torch.allclose(changed, naive_second_moment(bundle, rows, LAYER), rtol=1e-5, atol=1e-7)
    finally:
        with torch.no_grad():
            weight.copy_(original)
    with pytest.warns(UserWarning, match="other weights"):  # the overwritten file is caught again
        assert torch.equal(stats(bundle), base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(stats(bundle), base)


def test_sequential_edits_apply_and_revert_in_order(session, tmp_path):
    bundle = session.bundle
    base = checksums(bundle)
    p1 = session.apply("rome", REQUEST_A)
    fp1 = session.fingerprint
    p2 = session.apply("rome", REQUEST_B)  # computed on the edited weights: records their fingerprint
    fp2 = session.fingerprint
    assert p1.fingerprint == bundle.base_fingerprint and p2.fingerprint == fp1 and len({fp1, fp2}) == 2
    with pytest.raises(EditscopeError, match="reverse order"):
        p1.revert(bundle)  # both edit layer 1's down projection
    assert session.patches == (p1, p2)
    paths = [p.save(tmp_path / f"p{i}.safetensors") for i, p in enumerate((p1, p2))]
    edited = checksums(bundle)
    assert session.revert_all() == [p2, p1]
    assert checksums(bundle) == base and session.fingerprint == bundle.base_fingerprint

    # the saved sequence re-applies in order (same fingerprints), and not out of order
    other = load("tiny-llama")
    q1, q2 = (Patch.load(p) for p in paths)
    with pytest.raises(EditscopeError, match="fingerprint"):
        q2.apply(other)
    q1.apply(other)
    assert other.fingerprint == fp1
    q2.apply(other)
    assert other.fingerprint == fp2
    assert checksums(other) == edited
    q2.revert(other)
    q1.revert(other)
    assert other.fingerprint == other.base_fingerprint == bundle.base_fingerprint


def test_disjoint_patches_may_be_reverted_out_of_order(session):
    bundle = session.bundle
    name0, name1 = bundle.arch.weight_name(0), bundle.arch.weight_name(3)
    params = dict(bundle.model.named_parameters())

    def patch(name):
        delta = torch.full_like(params[name], 0.01)
        return Patch({name: delta}, "manual", {}, bundle.fingerprint, {name: tensor_checksum(params[name])})

    a = patch(name0)
    a.apply(bundle)
    b = patch(name1)
    b.apply(bundle)
    fp_ab = bundle.fingerprint
    a.revert(bundle)
    assert session.patches == (b,) and bundle.fingerprint not in (fp_ab, bundle.base_fingerprint)


def test_session_scores_follow_the_weights(session):
    pair = [(REQUEST_A.text, REQUEST_A.target_new)]
    before = session.engine.score(pair)[0].sum
    with session.edited("rome", REQUEST_A):
        during = session.engine.score(pair)[0].sum
        assert during == pytest.approx(ScoringEngine(session.bundle).score(pair)[0].sum, abs=1e-5)
        assert during != pytest.approx(before, abs=1e-3)
    assert session.engine.score(pair)[0].sum == pytest.approx(before, abs=1e-6)
