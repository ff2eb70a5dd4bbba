"""Pure metric functions: arrays in, numbers out; no model, no I/O, no torch (DESIGN rule 4).

One module per family, each function citing its paper (../shared/papers) and equation:

* :mod:`.rewrite` -- CounterFact ES/PS/NS/Score and magnitudes, zsRE top-1, EasyEdit's token accuracy
  (paper 002, eqs 21-26);
* :mod:`.generation` -- GE n-gram entropy and RS TF-IDF cosine (paper 002, eq 27 and C.2);
* :mod:`.one_to_n` -- NKL, MaxAcc, Precision@K, PPL, gold distributions (paper 000, eqs 1-13);
* :mod:`.additivity` -- PEAK RFF/RNF/CPC/FPC/AFF/ANF and appending ES/GS/LS (paper 003, eqs 1-6);
* :mod:`.klob` -- KLoB Sim, RSim, RSD (paper 001, section 3.4, appendix A);
* :mod:`.stability` -- EVK Embedding/Text Stability (paper 004, eq 9);
* :mod:`.answers` -- answers judged in the wild (Mirage of Model Editing, Yang et al., ACL 2025): SQuAD answer
  normalisation, exact match and token F1 (Rajpurkar et al., 2016), pluggable answer judges (``JUDGES``).
* :mod:`.agreement` -- a binary judge against hand labels: accuracy, Cohen's κ (Cohen 1960), false-positive and
  false-negative rates with intervals (not re-exported: it imports scipy.stats through :mod:`.intervals`);
* :mod:`.intervals` -- Student t and geometric-mean intervals, percentile-bootstrap aggregates over cases
  (not re-exported here: it imports scipy.stats; import it from the module).

Bad inputs (NaN/inf, empty, mismatched shapes, out of range) raise :class:`MetricInputError`, a
``ValueError`` whose message starts with the argument's name.
"""

from editscope.metrics._validate import MetricInputError
from editscope.metrics.additivity import (
    additivity,
    aff,
    anf,
    appending_efficacy,
    appending_generalization,
    appending_locality,
    cpc,
    fpc,
    peak_answer_filter,
    rff,
    rnf,
)
from editscope.metrics.answers import (
    JUDGES,
    AnswerMatchJudge,
    Judge,
    answer_tokens,
    contains_answer,
    exact_match,
    judge_answer,
    normalize_answer,
    token_f1,
)
from editscope.metrics.generation import (
    fit_tfidf,
    generation_entropy,
    ngram_entropy,
    reference_score,
    tfidf_from_state,
    tfidf_state,
    word_tokenize,
)
from editscope.metrics.klob import (
    rsd,
    rsd_from_sd,
    rsim,
    rsim_from_results,
    sim,
    sim_all,
    sim_cand,
    top_k_mask,
)
from editscope.metrics.one_to_n import (
    answer_logprob,
    gold_distribution,
    kl_divergence,
    max_acc,
    max_acc_mean,
    nkl,
    nkl_mean,
    perplexity,
    perplexity_mean,
    precision_at_k,
    precision_at_k_mean,
)
from editscope.metrics.rewrite import (
    easyedit_locality,
    easyedit_token_accuracy,
    editing_score,
    efficacy_magnitude,
    efficacy_success,
    neighborhood_magnitude,
    neighborhood_success,
    paraphrase_magnitude,
    paraphrase_success,
    prompt_token_accuracy,
    top1_correct,
    zsre_efficacy,
    zsre_paraphrase,
    zsre_specificity,
)
from editscope.metrics.stability import (
    cosine_stability,
    embedding_stability,
    mean_stability,
    text_stability,
)

__all__ = [
    "MetricInputError",
    # answers (evaluation in the wild; SQuAD)
    "JUDGES",
    "AnswerMatchJudge",
    "Judge",
    "answer_tokens",
    "contains_answer",
    "exact_match",
    "judge_answer",
    "normalize_answer",
    "token_f1",
    # additivity (paper 003)
    "additivity",
    "aff",
    "anf",
    "appending_efficacy",
    "appending_generalization",
    "appending_locality",
    "cpc",
    "fpc",
    "peak_answer_filter",
    "rff",
    "rnf",
    # generation (paper 002)
    "fit_tfidf",
    "generation_entropy",
    "ngram_entropy",
    "reference_score",
    "tfidf_from_state",
    "tfidf_state",
    "word_tokenize",
    # klob (paper 001)
    "rsd",
    "rsd_from_sd",
    "rsim",
    "rsim_from_results",
    "sim",
    "sim_all",
    "sim_cand",
    "top_k_mask",
    # one_to_n (paper 000)
    "answer_logprob",
    "gold_distribution",
    "kl_divergence",
    "max_acc",
    "max_acc_mean",
    "nkl",
    "nkl_mean",
    "perplexity",
    "perplexity_mean",
    "precision_at_k",
    "precision_at_k_mean",
    # rewrite (paper 002)
    "easyedit_locality",
    "easyedit_token_accuracy",
    "editing_score",
    "efficacy_magnitude",
    "efficacy_success",
    "neighborhood_magnitude",
    "neighborhood_success",
    "paraphrase_magnitude",
    "paraphrase_success",
    "prompt_token_accuracy",
    "top1_correct",
    "zsre_efficacy",
    "zsre_paraphrase",
    "zsre_specificity",
    # stability (paper 004)
    "cosine_stability",
    "embedding_stability",
    "mean_stability",
    "text_stability",
]
