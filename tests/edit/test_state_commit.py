"""A sequential editor's state takes an edit's update only once the edit is accepted: ``compute`` works on a fork
of the caller's state and :meth:`Editor.apply` commits it after the patch's checks (DESIGN rule 5)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from editscope.edit import get_editor
from editscope.edit.patch import tensor_checksum
from editscope.edit.registry import Editor
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine

SEQUENTIAL = ["alphaedit", "prune", "ultraedit"]


def with_nan_delta(editor: Editor) -> Editor:
    """The same editor (state class, presolve, real formula) whose ΔW then gets one NaN entry."""
    def compute(*args, **kwargs):
        deltas, info = editor.compute(*args, **kwargs)
        name = sorted(deltas)[0]
        deltas[name] = deltas[name].clone()
        deltas[name][0, 0] = math.nan
        return deltas, info

    return dataclasses.replace(editor, name=f"nan_{editor.name}", compute=compute)


def same_state(a, b) -> bool:
    (ta, ma), (tb, mb) = a.state_dict(), b.state_dict()
    return ma == mb and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.parametrize("method", SEQUENTIAL)
def test_a_refused_edit_leaves_the_callers_state_unchanged(tiny_bundles, request_a, request_b, method):
    bundle = tiny_bundles["llama"]
    editor = get_editor(method)
    hp = editor.load_hparams(bundle)
    engine = ScoringEngine(bundle)
    state = editor.new_state()
    first = editor.apply(bundle, request_a, hp, state, engine=engine)
    try:
        assert not same_state(state, editor.new_state())  # the accepted edit was committed
        before = copy.deepcopy(state)
        weights = {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()}
        with pytest.raises(EditscopeError, match=f"^nan_{method}: .* produced non-finite values"):
            with_nan_delta(editor).apply(bundle, request_b, hp, state, engine=engine)
        assert same_state(state, before)
        assert weights == {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()}
        # the next accepted edit computes exactly as from a copy taken before the refused one, and is committed
        reference = copy.deepcopy(before)
        second = editor.apply(bundle, request_b, hp, state, engine=engine)
        second.revert(bundle)
        again = editor.apply(bundle, request_b, hp, reference, engine=engine)
        again.revert(bundle)
        assert second.deltas.keys() == again.deltas.keys()
        assert all(torch.equal(second.deltas[n], again.deltas[n]) for n in second.deltas)
        assert same_state(state, reference) and not same_state(state, before)
    finally:
        first.revert(bundle)


@pytest.mark.parametrize("method", SEQUENTIAL)
def test_compute_patch_leaves_the_state_unchanged(tiny_bundles, request_a, method):
    bundle = tiny_bundles["llama"]
    editor = get_editor(method)
    state = editor.new_state()
    before = copy.deepcopy(state)
    patch = editor.compute_patch(bundle, request_a, editor.load_hparams(bundle), state)
    assert patch.deltas and same_state(state, before)
