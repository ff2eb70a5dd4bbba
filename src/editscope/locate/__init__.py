"""Knowledge-locating methods with one result format (:class:`LocateResult`).

``locate(engine, method, template, subject, answer, **options)`` runs one method on one fact; :data:`METHODS`
lists them: causal tracing (ROME), knowledge neurons (integrated gradients, Dai et al.), gradient × activation,
activation magnitude and a random baseline. KLoB (paper 001) compares their neuron scores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.locate.attribution import activation, grad_x_activation, knowledge_neurons, random_scores
from editscope.locate.causal_trace import trace
from editscope.locate.prompt import LocatePrompt, encode_prompt
from editscope.locate.result import STATE_KINDS, LocateResult
from editscope.ranges import check

__all__ = ["METHODS", "OPTION_RANGES", "STATE_KINDS", "LocatePrompt", "LocateResult", "encode_prompt", "locate"]

#: method name -> function(engine, prompt, *, progress: bool, **options) -> LocateResult; ``progress`` (a tqdm bar
#: on stderr, never a changed number) is taken by every method, a bar drawn by those with a long loop
METHODS: dict[str, Callable[..., LocateResult]] = {
    "causal_trace": trace,
    "kn": knowledge_neurons,
    "grad_x_act": grad_x_activation,
    "activation": activation,
    "random": random_scores,
}

#: the declared range of each numeric option (:mod:`editscope.ranges` notation, kind): checked by :func:`locate`
#: and used as the argparse types of ``editscope locate`` and ``bench klob``
OPTION_RANGES: dict[str, tuple[str, type[int] | type[float]]] = {
    "samples": ("[1, inf)", int), "noise": ("(0, inf)", float), "window": ("[1, inf)", int),
    "steps": ("[1, 10000]", int),
}


def locate(engine: ScoringEngine, method: str, template: str, subject: str | None, answer: str | None,
           **options: Any) -> LocateResult:
    """Run ``method`` on the fact ``template.format(subject)`` -> ``answer`` (None: the model's greedy token).
    ``progress=True/False`` among ``options`` turns the method's progress bar on or off (default: the method's)."""
    fn = METHODS.get(method)
    if fn is None:
        raise EditscopeError(f"unknown locating method {method!r}; choose from {', '.join(METHODS)}")
    for name, (text, kind) in OPTION_RANGES.items():
        if options.get(name) is not None:
            check(f"locate {method}: option {name}", options[name], text, kind)
    return fn(engine, encode_prompt(engine, template, subject, answer), **options)
