"""The loaded-model bundle and the helpers every loader shares (fingerprints, finishing a model, wheels).

Kept apart from :mod:`editscope.lm.loading` (name resolution) and :mod:`editscope.lm.tiny` (random-init
models) so the import graph of ``editscope.lm`` is acyclic: ``bundle`` ← ``tiny`` ← ``loading``.

A :class:`Bundle` owns the record of which patches are applied to its weights, in order. Its
:attr:`~Bundle.fingerprint` names the weights as they are *now* (the loaded weights' fingerprint when nothing
is applied, otherwise a digest of that fingerprint and the applied patches' content digests, in order), so
caches keyed by it (layer statistics) never confuse edited and unedited weights.

Inside :meth:`Bundle.folding` a chain of patches (a sequential run) holds one pre-edit copy per edited parameter
instead of each patch's ΔW and revert entries (1,000 sequential edits must not hold 1,000 matrix-sized
tensors), and the folded patches are one entry of :attr:`Bundle.applied` (a running fingerprint hash), not one
object per patch; see :meth:`Bundle.fold`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from editscope.errors import EditscopeError
from editscope.lm.archs import ArchMap, arch_for_config


class AppliedPatch(Protocol):
    """What a bundle needs to know of a patch (:class:`editscope.edit.patch.Patch` satisfies it)."""

    method: str

    @property
    def digest(self) -> str: ...

    @property
    def names(self) -> list[str]: ...

    def apply(self, target: Bundle, *, check: bool = True) -> None: ...

    def revert(self, target: Bundle) -> None: ...

    def original(self, name: str, current: torch.Tensor) -> torch.Tensor: ...

    def release(self) -> None: ...


class PromptContext(Protocol):
    """Text a context edit puts before a prompt (:class:`editscope.edit.context_edit.ContextEdit` satisfies it)."""

    method: str

    def prefix(self, prompt: str) -> str: ...


@dataclass
class MemoryRead:
    """Where a module memory reads its query in the forward about to run (set by the scoring engine).

    ``positions`` [B]: each row's query token (its prompt's last token); the memory governs that position and every
    later one (the answer's); None: a decoding step continuing the rows of the last forward that had positions; a
    memory then applies to the new positions whatever it chose for that row there (``chosen``, which the memory
    fills; :meth:`select` keeps the rows still decoding). ``starts`` [B]: each row's first real token (None:
    position 0; left-padded rows start later), for a memory that reads the whole prompt (WISE's router)."""

    positions: torch.Tensor | None
    starts: torch.Tensor | None = None
    chosen: dict[int, torch.Tensor] = field(default_factory=dict)  # id(memory) -> [B] entry index, -1: none

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows at ``index`` (a decoder dropped the rows that ended)."""
        self.chosen = {k: v[index.to(v.device)] for k, v in self.chosen.items()}


@dataclass
class Bundle:
    """A loaded model with everything editscope needs to know about it.

    ``base_fingerprint`` identifies the weights as loaded; :attr:`fingerprint` the weights as they are now.
    Patches applied through :meth:`Patch.apply(bundle) <editscope.edit.patch.Patch.apply>` are recorded here;
    weights changed by other means are not (see :mod:`editscope.stats.second_moment` for the check that
    catches them there).
    """

    name: str
    model: nn.Module
    tokenizer: object
    arch: ArchMap
    base_fingerprint: str
    source: str = ""
    extra: dict = field(default_factory=dict)
    _applied: list[AppliedPatch] = field(default_factory=list, repr=False)
    _originals: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # inside folding(): see fold()
    _folded: int = field(default=0, repr=False)  # 1 when _applied[0] is the _FoldedChain of folded patches
    _contexts: list[PromptContext] = field(default_factory=list, repr=False)  # see context_for()
    _contexts_off: int = field(default=0, repr=False)
    _memories: int = field(default=0, repr=False)  # module memories in force (see memory_read())
    _read: MemoryRead | None = field(default=None, repr=False)

    @property
    def config(self):
        return self.model.config

    @property
    def n_layers(self) -> int:
        return self.arch.n_layers(self.model.config)

    @property
    def max_context(self) -> int | None:
        """The most tokens one sequence may hold (positions the model was built for; ``n_positions`` on GPT-2
        style configs, ``max_position_embeddings`` on rotary ones), None when the config does not say."""
        config = self.model.config
        for key in ("n_positions", "max_position_embeddings"):
            value = config.to_dict().get(key)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def hidden_size(self) -> int:
        return self.arch.hidden_size(self.model.config)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- context edits: text the model sees before every prompt --------------------------------------------
    @property
    def contexts(self) -> tuple[PromptContext, ...]:
        """The context edits in force, oldest first (empty inside :meth:`without_context`)."""
        return () if self._contexts_off else tuple(self._contexts)

    def context_for(self, prompt: str) -> str:
        """What the model sees before ``prompt``: every context edit's prefix, oldest first ("" without any). The
        scoring engine asks this for every prompt it encodes, so each suite scores and generates under it."""
        return "".join(c.prefix(prompt) for c in self.contexts)

    def add_context(self, context: PromptContext) -> None:
        if any(c is context for c in self._contexts):
            raise EditscopeError(f"context edit ({context.method}) is already in force on {self.name}")
        self._contexts.append(context)

    def remove_context(self, context: PromptContext) -> None:
        index = next((i for i, c in enumerate(self._contexts) if c is context), None)
        if index is None:
            raise EditscopeError(f"context edit ({context.method}) is not in force on {self.name}")
        del self._contexts[index]

    @contextmanager
    def without_context(self) -> Iterator[Bundle]:
        """Prompts as they are, without the context edits, inside the block (a retriever embeds the raw query)."""
        self._contexts_off += 1
        try:
            yield self
        finally:
            self._contexts_off -= 1

    # -- module memories: where their queries are read ------------------------------------------------------
    @property
    def has_memory(self) -> bool:
        """Whether a module memory is in force (the engine then says where each row's query is read)."""
        return self._memories > 0

    def count_memory(self, step: int) -> None:
        """A module memory was installed (+1) or removed (-1)."""
        self._memories += step

    @property
    def read(self) -> MemoryRead | None:
        """The query positions of the forward running now (None: not set; a memory then reads the last token)."""
        return self._read

    @contextmanager
    def memory_read(self, read: MemoryRead | None) -> Iterator[MemoryRead | None]:
        """Forwards inside the block read module memories as ``read`` says (nothing changes without a memory)."""
        if read is None or not self._memories:
            yield read
            return
        outer, self._read = self._read, read
        try:
            yield read
        finally:
            self._read = outer

    # -- applied patches ------------------------------------------------------------------------------
    @property
    def applied(self) -> tuple[AppliedPatch, ...]:
        """The patches applied to the weights now, oldest first."""
        return tuple(self._applied)

    @property
    def fingerprint(self) -> str:
        """Fingerprint of the weights as they are now: :attr:`base_fingerprint` when no patch is applied, else
        blake2b(base fingerprint, each applied patch's content digest in order)."""
        if not self._applied:
            return self.base_fingerprint
        if self._folded:  # the folded prefix's running hash, continued with the loose patches
            h = self._applied[0].running_hash()  # type: ignore[attr-defined]
            for p in self._applied[1:]:
                h.update(b"+" + p.digest.encode())
            return h.hexdigest()
        return patched_fingerprint(self.base_fingerprint, [p.digest for p in self._applied])

    def record_apply(self, patch: AppliedPatch) -> None:
        """Called by a patch after it changed the weights."""
        if any(p is patch for p in self._applied):
            raise EditscopeError(f"patch ({patch.method}) is already recorded as applied to {self.name}")
        self._applied.append(patch)

    def record_revert(self, patch: AppliedPatch) -> None:
        """Called by a patch *before* it restores the weights. A patch that is not the last applied may be
        reverted only when no later patch edits one of its parameters (its revert writes pre-apply values back)."""
        index = next((i for i, p in enumerate(self._applied) if p is patch), None)
        if index is None:
            raise EditscopeError(f"patch ({patch.method}) is not recorded as applied to {self.name}")
        mine = set(patch.names)
        for later in self._applied[index + 1:]:
            if mine & set(later.names):
                raise EditscopeError(f"cannot revert patch ({patch.method}) before the later patch "
                                     f"({later.method}) that edits the same parameters; revert in reverse order")
        del self._applied[index]

    @contextmanager
    def unpatched(self) -> Iterator[Bundle]:
        """The loaded weights for the duration of the block: every applied patch is reverted (newest first) and
        re-applied in order on exit, also on error; the values are bit-identical afterwards. Folded patches are
        swapped out as a whole: their parameters get the kept originals and their edited values back after."""
        patches = list(self._applied)
        loose = patches[self._folded:]
        for patch in reversed(loose):
            patch.revert(self)
        swapped = self._swap_in_originals() if self._folded else None
        try:
            yield self
        finally:
            if swapped is not None:
                self._swap_back(swapped, patches[:len(patches) - len(loose)])
            for patch in loose:
                patch.apply(self, check=False)

    # -- folding: one original per parameter for a chain of patches -----------------------------------------
    @contextmanager
    def folding(self) -> Iterator[Bundle]:
        """A block in which :meth:`fold` may hand applied patches to the bundle; on exit (also on error) every
        folded patch is undone at once by writing the kept originals back (bit-exact), after the caller has
        reverted its own unfolded patches. Starts from the loaded weights (no patch applied)."""
        if self._applied or self._originals is not None:
            raise EditscopeError(f"{self.name}: folding starts from the loaded weights with no patch applied")
        self._originals = {}
        try:
            yield self
        finally:
            self._unfold()

    def fold(self, patch: AppliedPatch, digests: Sequence[str] | None = None) -> None:
        """Take over the newest applied patch: keep the pre-edit values of the parameters no earlier folded patch
        edited (reconstructed bit-exactly from the patch), then let the patch drop its ΔW and revert entries and
        forget it: the folded patches are one entry of :attr:`applied` (their running fingerprint hash and the
        names they edited), however many there are. ``digests`` (a resumed chain whose one patch stands for
        several) are fed to the fingerprint instead of the patch's own digest, so the weights keep their name."""
        if self._originals is None:
            raise EditscopeError("fold() is only valid inside Bundle.folding()")
        if not self._applied or self._applied[-1] is not patch or self._folded != len(self._applied) - 1:
            raise EditscopeError(f"patch ({patch.method}) is not the newest applied patch after the folded ones")
        params = dict(self.model.named_parameters())
        for name in patch.names:
            if name not in self._originals:
                self._originals[name] = patch.original(name, params[name].detach())
        patch.release()  # memoises its digest first
        chain = self._applied[0] if self._folded else _FoldedChain(self.base_fingerprint)
        chain.add(patch, digests)
        self._applied[:] = [chain]
        self._folded = 1

    def folded_originals(self) -> dict[str, torch.Tensor]:
        """The pre-edit value of every parameter a folded patch edited (the loaded weights; read-only: a
        checkpoint of a chain saves the current value minus these as the chain's folded ΔW)."""
        if self._originals is None:
            raise EditscopeError("folded_originals() is only valid inside Bundle.folding()")
        return dict(self._originals)

    def _unfold(self) -> None:
        originals, self._originals = self._originals or {}, None
        try:
            for patch in reversed(self._applied[self._folded:]):  # unfolded patches still applied (an error path)
                patch.revert(self)
        finally:  # the originals go back even if such a revert fails: they are the loaded weights
            self._write(originals)
            self._applied.clear()
            self._folded = 0

    def _write(self, values: dict[str, torch.Tensor]) -> None:
        """Copy ``values`` into the parameters of those names."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in values.items():
                params[name].copy_(value)

    def _swap_in_originals(self) -> dict[str, torch.Tensor]:
        params = dict(self.model.named_parameters())
        edited = {name: params[name].detach().clone() for name in self._originals}
        self._write(self._originals)
        self._applied, self._folded = [], 0
        return edited

    def _swap_back(self, edited: dict[str, torch.Tensor], folded: list[AppliedPatch]) -> None:
        self._write(edited)
        self._applied, self._folded = list(folded), len(folded)


class _FoldedChain:
    """Every patch folded into a bundle, as one entry of :attr:`Bundle.applied`: the running hash of the
    fingerprint (base fingerprint, then each folded digest in order, as :func:`patched_fingerprint`), how many
    patches it holds and the names they edited. Not revertible on its own (the bundle restores the originals)."""

    method = "folded chain"

    def __init__(self, base: str) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self._hash.update(base.encode())
        self.count = 0
        self._names: set[str] = set()

    def add(self, patch: AppliedPatch, digests: Sequence[str] | None = None) -> None:
        for digest in (patch.digest,) if digests is None else digests:
            self._hash.update(b"+" + digest.encode())
            self.count += 1
        self._names.update(patch.names)

    def running_hash(self):  # a copy: the caller continues it
        return self._hash.copy()

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    @property
    def names(self) -> list[str]:
        return sorted(self._names)

    def apply(self, target: Bundle, *, check: bool = True) -> None:
        raise EditscopeError("a folded chain cannot be re-applied on its own")

    def revert(self, target: Bundle) -> None:
        raise EditscopeError("cannot revert a folded patch on its own (Bundle.fold): the end of Bundle.folding() "
                             "restores the weights")

    def original(self, name: str, current: torch.Tensor) -> torch.Tensor:
        raise EditscopeError("a folded chain keeps no revert entries")

    def release(self) -> None:
        pass


def patched_fingerprint(base: str, digests: Sequence[str]) -> str:
    """The fingerprint of ``base`` weights with patches of these content digests applied in order."""
    h = hashlib.blake2b(digest_size=16)
    h.update(base.encode())
    for d in digests:
        h.update(b"+" + d.encode())
    return h.hexdigest()


def fingerprint_model(model: nn.Module) -> str:
    """Hash of the config and every parameter's bytes: identifies the weights a cache or patch belongs to."""
    digest = hashlib.blake2b(digest_size=16)
    config = model.config.to_dict()
    for key in ("transformers_version", "_name_or_path", "torch_dtype", "dtype", "architectures"):
        config.pop(key, None)
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, param in sorted(model.state_dict().items()):
        digest.update(name.encode())
        tensor = param.detach().contiguous().cpu()
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")  # host: .cpu() above
    return digest.hexdigest()


def quiet_transformers() -> None:
    """Silence transformers' logging, warnings and progress bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", module="transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def package_dir(package: str, pip_name: str, *, no_deps: bool = True) -> Path:
    """The folder of an installed package, or a clear error naming the wheel to install (``no_deps``: whether the
    install line says ``--no-deps``, for wheels whose declared dependencies are not needed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        flag = "--no-deps " if no_deps else ""
        raise EditscopeError(f"package {pip_name!r} is not installed (pip install {flag}{pip_name})")
    return Path(list(spec.submodule_search_locations)[0])


def finish(model: nn.Module, tokenizer, name: str, source: str, fingerprint: str | None = None) -> Bundle:
    """Eval mode, frozen parameters, a pad token, the architecture map and the fingerprint: a Bundle."""
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    arch = arch_for_config(model.config)
    return Bundle(
        name=name,
        model=model,
        tokenizer=tokenizer,
        arch=arch,
        base_fingerprint=fingerprint or fingerprint_model(model),
        source=source,
    )
