"""Context edits: the new facts live in the text the model reads before each prompt, not in its weights.

A :class:`ContextEdit` holds the facts stated so far (the editor's store), optional demonstrations (IKE) and how to
choose facts for a prompt: every fact (PROMPT, IKE) or the ``top_k`` a retriever ranks first for it (retrieval). In
force on a bundle, the scoring engine puts :meth:`ContextEdit.prefix` before every prompt it encodes
(:meth:`editscope.lm.engine.ScoringEngine.in_context`), so a teacher-forced suite scores the same continuation after
the same prompt with the context in front (ES/PS/NS, zsRE top-1 keep their meaning) and the wild suite generates
after it. The layout is EasyEdit's (zjunlp/EasyEdit, examples/PROMPT.md)::

    {instruction}{demonstrations}New Fact: {fact}\\n ... Prompt: {prompt}

with each fact written ``"{prompt with subject} {target_new}."`` and each demonstration ``"New Fact: {fact}\\nPrompt:
{probe} {answer}\\n\\n"`` (IKE, Zheng et al. EMNLP 2023, §3.2).

:class:`ContextStore` is the editors' sequential state: the facts stated so far (and their embeddings, for the
``hidden`` retriever). Single and batch edits state their own facts; ``sequential`` and lifelong chains state every
fact stored so far, as a deployed context editor would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

from editscope.data.records import EditRequest
from editscope.edit.hparams import HParams, Params
from editscope.edit.intervention import StoredEdit
from editscope.edit.retrievers import BM25, HiddenStates, check_retriever, mean_hidden
from editscope.edit.state import EditState
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle

FORMAT = "editscope-context-1"

EASYEDIT_INSTRUCTION = "Please acknowledge the following new facts and use them to answer the question:\n"
"""EasyEdit's PROMPT header (zjunlp/EasyEdit examples/PROMPT.md)."""


def fact_text(request: EditRequest) -> str:
    """A request as a stated fact: ``"Danielle Darrieux's mother tongue is English."``."""
    return f"{request.text.rstrip()} {request.target_new.strip()}."


def render(instruction: str, demos: Sequence[str], facts: Sequence[str]) -> str:
    """The text before a prompt (see the module docstring)."""
    return instruction + "".join(demos) + "".join(f"New Fact: {f}\n" for f in facts) + "Prompt: "


@dataclass
class ContextHParams(HParams):
    """Hyperparameters of a context editor: no layers (it writes no weight); ``instruction`` opens the context."""

    LAYERLESS: ClassVar[bool] = True
    layers: list[int] = field(default_factory=list)
    instruction: str = EASYEDIT_INSTRUCTION

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        Params.check(self, where, n_layers)
        if self.layers:
            raise EditscopeError(f"{where}: key 'layers': a context editor writes no layer, got {self.layers}")


class ContextStore(EditState):
    """The facts a context editor has stated (oldest first) and, for the ``hidden`` retriever, their embeddings
    ([n, hidden] float32; replaced, never written into)."""

    def __init__(self, facts: Sequence[str] = (), embeddings: torch.Tensor | None = None,
                 demos: Sequence[str] = ()) -> None:
        self.facts: tuple[str, ...] = tuple(facts)
        self.embeddings = embeddings
        self.demos: tuple[str, ...] = tuple(demos)

    def without_edits(self) -> ContextStore:
        return ContextStore()

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {"embeddings": self.embeddings} if self.embeddings is not None else {}
        return tensors, {"facts": list(self.facts), "demos": list(self.demos)}

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], where: str) -> Self:
        facts, demos = meta.get("facts"), meta.get("demos", [])
        if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
            raise EditscopeError(f"{where}: context store: 'facts' must be a list of strings")
        if not isinstance(demos, list) or not all(isinstance(d, str) for d in demos):
            raise EditscopeError(f"{where}: context store: 'demos' must be a list of strings")
        unexpected = set(tensors) - {"embeddings"}
        if unexpected:
            raise EditscopeError(f"{where}: context store: unexpected tensor(s) {sorted(unexpected)}")
        emb = tensors.get("embeddings")
        if emb is not None and emb.shape[0] != len(facts):
            raise EditscopeError(f"{where}: context store: {emb.shape[0]} embeddings for {len(facts)} facts")
        return cls(facts, emb, demos)

    def add(self, facts: Sequence[str], embeddings: torch.Tensor | None = None) -> None:
        """Store more facts (new containers: a fork's parent keeps its own)."""
        self.facts = self.facts + tuple(facts)
        if embeddings is not None:
            old = self.embeddings
            self.embeddings = embeddings if old is None else torch.cat([old, embeddings.to(old)])


@dataclass(eq=False, kw_only=True)
class ContextEdit(StoredEdit):
    """The context a context editor put on a model (see the module docstring). ``top_k`` None: every fact before
    every prompt; else the ``top_k`` facts ``retriever`` ranks first for the prompt (fewer while the store holds
    fewer)."""

    kind: ClassVar[str] = "context"
    FORMAT: ClassVar[str] = FORMAT

    facts: tuple[str, ...]
    instruction: str = ""
    demos: tuple[str, ...] = ()
    top_k: int | None = None
    retriever: str = "bm25"
    embeddings: torch.Tensor | None = field(default=None, repr=False)
    _index: Any = field(default=None, repr=False)
    _chosen: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.top_k is not None and self.top_k < 1:
            raise EditscopeError(f"{self.method}: top_k must be >= 1, got {self.top_k}")
        check_retriever(self.retriever, f"<{self.method} edit>")
        if self.top_k is not None and self.retriever == "hidden" and (
                self.embeddings is None or self.embeddings.shape[0] != len(self.facts)):
            raise EditscopeError(f"{self.method}: the hidden retriever needs one embedding per stored fact")

    # -- what the engine reads ---------------------------------------------------------------------------
    def prefix(self, prompt: str) -> str:
        """The text before ``prompt`` (computed once per prompt and kept: a prompt is encoded several times)."""
        text = self._chosen.get(prompt)
        if text is None:
            text = render(self.instruction, self.demos, self.chosen_facts(prompt))
            self._chosen[prompt] = text
        return text

    def chosen_facts(self, prompt: str) -> list[str]:
        """The facts stated before ``prompt``: all, or the ``top_k`` the retriever ranks first (best last, nearest
        the prompt)."""
        if self.top_k is None:
            return list(self.facts)
        if self._index is None:
            self._index = (BM25(self.facts) if self.retriever == "bm25" else
                           HiddenStates(self.embeddings, lambda texts: mean_hidden(self._bundle(), texts)))
        return [self.facts[i] for i in reversed(self._index.top_k(prompt, self.top_k))]

    def _bundle(self) -> Bundle:
        if self._target is None:
            raise EditscopeError(f"{self.method}: the hidden retriever embeds queries with the model it is applied to")
        return self._target

    # -- StoredEdit -------------------------------------------------------------------------------------
    def _attach(self, target: Bundle) -> None:
        target.add_context(self)

    def _detach(self, target: Bundle) -> None:
        target.remove_context(self)

    def fields(self) -> dict[str, Any]:
        return {"facts": list(self.facts), "instruction": self.instruction, "demos": list(self.demos),
                "top_k": self.top_k, "retriever": self.retriever}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"embeddings": self.embeddings} if self.embeddings is not None else {}

    def describe(self) -> str:
        chosen = "every fact" if self.top_k is None else f"top {self.top_k} by {self.retriever}"
        return f"facts        {len(self.facts)} stored; demonstrations {len(self.demos)}; {chosen} before each prompt"

    @classmethod
    def load(cls, path: str | Path, *, trust_unverified: bool | None = None) -> ContextEdit:
        """Read a file :meth:`save` wrote (content digest checked first; one line naming the file and key)."""
        common, tensors = cls.read(path, trust_unverified)
        f = common.pop("fields")
        try:
            facts, demos = tuple(f["facts"]), tuple(f["demos"])
            top_k, instruction, retriever = f["top_k"], f["instruction"], f["retriever"]
        except KeyError as exc:
            raise EditscopeError(f"{path}: context edit metadata: key 'fields': {exc} is missing") from None
        if not all(isinstance(x, str) for x in facts + demos) or not isinstance(instruction, str) or not (
                top_k is None or isinstance(top_k, int)):
            raise EditscopeError(f"{path}: context edit metadata: key 'fields': facts, demos and instruction must be "
                                 "strings, top_k an integer or null")
        return cls(facts=facts, demos=demos, top_k=top_k, instruction=instruction, retriever=retriever,
                   embeddings=tensors.get("embeddings"), **common)


def context_edit(method: str, bundle: Bundle, requests: Sequence[EditRequest], hp: ContextHParams,
                 store: ContextStore, **kwargs: Any) -> ContextEdit:
    """The edit stating everything ``store`` holds (after the caller added this edit's facts)."""
    return ContextEdit(method=method, hparams=hp.to_dict(), fingerprint=bundle.base_fingerprint,
                       facts=store.facts, demos=store.demos, instruction=hp.instruction, model_name=bundle.name,
                       requests=[dict(prompt=r.prompt, subject=r.subject, target_new=r.target_new,
                                      target_true=r.target_true) for r in requests], **kwargs)
