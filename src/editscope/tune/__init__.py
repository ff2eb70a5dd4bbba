"""Hyperparameter search with evidence (``editscope tune``): the knobs each editor and plug-in declares
(``TUNABLE``), candidate layers from the causal-trace layer curve, validation cases no shipped config reports on,
successive halving through the ordinary runner, the choice by the lower CI bound behind a locality guard, and an
hparams YAML with its provenance. Sits above :mod:`editscope.run` (it runs candidates) and below the report and
the commands."""

from editscope.tune.driver import Tuner, TuneResult, TuneSettings
from editscope.tune.search import (
    OBJECTIVES,
    CandidateScore,
    Objective,
    rung_sizes,
    select,
    successive_halving,
    survivors,
)
from editscope.tune.space import Candidate, layer_candidates
from editscope.tune.validation import validation_slice

__all__ = ["OBJECTIVES", "Candidate", "CandidateScore", "Objective", "TuneResult", "TuneSettings", "Tuner",
           "layer_candidates", "rung_sizes", "select", "successive_halving", "survivors", "validation_slice"]
