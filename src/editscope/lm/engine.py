"""The scoring engine: the one place that tokenizes for scoring and turns text into probabilities.

Every probability a suite, an editor objective or a metric needs comes from here:

- :meth:`ScoringEngine.score` — log-probs of continuations given contexts (per token, sum, mean, and
  whether each token is the argmax, for zsRE top-1). A context and the prefix tree of all its
  continuations go through the model as one sequence with a tree-shaped attention mask (prefix sharing:
  the context and every shared continuation prefix are computed once, in one large forward instead of a
  KV-cache forward per continuation length); the LM head runs only on positions whose logits are read;
  batches are sized by a token budget.
- :meth:`ScoringEngine.next_token_logprobs` — the next-token distribution (full or top-k).
- :meth:`ScoringEngine.hidden_states` — any per-block hook point (residual stream, MLP key, ...) at one position.
- :meth:`ScoringEngine.generate` — greedy or seeded top-k sampling.
- :meth:`ScoringEngine.prepare` / :meth:`ScoringEngine.batch_logprobs` — a differentiable padded forward
  of pre-tokenized pairs, for editor objectives that optimise through the model.

All of these accept context embeddings instead of token ids (``context_embeds``, EVK perturbs them).

Boundary rule (DESIGN.md rule 2, as lm-evaluation-harness): a trailing space of the context moves to the
continuation; with ``add_space`` (default) a continuation that starts without whitespace after a context that
ends without whitespace is scored with a leading space ("Paris" -> " Paris"). Context and continuation are
encoded together and split at the length of the encoded context. An empty context ("") is the start token
(BOS, else EOS, declared on the architecture map) and the continuation is scored as the start of a document.

Chat template (``chat_template=True``, for instruct models): every prompt becomes the user turn of the
tokenizer's chat template with the generation prompt, ``head + prompt + tail`` (:class:`ChatFormat`), here and
nowhere else. :meth:`ScoringEngine.encode` gives ``head + text`` (so token positions that callers compute from a
prefix of the prompt -- a subject's last token, EVK spans -- are positions in the wrapped sequence), every context
gets the tail (as tokens, or as embeddings after ``context_embeds``), and a continuation is the start of the
assistant's turn: the prompt's trailing whitespace is dropped and no space is added ("Paris", not " Paris"). An
empty context is not a prompt: unconditional text is scored raw, from the start token, as without the template.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from transformers import DynamicCache

from editscope.errors import EditscopeError
from editscope.lm.archs import BLOCK_POINT_PREFIX
from editscope.lm.bundle import MemoryRead
from editscope.lm.decode import greedy_rows, stop_check
from editscope.lm.hooks import capture
from editscope.lm.kv_cache import cache_kwargs
from editscope.lm.loading import Bundle
from editscope.lm.scorer import ContinuationScore, Scorer, ScoreRequest
from editscope.lm.stops import BLANK_STARTS, FULL_STOPS, answer_start, first_stop

__all__ = ["ChatFormat", "ContinuationScore", "ScoreRequest", "Scorer", "ScoringEngine", "TokenBatch",
           "normalize_boundary"]

_SLOT = "EDITSCOPEPROMPTSLOT"  # stands for the prompt while the chat template is rendered once


@dataclass(frozen=True)
class ChatFormat:
    """A tokenizer's chat template cut around one user turn: a prompt is shown as ``head + prompt + tail`` (the
    user turn, then the generation prompt that opens the assistant's turn)."""

    head: str
    tail: str

    @classmethod
    def of(cls, tokenizer, model_name: str = "the model") -> ChatFormat:
        """Render the template once with a placeholder prompt; one-line error when the tokenizer has none."""
        if not getattr(tokenizer, "chat_template", None):
            raise EditscopeError(f"chat template: the tokenizer of {model_name} has no chat template "
                                 "(leave out --chat-template / chat_template: true)")
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": _SLOT}], tokenize=False,
                                                 add_generation_prompt=True)
        except Exception as exc:  # a template may refuse a lone user turn (jinja's raise_exception)
            raise EditscopeError(f"chat template: the template of {model_name} cannot show one user turn: "
                                 f"{exc}".replace("\n", " ")) from None
        if not isinstance(text, str) or text.count(_SLOT) != 1:
            raise EditscopeError(f"chat template: the template of {model_name} does not show a user message once")
        head, tail = text.split(_SLOT)
        return cls(head, tail)

    @property
    def digest(self) -> str:
        """Identity of the rendered turn (recorded with every number computed under it)."""
        import hashlib

        return hashlib.blake2b(f"{self.head}\x1f{self.tail}".encode(), digest_size=6).hexdigest()

    def protocol(self) -> dict[str, str]:
        return {"chat_template": self.digest, "note": CHAT_NOTE}


CHAT_NOTE = ("prompts wrapped in the tokenizer's chat template (user turn + generation prompt; answers start the "
             "assistant turn, no leading space)")
"""What a protocol note adds when prompts are wrapped in the chat template."""


@dataclass
class _Encoded:
    index: int
    ctx_ids: tuple[int, ...]
    cont_ids: tuple[int, ...]
    embeds: torch.Tensor | None


@dataclass
class TokenBatch:
    """Pre-tokenized (context, continuation) pairs, padded for one differentiable forward."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    target_mask: torch.Tensor  # [B, L] True where the token is a continuation token
    context_lengths: list[int]
    continuation_lengths: list[int]
    context_embeds: list[torch.Tensor | None]


class _TreeRow:
    """A shared prefix followed by the prefix tree of what its members add to it, scored as one sequence.

    A member is a (context, continuation) pair whose context opens with the row's prefix (usually the whole context;
    with :attr:`ScoringEngine.share_prefix`, a context edit's long common text). Node k stands for a prefix
    t_1..t_j (j >= 1) of a member's tail (its context after the row's prefix, then its continuation) that some
    token is read after or that a longer node extends: it holds t_j at position len(prefix) + j - 1 and attends to
    the prefix, its ancestors and itself, so its hidden state equals the one an ordinary forward of prefix +
    t_1..t_j gives at t_j. Text shared by several members (" New York", " New Jersey"; the same demonstrations
    before different prompts) is computed once; the last token of a continuation is never forwarded (nothing reads
    its logits).
    """

    def __init__(self, ctx_ids: tuple[int, ...], embeds: torch.Tensor | None) -> None:
        self.ctx_ids = ctx_ids  # the shared prefix
        self.embeds = embeds
        self._node_of: dict[tuple[int, ...], int] = {}
        self.node_tokens: list[int] = []
        self.node_parent: list[int] = []  # parent node, -1 for the prefix's last token
        self.node_depth: list[int] = []
        #: (member, read index per continuation token): 0 is the prefix's last token, 1 + k is node k
        self.members: list[tuple[_Encoded, list[int]]] = []

    def tail(self, enc: _Encoded) -> tuple[int, ...]:
        """What ``enc`` adds to the row's prefix: the rest of its context, then its continuation."""
        return enc.ctx_ids[len(self.ctx_ids):] + enc.cont_ids

    def add(self, enc: _Encoded) -> None:
        if enc.ctx_ids[:len(self.ctx_ids)] != self.ctx_ids:
            raise ValueError("a tree row's member must open with the row's prefix")
        tail = self.tail(enc)
        node_at, parent = [-1], -1  # node_at[j]: the node of tail[:j] (-1: the prefix's last token)
        for j in range(1, len(tail)):
            node = self._node_of.get(tail[:j])
            if node is None:
                node = self._node_of[tail[:j]] = len(self.node_tokens)
                self.node_tokens.append(tail[j - 1])
                self.node_parent.append(parent)
                self.node_depth.append(j)
            node_at.append(node)
            parent = node
        start = len(enc.ctx_ids) - len(self.ctx_ids)  # continuation token i is read after tail[:start + i]
        self.members.append((enc, [1 + node_at[start + i] for i in range(len(enc.cont_ids))]))

    @property
    def n_nodes(self) -> int:
        return len(self.node_tokens)

    def reads(self) -> list[int]:
        """The read indices some continuation token is read after (0: the prefix's last token, 1 + k: node k), in
        order. A node of a member's context (text after a shared prefix) is forwarded but not read: the LM head
        runs on these alone."""
        return sorted({r for _, reads in self.members for r in reads})

    @property
    def depth(self) -> int:
        return max(self.node_depth, default=0)

    def __len__(self) -> int:
        return len(self.ctx_ids) + self.n_nodes

    @property
    def tokens(self) -> list[int]:
        return list(self.ctx_ids) + self.node_tokens

    @property
    def positions(self) -> list[int]:
        c = len(self.ctx_ids)
        return list(range(c)) + [c + d - 1 for d in self.node_depth]

    def read_positions(self, reads: list[int]) -> list[int]:
        """Positions in the row of read indices ``reads`` (:meth:`reads`)."""
        c = len(self.ctx_ids)
        return [c - 1 + r for r in reads]

    def mask(self) -> np.ndarray:
        """[len, len] True where a query token may attend to a key token."""
        c = len(self.ctx_ids)
        allowed = np.zeros((len(self), len(self)), dtype=bool)
        allowed[:c, :c] = np.tril(np.ones((c, c), dtype=bool))
        for k, parent in enumerate(self.node_parent):
            allowed[c + k] = allowed[c - 1 if parent < 0 else c + parent]
            allowed[c + k, c + k] = True
        return allowed


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` open with in common."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def normalize_boundary(context: str, continuation: str, add_space: bool = True) -> tuple[str, str]:
    """Apply DESIGN.md rule 2 to one pair; see the module docstring."""
    stripped = context.rstrip()
    if len(stripped) < len(context):
        return stripped, context[len(stripped):] + continuation
    if add_space and continuation and not continuation[0].isspace():
        return context, " " + continuation
    return context, continuation


def cut_at_stop(text: str, stop: Sequence[str], *, blank_start: str = "stop", full_stop: str = "any") -> str:
    """``text`` before the first occurrence of any of ``stop`` from its :func:`~editscope.lm.stops.answer_start` on,
    whitespace stripped (the wild protocol's answer): ``blank_start`` ``skip`` reads ``"\\nParis\\n"`` as ``"Paris"``,
    not ``""``; ``lead_in`` keeps ``"The answer is:\\nParis"`` whole; ``full_stop``: which "." ends it
    (:func:`~editscope.lm.stops.first_stop`)."""
    start = answer_start(text, blank_start)
    end = first_stop(text[start:], stop, full_stop=full_stop)
    return (text[:start + end] if end is not None else text).strip()


class ScoringEngine(Scorer):
    """Batched scoring for one model bundle (implements :class:`Scorer`). ``token_budget`` bounds the tokens in
    one forward."""

    #: the fewest common opening tokens for which contexts share one row's prefix (below it the saving is small):
    #: 12 lets a context editor's fixed opening (EasyEdit's instruction, 17 tokens on SmolLM2) be forwarded once per
    #: row; CounterFact under retrieval k 1 scored 1.58x faster than at 32, k 4 as fast (benchmarks/bench_context.py)
    share_prefix_min = 12
    #: answers decoded after a shared prefix: at most this many token budgets of keys and values cached per call
    kv_budget_factor = 8

    def __init__(self, bundle: Bundle, *, token_budget: int = 2048, add_space: bool = True,
                 padding_side: str = "right", max_row_tokens: int = 512, chat_template: bool = False,
                 share_prefix: bool = True) -> None:
        if padding_side not in ("left", "right"):
            raise ValueError("padding_side must be 'left' or 'right'")
        self.bundle = bundle
        self.model = bundle.model
        self.tokenizer = bundle.tokenizer
        self.arch = bundle.arch
        self.token_budget = token_budget
        #: a context's prefix tree is split over several rows beyond this length (attention cost is quadratic)
        self.max_row_tokens = max(1, min(max_row_tokens, token_budget))
        #: prompts whose context edit's text opens the same way share its forward (:meth:`_prefixes`); the scores
        #: agree with separate forwards to float rounding
        self.share_prefix = share_prefix
        self.add_space = add_space
        self.padding_side = padding_side
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        self._base = self.model.get_submodule(self.arch.base)
        self._head = self.model.get_submodule(self.arch.lm_head)
        self._softcap = self.arch.final_logit_softcap(self.model.config)
        self._window = self.arch.sliding_window(self.model.config)
        self._max_context = bundle.max_context  # positions the model has: longer inputs are refused
        #: the token an empty context is scored from (BOS, else EOS), declared on the architecture map
        self.start_id = self.arch.start_token_id(self.tokenizer)
        #: the chat turn prompts are wrapped in (None: plain text, the default)
        self.chat: ChatFormat | None = ChatFormat.of(self.tokenizer, bundle.name) if chat_template else None

    @property
    def fingerprint(self) -> str:
        """The bundle's weights as they are now (:attr:`editscope.lm.bundle.Bundle.fingerprint`)."""
        return self.bundle.fingerprint

    @property
    def base_fingerprint(self) -> str:
        """The bundle's weights as loaded."""
        return self.bundle.base_fingerprint

    @property
    def prompt_format(self) -> dict[str, str] | None:
        """How prompts are shown to the model when not as plain text (recorded with the numbers), else None."""
        return self.chat.protocol() if self.chat is not None else None

    @contextmanager
    def plain(self) -> Iterator[None]:
        """Prompts as plain text inside the block (ROME/MEMIT sample their context prefixes as free text)."""
        chat, self.chat = self.chat, None
        try:
            yield
        finally:
            self.chat = chat

    @property
    def base_module(self) -> torch.nn.Module:
        """The model without its LM head (the architecture map's ``base``): what partial forwards run."""
        return self._base

    def base_forward(self, **kwargs):
        """The base model's forward with ``kwargs`` (transformers' keyword arguments): the final normed hidden
        states in ``.last_hidden_state``. For forward surgery (:mod:`editscope.lm.partial_forward`)."""
        return self._base(**kwargs)

    @property
    def n_layers(self) -> int:
        """Number of transformer blocks of the model."""
        return self.bundle.n_layers

    # -- tokenization -------------------------------------------------------------------------------
    def _tokens(self, text: str) -> list[int]:
        """Plain tokenization (BOS prepended when the tokenizer adds one)."""
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def _chat_tokens(self, text: str) -> list[int]:
        # the rendered template holds its own special tokens (BOS included, where it has one)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def in_context(self, prompt: str) -> str:
        """``prompt`` with what the bundle's context edits put before it (:meth:`Bundle.context_for`): the text
        every prompt is encoded from, so teacher-forced scores and generated answers both see the edit's context."""
        if not prompt or not self.bundle.contexts:
            return prompt
        return self.bundle.context_for(prompt) + prompt

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the model sees it (BOS prepended when the tokenizer adds one); with the chat
        template, ``text`` is the start of a user turn (the tail is added by :meth:`context_ids`). A context edit's
        prefix comes first (:meth:`in_context`)."""
        text = self.in_context(text)
        if self.chat is not None:
            return self._chat_tokens(self.chat.head + text)
        return self._tokens(text)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a document (not a prompt): never wrapped in the chat template."""
        return self._tokens(text)

    def context_ids(self, context: str) -> list[int]:
        """Token ids a context is scored from: :meth:`encode` (plus the chat turn's tail), or the start token
        alone for an empty context (or the tokenizer's own BOS when it adds one). A whitespace-only context is an
        error."""
        if context and not context.strip():
            raise EditscopeError(f"empty context (prompt): only whitespace {context!r}")
        return self._context_ids(self.in_context(context))

    def _context_ids(self, context: str) -> list[int]:
        if self.chat is not None and context:
            return self._chat_tokens(self.chat.head + context.rstrip() + self.chat.tail)
        ids = self._tokens(context)
        return ids if ids else [self.start_id]

    def _check_no_context(self, what: str) -> None:
        """Embeddings given for a prompt's own tokens cannot hold a context edit's prefix: refused in one line."""
        if self.bundle.contexts:
            methods = ", ".join(sorted({c.method for c in self.bundle.contexts}))
            raise EditscopeError(f"{what}: a context edit ({methods}) is in force, and embeddings given for a prompt "
                                 "cannot hold its context (this measure reads perturbed prompt embeddings; score it "
                                 "with a weight or memory editor)")

    def _tail_length(self, context: str) -> int:
        """Tokens the chat turn's tail adds after :meth:`encode` of ``context`` (0 without the template)."""
        if self.chat is None or not context:
            return 0
        return len(self.context_ids(context)) - len(self.encode(context.rstrip()))

    def _with_tail(self, context: str, embeds: torch.Tensor, n_ids: int) -> torch.Tensor:
        """``context_embeds`` given for :meth:`encode` of a prompt, completed with the chat tail's embeddings."""
        n_tail = self._tail_length(context)
        if not n_tail or embeds.shape[0] != n_ids - n_tail:
            return embeds
        tail = self.embed(self.context_ids(context)[-n_tail:]).to(embeds)
        return torch.cat([embeds, tail])

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of context and continuation, split at the boundary by DESIGN.md rule 2.

        An empty context scores the continuation from the start token (:attr:`start_id`) as the text that
        begins a document: no space is added (lm-evaluation-harness's rolling log-likelihood; KLoB-u sentences).
        """
        ctx_ids = self.context_ids(context)
        context = self.in_context(context)
        if not continuation or not continuation.strip():
            raise EditscopeError(f"empty continuation after context {context!r}")
        if self.chat is not None and context:  # the answer opens the assistant's turn: no space before it
            whole = self._chat_tokens(self.chat.head + context.rstrip() + self.chat.tail + continuation.lstrip())
            cont_ids = whole[len(ctx_ids):]
            if not cont_ids:
                raise EditscopeError(f"continuation {continuation!r} encodes to no tokens after {context!r}")
            return ctx_ids, cont_ids
        if context:
            context, continuation = normalize_boundary(context, continuation, self.add_space)
            ctx_ids = self._tokens(context)
        whole = self._tokens(context + continuation)
        if not context and not self._tokens(""):  # the tokenizer adds no BOS of its own: prepend the start token
            whole = ctx_ids + whole
        cont_ids = whole[len(ctx_ids):]
        if not cont_ids:
            raise EditscopeError(f"continuation {continuation!r} encodes to no tokens after {context!r}")
        return ctx_ids, cont_ids

    def _encode_all(self, requests: Sequence[ScoreRequest | tuple[str, str]]) -> list[_Encoded]:
        encoded = []
        for i, req in enumerate(requests):
            if not isinstance(req, ScoreRequest):
                req = ScoreRequest(*req)
            ctx_ids, cont_ids = self.encode_pair(req.context, req.continuation)
            embeds = req.context_embeds
            if embeds is not None:
                self._check_no_context("context_embeds")
                embeds = self._with_tail(req.context, embeds, len(ctx_ids))
                if embeds.shape[0] != len(ctx_ids):
                    raise EditscopeError(
                        f"context_embeds has {embeds.shape[0]} rows but the context has {len(ctx_ids)} tokens")
            limit = self._max_context
            if limit is not None and len(ctx_ids) + len(cont_ids) > limit:  # never score past the positions
                edit = " with the context edit's text before it" if self.bundle.contexts else ""
                raise EditscopeError(f"context + continuation is {len(ctx_ids) + len(cont_ids)} tokens, more than "
                                     f"{self.bundle.name}'s context of {limit} (context {req.context[:40]!r}...{edit})")
            encoded.append(_Encoded(i, tuple(ctx_ids), tuple(cont_ids), embeds))
        return encoded

    # -- low-level pieces ---------------------------------------------------------------------------
    def embed(self, text_or_ids: str | Sequence[int]) -> torch.Tensor:
        """Input embeddings [n_tokens, d] of a text (as the model's embedding layer computes them)."""
        ids = self.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
        with torch.no_grad():
            return self.model.get_input_embeddings()(torch.tensor([ids], device=self.bundle.device))[0]

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head (and Gemma's final soft-capping) on final-normed hidden states."""
        logits = self._head(hidden)
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    def _inputs(self, rows: list[tuple[Sequence[int], torch.Tensor | None]], side: str):
        """Pad rows of ids (optionally with replacement embeddings) to one batch."""
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # host: filled row by row, then moved
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # host
        for r, (row, _) in enumerate(rows):
            span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
            ids[r, span] = torch.tensor(row, dtype=torch.long)
            mask[r, span] = 1
        ids, mask = ids.to(self.bundle.device), mask.to(self.bundle.device)  # built on CPU, run where the model is
        embeds = None
        if any(e is not None for _, e in rows):
            embeds = self.model.get_input_embeddings()(ids)
            for r, (row, e) in enumerate(rows):
                if e is not None:
                    span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
                    embeds[r, span] = e.to(embeds)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids, mask, positions, embeds

    # -- scoring ------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, requests: Sequence[ScoreRequest | tuple[str, str]], *,
              progress: Callable[[int], None] | None = None) -> list[ContinuationScore]:
        """Log-probs of each continuation given its context, in request order; ``progress(done)`` after each
        batched forward (the batches do not depend on it), with the number of requests scored so far."""
        encoded = self._encode_all(requests)
        # Identical (context, continuation) pairs are computed once; groups share one context forward.
        unique: dict[tuple, _Encoded] = {}
        duplicates: dict[int, list[int]] = {}
        for enc in encoded:
            key = (enc.ctx_ids, enc.cont_ids, id(enc.embeds) if enc.embeds is not None else None)
            first = unique.setdefault(key, enc)
            duplicates.setdefault(first.index, []).append(enc.index)
        groups: dict[tuple, list[_Encoded]] = {}
        for enc in unique.values():
            key = (enc.ctx_ids, id(enc.embeds) if enc.embeds is not None else None)
            groups.setdefault(key, []).append(enc)
        results: list[ContinuationScore | None] = [None] * len(encoded)
        done = 0
        for batch in self._pack(self._rows(list(groups.values()))):
            for enc, lps, is_max, arg in self._score_batch(batch):
                done += len(duplicates[enc.index])
                for index in duplicates[enc.index]:
                    req = requests[index]
                    ctx, cont = (req.context, req.continuation) if isinstance(req, ScoreRequest) else req
                    results[index] = ContinuationScore(ctx, cont, list(enc.cont_ids), lps.copy(), is_max.copy(),
                                                       arg.copy())
            if progress is not None:
                progress(done)
        return results  # type: ignore[return-value]

    def _rows(self, groups: list[list[_Encoded]]) -> list[_TreeRow]:
        """One tree row per shared prefix (:meth:`_prefixes`), split when the row's tree would exceed
        ``max_row_tokens`` (a prefix shared by several contexts is not counted: it is computed once either way)."""
        rows = []
        for prefix, members in self._prefixes(groups):
            embeds = members[0].embeds
            row = _TreeRow(prefix, embeds)
            shared = any(len(enc.ctx_ids) > len(prefix) for enc in members)
            cap = self.max_row_tokens + (len(prefix) if shared else 0)
            # Sorted tails keep shared prefixes in one row when a group is split.
            for enc in sorted(members, key=row.tail):
                if len(row.members) and len(prefix) + row.n_nodes + len(row.tail(enc)) - 1 > cap:
                    rows.append(row)
                    row = _TreeRow(prefix, embeds)
                row.add(enc)
            rows.append(row)
        return rows

    def _prefixes(self, groups: list[list[_Encoded]]) -> list[tuple[tuple[int, ...], list[_Encoded]]]:
        """(prefix, members) per row tree: each context group alone, or, while a context edit is in force and
        :attr:`share_prefix` is on, the groups whose contexts open with the same :attr:`share_prefix_min` tokens or
        more (IKE's demonstrations before every prompt of a case) merged under their common prefix. Not with a
        module memory in force: it reads each prompt's last token, which a merged row would not end on."""
        if not (self.share_prefix and self.bundle.contexts) or self.bundle.has_memory:
            return [(group[0].ctx_ids, group) for group in groups]
        merged: list[tuple[tuple[int, ...], list[_Encoded]]] = []
        for group in sorted(groups, key=lambda g: g[0].ctx_ids):  # long common openings become neighbours
            ctx = group[0].ctx_ids
            if merged:
                prefix, members = merged[-1]
                n = _common_length(prefix, ctx)
                if n >= self.share_prefix_min:
                    merged[-1] = (prefix[:n], members + group)
                    continue
            merged.append((ctx, list(group)))
        return merged

    def _pack(self, rows: list[_TreeRow]) -> Iterator[list[_TreeRow]]:
        """Batches of rows of similar length whose padded token count stays within the budget."""
        batch: list[_TreeRow] = []
        width = 0
        for row in sorted(rows, key=len):
            if batch and (len(batch) + 1) * max(width, len(row)) > self.token_budget:
                yield batch
                batch, width = [], 0
            batch.append(row)
            width = max(width, len(row))
        if batch:
            yield batch

    def _score_batch(self, batch: list[_TreeRow]):
        """One forward of tree rows; the LM head runs on the read positions only."""
        side = self.padding_side
        width = max(len(row) for row in batch)
        if self._window and max(len(row.ctx_ids) + row.depth for row in batch) > self._window:
            raise EditscopeError(
                f"context + continuation longer than the model's sliding window ({self._window} tokens)")
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)  # host: filled row by row, then moved
        positions = torch.zeros((len(batch), width), dtype=torch.long)  # host
        allowed = np.zeros((len(batch), width, width), dtype=bool)
        offsets = []
        for b, row in enumerate(batch):
            off = width - len(row) if side == "left" else 0
            offsets.append(off)
            span = slice(off, off + len(row))
            ids[b, span] = torch.tensor(row.tokens)
            positions[b, span] = torch.tensor(row.positions)
            allowed[b, span, span] = row.mask()
            pad = [i for i in range(width) if not off <= i < off + len(row)]
            allowed[b, pad, pad] = True  # padding attends to itself only: no empty softmax rows
        device = self.bundle.device
        ids, positions = ids.to(device), positions.to(device)
        embeds = None
        if any(row.embeds is not None for row in batch):
            embeds = self.model.get_input_embeddings()(ids)
            for b, row in enumerate(batch):
                if row.embeds is not None:
                    embeds[b, offsets[b]:offsets[b] + len(row.ctx_ids)] = row.embeds.to(embeds)
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(
            torch.from_numpy(~allowed).to(device), torch.finfo(dtype).min)
        queries = [offsets[b] + len(row.ctx_ids) - 1 for b, row in enumerate(batch)]  # each prompt's last token
        with self.bundle.memory_read(self._reading(queries, offsets)):
            hidden = self._base(
                input_ids=None if embeds is not None else ids,
                inputs_embeds=embeds,
                attention_mask=mask[:, None],
                position_ids=positions,
                use_cache=False,
            ).last_hidden_state

        # Read positions: those a continuation token is read after, each once.
        read_b, read_t, slots = [], [], []
        for b, row in enumerate(batch):
            reads = row.reads()
            slots.append({r: len(read_t) + i for i, r in enumerate(reads)})
            read_b += [b] * len(reads)
            read_t += [offsets[b] + t for t in row.read_positions(reads)]
        logits = self.logits_from_hidden(hidden[torch.tensor(read_b, device=device),
                                                torch.tensor(read_t, device=device)]).float()
        log_z = logits.logsumexp(-1)
        argmax = logits.argmax(-1)
        flat_index, flat_targets, members = [], [], []
        for b, row in enumerate(batch):
            for enc, reads in row.members:
                flat_index += [slots[b][r] for r in reads]
                flat_targets += enc.cont_ids
                members.append(enc)
        flat_index_t = torch.tensor(flat_index, device=device)
        flat_targets_t = torch.tensor(flat_targets, device=device)
        token_lp = (logits[flat_index_t, flat_targets_t] - log_z[flat_index_t]).double().cpu().numpy()
        token_max = (argmax[flat_index_t] == flat_targets_t).cpu().numpy()
        token_arg = argmax[flat_index_t].cpu().numpy()  # the argmax ids themselves (EasyEdit's locality compares them)
        start = 0
        for enc in members:
            n = len(enc.cont_ids)
            yield enc, token_lp[start:start + n], token_max[start:start + n], token_arg[start:start + n]
            start += n

    # -- differentiable path for editor objectives --------------------------------------------------
    def prepare(self, requests: Sequence[ScoreRequest | tuple[str, str]]) -> TokenBatch:
        """Tokenize pairs once into a right-padded batch for :meth:`batch_logprobs`."""
        encoded = self._encode_all(requests)
        rows = [(enc.ctx_ids + enc.cont_ids, None) for enc in encoded]
        ids, mask, _, _ = self._inputs(rows, "right")
        target = torch.zeros_like(mask, dtype=torch.bool)
        for r, enc in enumerate(encoded):
            target[r, len(enc.ctx_ids):len(enc.ctx_ids) + len(enc.cont_ids)] = True
        return TokenBatch(ids, mask, target, [len(e.ctx_ids) for e in encoded],
                          [len(e.cont_ids) for e in encoded], [e.embeds for e in encoded])

    def batch_logits(self, batch: TokenBatch) -> torch.Tensor:
        """Full logits [B, L, V] of a prepared batch (grad flows; hooks installed by the caller apply)."""
        return self.logits_from_hidden(self.batch_hidden(batch))

    def batch_logprobs(self, batch: TokenBatch, logits: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token log-probs [B, L] of the continuation tokens (0 elsewhere), differentiable."""
        logits = self.batch_logits(batch) if logits is None else logits
        lp = logits[:, :-1].log_softmax(-1)
        targets = batch.input_ids[:, 1:]
        token_lp = lp.gather(-1, targets[..., None])[..., 0]
        token_lp = torch.cat([torch.zeros_like(token_lp[:, :1]), token_lp], dim=1)
        return token_lp * batch.target_mask

    # -- distributions and states -------------------------------------------------------------------
    def _context_forward(self, contexts: Sequence[str], context_embeds: Sequence[torch.Tensor | None] | None):
        if not contexts:
            raise EditscopeError("no contexts given")
        rows = []
        for i, text in enumerate(contexts):
            ids = self.context_ids(text)
            emb = context_embeds[i] if context_embeds is not None else None
            if emb is not None:
                self._check_no_context("context_embeds")
                emb = self._with_tail(text, emb, len(ids))
            if emb is not None and emb.shape[0] != len(ids):
                raise EditscopeError(f"context_embeds[{i}] has {emb.shape[0]} rows, context has {len(ids)} tokens")
            rows.append((ids, emb))
        return rows

    @torch.no_grad()
    def next_token_logprobs(self, contexts: Sequence[str], *, top_k: int | None = None,
                            context_embeds: Sequence[torch.Tensor | None] | None = None):
        """Log-probs of the next token after each context: [B, V], or (values, indices) [B, k] with top_k."""
        rows = self._context_forward(contexts, context_embeds)
        outs = []
        for start in range(0, len(rows), max(1, self.token_budget // max(len(r[0]) for r in rows))):
            chunk = rows[start:start + max(1, self.token_budget // max(len(r[0]) for r in rows))]
            ids, mask, pos, embeds = self._inputs(chunk, "right")
            last = mask.sum(-1) - 1
            with self.bundle.memory_read(self._reading(last)):
                hidden = self._base(input_ids=None if embeds is not None else ids, inputs_embeds=embeds,
                                    attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
            rows_t = torch.arange(len(chunk), device=last.device)
            outs.append(self.logits_from_hidden(hidden[rows_t, last]).log_softmax(-1))
        lp = torch.cat(outs)
        if top_k is not None:
            return lp.topk(top_k, dim=-1)
        return lp

    @torch.no_grad()
    def hidden_states(self, contexts: Sequence[str], layers: Sequence[int], *, kind: str = "resid_post",
                      positions: Sequence[int] | None = None,
                      context_embeds: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """States [B, n_layers, dim] at one token position per context (default: the last token).

        ``kind`` names a per-block hook point of :mod:`editscope.lm.hooks` (``resid_post``: residual stream after
        the block; ``mlp_key``: input of the MLP's down projection; ``attn_heads`` gives [B, n_layers, heads,
        head_dim]); ``kind="final"`` is the final norm's output (HF's ``hidden_states[-1]``), only for the last
        layer; ``positions`` are token indices (negative counts from the end).
        """
        if kind != "final" and f"{BLOCK_POINT_PREFIX}{kind}" not in self.arch.hook_points:
            kinds = [t.removeprefix(BLOCK_POINT_PREFIX) for t in self.arch.hook_points
                     if t.startswith(BLOCK_POINT_PREFIX)]
            raise EditscopeError(f"kind must be one of {', '.join(kinds)}, final, not {kind!r}")
        n_layers = self.bundle.n_layers
        for layer in layers:
            if not 0 <= layer < n_layers or (kind == "final" and layer != n_layers - 1):
                raise EditscopeError(f"layer {layer} out of range 0..{n_layers - 1}" if kind != "final" else
                                     f"kind='final' is after the last block: layer must be {n_layers - 1}, not {layer}")
        rows = self._context_forward(contexts, context_embeds)
        ids, mask, pos, embeds = self._inputs(rows, "right")
        lengths = mask.sum(-1)
        if positions is None:
            index = lengths - 1
        else:
            index = torch.tensor([p if p >= 0 else int(n) + p for p, n in zip(positions, lengths, strict=True)],
                                 device=lengths.device)
            if (index < 0).any() or (index >= lengths).any():
                raise EditscopeError(f"token positions {list(positions)} outside the contexts")
        names = ["final" if kind == "final" else f"blocks.{layer}.{kind}" for layer in layers]
        # the forward stops once the highest requested layer has fired (keys k* need no later block)
        with capture(self.model, self.arch, names, stop_after=True) as store, \
                self.bundle.memory_read(self._reading(lengths - 1)):
            self._base(input_ids=None if embeds is not None else ids, inputs_embeds=embeds,
                       attention_mask=mask, position_ids=pos, use_cache=False)
        arange = torch.arange(len(rows), device=index.device)
        return torch.stack([store[name][arange, index] for name in names], dim=1)

    # -- generation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Sequence[str], *, max_new_tokens: int = 20, top_k: int | None = None,
                 seed: int | None = None) -> list[str]:
        """Continuations of each prompt: greedy, or top-k sampled with a seed (reproducible: drawn from a generator of
        the call's own, :class:`~editscope.lm.sampling.HostTopK`; torch's global stream is not touched)."""
        rows = self._context_forward(prompts, None)
        ids, mask, _, _ = self._inputs(rows, "left")
        # do_sample stays off: top-k draws are made by HostTopK, the same on every device
        kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=self.pad_id, attention_mask=mask, do_sample=False)
        if top_k is not None:
            from transformers import LogitsProcessorList

            from editscope.lm.sampling import HostTopK

            draws = torch.Generator().manual_seed(0 if seed is None else seed)  # host
            kwargs.update(logits_processor=LogitsProcessorList([HostTopK(top_k, draws)]))
        with self._contiguous_head():
            out = self.model.generate(ids, **kwargs)
        return [self.tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True) for row in out]

    @contextmanager
    def _contiguous_head(self) -> Iterator[None]:
        """transformers hands the LM head the prompt's last position as a strided view ([B, 1, d] of [B, T, d]); on a
        CPU a bfloat16/float16 matmul with such an input converts the whole head to float32 first (a transient of
        ~10 B a head parameter: 2.2 GB on Qwen2.5-Coder-1.5B, and ~46x slower on SmolLM2's head). A contiguous copy
        of the input takes the ordinary kernel. float32 is left as it is (its kernels handle the view)."""
        if self.model.dtype == torch.float32:
            yield
            return
        handle = self._head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))
        try:
            yield
        finally:
            handle.remove()

    @torch.no_grad()
    def answer(self, prompts: Sequence[str], *, max_new_tokens: int = 50,
               stop: Sequence[str] = (".", "\n"), blank_start: str = "stop", full_stop: str = "any") -> list[str]:
        """Greedy answers as evaluation in the wild reads them (Yang et al., ACL 2025, "The Mirage of Model
        Editing"): no gold prefix, each row decoded until EOS, ``max_new_tokens`` or the first stop string in its
        new text (each row leaves the batch when it ends: :mod:`editscope.lm.decode`), the text before that stop string
        kept whole, surrounding whitespace stripped. ``blank_start``: where the stop strings start counting
        (:func:`~editscope.lm.stops.answer_start`: ``stop``, the reference's, stops at a newline the model writes
        before its answer, empty; ``skip`` after leading whitespace; ``lead_in`` also after "The answer is:\\n").
        ``full_stop``: ``any`` ends at every "." (the reference's), ``sentence`` only at one that ends a sentence
        (:func:`~editscope.lm.stops.sentence_end`: not "Robert C. Newton" at "C."). Rows go left-padded with a KV
        cache, as many at a time as the token budget holds with room for the new tokens. A context edit's text that
        every prompt opens with (IKE's demonstrations) is forwarded once and its cache copied to each row
        (:meth:`_shared_opening`)."""
        if max_new_tokens < 1:
            raise EditscopeError(f"answer: max_new_tokens must be >= 1, got {max_new_tokens}")
        if any(not s for s in stop):
            raise EditscopeError("answer: an empty stop string would end every answer before it starts")
        if blank_start not in BLANK_STARTS:
            raise EditscopeError(f"answer: blank_start must be one of {', '.join(BLANK_STARTS)}, not {blank_start!r}")
        if full_stop not in FULL_STOPS:
            raise EditscopeError(f"answer: full_stop must be one of {', '.join(FULL_STOPS)}, not {full_stop!r}")
        rows = self._context_forward(prompts, None)
        prefix = self._shared_opening([ids for ids, _ in rows])
        longest = max(len(r[0]) for r in rows) + max_new_tokens
        per_call = max(1, self.token_budget // (longest - len(prefix)))
        if prefix:  # each row holds its own copy of the prefix's keys and values: bound the cache too
            per_call = min(per_call, max(1, self.kv_budget_factor * self.token_budget // longest))
        ended = stop_check(lambda new: self.tokenizer.decode(new, skip_special_tokens=True), stop,
                           blank_start=blank_start, full_stop=full_stop)
        answers = []
        for start in range(0, len(rows), per_call):
            chunk = rows[start:start + per_call]
            ids, mask, _, _ = self._inputs([(row[len(prefix):], e) for row, e in chunk], "left")
            # left padding: every prompt ends at the last column; decoding steps continue each row's memory choice
            read = self._reading([ids.shape[1] - 1] * ids.shape[0], (mask == 0).sum(-1))
            cache = self._prefilled(prefix, len(chunk)) if prefix else None
            if prefix:
                mask = torch.cat([mask.new_ones((len(chunk), len(prefix))), mask], dim=1)
            with self.bundle.memory_read(read):
                for new in greedy_rows(self._continuing(read), ids, mask, max_new_tokens=max_new_tokens,
                                       ended=ended, eos_ids=self._eos_ids, cache=cache,
                                       on_select=read.select if read is not None else None):
                    answers.append(cut_at_stop(self.tokenizer.decode(new, skip_special_tokens=True), stop,
                                               blank_start=blank_start, full_stop=full_stop))
        return answers

    def _shared_opening(self, rows: Sequence[Sequence[int]]) -> tuple[int, ...]:
        """The tokens every row opens with, when a context edit is in force and they are :attr:`share_prefix_min`
        or more (each row keeps at least its last token: decoding starts there); else () (see :meth:`_prefixes`)."""
        if not (self.share_prefix and self.bundle.contexts) or self.bundle.has_memory or len(rows) < 2:
            return ()
        n = min(min(len(row) for row in rows) - 1, *(_common_length(rows[0], row) for row in rows[1:]))
        return tuple(rows[0][:n]) if n >= self.share_prefix_min else ()

    def _prefilled(self, prefix: Sequence[int], copies: int):
        """A key/value cache holding ``prefix`` once per row, from one forward of it."""
        cache = DynamicCache()
        ids = torch.tensor([list(prefix)], device=self.bundle.device)
        self._base(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(len(prefix),
                   device=ids.device)[None], **cache_kwargs(self._base, cache))
        cache.batch_repeat_interleave(copies)
        return cache

    def _reading(self, queries: Sequence[int] | torch.Tensor, starts: Sequence[int] | torch.Tensor | None = None
                 ) -> MemoryRead | None:
        """Where module memories read each row's query, and where its real tokens start (None: at 0); None when no
        memory is in force: nothing to say."""
        if not self.bundle.has_memory:
            return None
        device = self.bundle.device
        return MemoryRead(torch.as_tensor(queries, dtype=torch.long, device=device),
                          None if starts is None else torch.as_tensor(starts, dtype=torch.long, device=device))

    def _continuing(self, read: MemoryRead | None):
        """The decoding step: the first call reads the prompts' queries, later ones continue each row's choice."""
        if read is None:
            return self._last_logits

        def step(ids, mask, positions, cache):
            logits = self._last_logits(ids, mask, positions, cache)
            read.positions = None
            return logits
        return step

    def _last_logits(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """One decoding step (:data:`editscope.lm.decode.Step`): logits of each row's last position only."""
        hidden = self._base(input_ids=ids, attention_mask=mask, position_ids=positions,
                            **cache_kwargs(self._base, cache)).last_hidden_state
        return self.logits_from_hidden(hidden[:, -1])

    @cached_property
    def _eos_ids(self) -> frozenset[int]:
        """The token ids that end generation (the generation config's, else the tokenizer's EOS)."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return frozenset(eos if isinstance(eos, list | tuple) else [] if eos is None else [eos])

    def batch_hidden(self, batch: TokenBatch, *, cache=None) -> torch.Tensor:
        """Final (normed) hidden states [B, L, d] of a prepared batch, differentiable; pair with
        :meth:`logits_from_hidden` at the few positions an objective reads (saves the full-vocab head).
        ``cache`` (a transformers ``Cache``) is filled with every layer's keys/values when given."""
        embeds = None
        if any(e is not None for e in batch.context_embeds):
            embeds = self.model.get_input_embeddings()(batch.input_ids).clone()
            for r, e in enumerate(batch.context_embeds):
                if e is not None:
                    embeds[r, : e.shape[0]] = e
        positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        return self._base(
            input_ids=None if embeds is not None else batch.input_ids,
            inputs_embeds=embeds,
            attention_mask=batch.attention_mask,
            position_ids=positions,
            **cache_kwargs(self._base, cache),
        ).last_hidden_state
