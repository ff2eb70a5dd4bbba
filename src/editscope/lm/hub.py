"""Models by Hugging Face hub id (``--model openai-community/gpt2-xl``), through the standard hub cache.

The snapshot (config, weights, tokenizer files) is fetched into or read from the usual cache
(``$HF_HUB_CACHE`` / ``$HF_HOME``) with ``huggingface_hub.snapshot_download``, then loaded as a local folder.
Offline (``HF_HUB_OFFLINE=1``, or the hub unreachable) a cached snapshot is used; without one the error says
how to point ``--model`` at a local folder. Hyperparameters are looked up as
``configs/hparams/{method}/{org}/{name}.yaml``, then under the shipped name of a model the papers used
(:data:`HPARAMS_NAMES`: ``openai-community/gpt2-xl`` -> ``gpt2-xl``); a model without either gets hparams
derived from its architecture and depth (:func:`editscope.edit.hparams.derive_hparams`) or, for a method with no
derivation rule, an error naming ``--hparams``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from editscope.errors import EditscopeError

#: what the hub accepts as a repository id: ``org/name`` of letters, digits, ``-_.``
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
#: files a causal LM snapshot needs (no PyTorch .bin/.pth/ONNX/GGUF copies of the same weights)
PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "tokenizer*"]


#: Shipped hparams name (``configs/hparams/{method}/{name}.yaml``) of the models the papers used, by hub id and by
#: the bare folder name a ``huggingface-cli download --local-dir`` gives (both lower-cased). AlphaEdit ran
#: Llama-3-8B-Instruct (its README); the base model shares the architecture and gets the same files.
HPARAMS_NAMES: dict[str, str] = {
    "openai-community/gpt2-xl": "gpt2-xl",
    "gpt2-xl": "gpt2-xl",
    "eleutherai/gpt-j-6b": "gpt-j-6b",
    "gpt-j-6b": "gpt-j-6b",
    "meta-llama/meta-llama-3-8b": "llama3-8b",
    "meta-llama/meta-llama-3-8b-instruct": "llama3-8b",
    "meta-llama-3-8b": "llama3-8b",
    "meta-llama-3-8b-instruct": "llama3-8b",
}


def hparams_name(model_name: str) -> str | None:
    """The shipped hparams name of a paper model given by hub id (``EleutherAI/gpt-j-6B``) or folder name
    (``Meta-Llama-3-8B-Instruct``), case-insensitively; None for any other model."""
    key = model_name.strip().lower()
    return HPARAMS_NAMES.get(key) or HPARAMS_NAMES.get(key.rsplit("/", 1)[-1])


def is_hub_id(text: str) -> bool:
    """``org/name`` that is not an existing local path."""
    return bool(HUB_ID.match(text)) and not Path(text).expanduser().exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def hub_folder(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot folder of ``repo_id`` (downloaded when the hub is reachable and it is not cached)."""
    from huggingface_hub import snapshot_download

    hint = (f"download it where the hub is reachable (huggingface-cli download {repo_id} --local-dir DIR) and "
            f"pass --model DIR")
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=PATTERNS,
                                   local_files_only=_offline())
    except Exception as exc:  # noqa: BLE001 (hub errors: offline, not cached, no network, unknown or gated repo)
        why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        where = "offline (HF_HUB_OFFLINE=1)" if _offline() else "the hub"
        raise EditscopeError(f"model {repo_id!r}: not in the local hub cache and not loadable from {where} "
                             f"({type(exc).__name__}: {why}); {hint}") from None
    path = Path(folder)
    if not any(path.glob("*.safetensors")):
        raise EditscopeError(f"model {repo_id!r}: the hub snapshot {path} has no .safetensors weights; {hint} "
                             "after converting the weights to safetensors")
    return path
