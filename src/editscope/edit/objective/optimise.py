"""The one optimiser of v* / z: Adam on δ for any number of requests, each with its own δ, Adam state, early stop
and norm clamp (ROME ``compute_v`` / MEMIT ``compute_z``; one request is the case n = 1).

Per step, for a group of requests (contexts built on the same model, δ at one hook point):

    hidden  = forward of every active request's rows, each δ added at its own subject positions   (one forward)
    loss_c  = Σ_terms term(VStep(ctx_c, δ_c, hidden rows of c))                                  (terms.py)
    stop c if loss_c < stop_loss or the step is the last                                            (early stop)
    backward Σ_c loss_c; Adam step per δ_c; ‖δ_c‖ clamped to clamp_norm_factor · ‖v₀_c‖            (ref. code)

Rows of different requests never mix (attention stays within a row), so each δ gets its own gradient and, Adam
being elementwise, its own trajectory: a request's δ equals the one it gets alone up to float rounding. How the
forward is computed is the contexts' :class:`~editscope.edit.objective.forward.ForwardStrategy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from editscope.edit.objective.problem import VContext
from editscope.edit.objective.terms import ObjectiveTerm, VStep, setup_terms
from editscope.lm.engine import TokenBatch
from editscope.progress import report


@dataclass(frozen=True)
class AdamSettings:
    """The optimiser's settings (from a :class:`~editscope.edit.hparams.VStarHParams`)."""

    lr: float
    steps: int
    clamp_norm_factor: float
    stop_loss: float


def optimise(ctxs: Sequence[VContext], terms: Sequence[Sequence[ObjectiveTerm]], settings: AdamSettings, *,
             token_budget: int, max_requests: int | None = None) -> list[torch.Tensor]:
    """δ (float64) of each context, the contexts optimised in groups of :func:`request_groups` (one batched
    forward per step for a group). A term that is not ``batched`` (APP) runs forwards of its own per request, so
    with one the groups are single requests. Each context's loss history goes to
    ``ctx.store["losses"]``; its forward caches are released once its group is done."""
    if len(ctxs) != len(terms):
        raise ValueError(f"{len(ctxs)} contexts but {len(terms)} term lists")
    batched = all(t.batched for ts in terms for t in ts)
    groups = request_groups(ctxs, token_budget, max_requests) if batched else [[i] for i in range(len(ctxs))]
    out: list[torch.Tensor] = [torch.empty(0)] * len(ctxs)  # host: placeholders, replaced below
    for group in groups:
        found = _optimise_group([ctxs[i] for i in group], [terms[i] for i in group], settings)
        for i, delta in zip(group, found, strict=True):
            out[i] = delta
            ctxs[i].release()
    return out


def request_groups(ctxs: Sequence[VContext], token_budget: int, max_requests: int | None = None) -> list[list[int]]:
    """Consecutive contexts grouped so that each group's joint batch holds at most ``token_budget`` tokens (rows ×
    widest row, as the engine's own batching) and at most ``max_requests`` requests (None: no cap); a context
    larger than the budget is a group of its own."""
    groups: list[list[int]] = []
    rows = width = 0
    for i, ctx in enumerate(ctxs):
        n, w = ctx.batch.input_ids.shape
        if groups and (max_requests is None or len(groups[-1]) < max_requests) \
                and (rows + n) * max(width, w) <= token_budget:
            groups[-1].append(i)
            rows, width = rows + n, max(width, w)
        else:
            groups.append([i])
            rows, width = n, w
    return groups


def concat_batches(batches: Sequence[TokenBatch], pad_id: int) -> TokenBatch:
    """The rows of ``batches`` in order, right-padded to the widest: each row keeps its token positions."""
    width = max(b.input_ids.shape[1] for b in batches)

    def pad(t: torch.Tensor, value: int | bool) -> torch.Tensor:
        out = torch.full((t.shape[0], width), value, dtype=t.dtype, device=t.device)
        out[:, : t.shape[1]] = t
        return out

    return TokenBatch(torch.cat([pad(b.input_ids, pad_id) for b in batches]),
                      torch.cat([pad(b.attention_mask, 0) for b in batches]),
                      torch.cat([pad(b.target_mask, False) for b in batches]),
                      [n for b in batches for n in b.context_lengths],
                      [n for b in batches for n in b.continuation_lengths],
                      [e for b in batches for e in b.context_embeds])


def _group_forward(ctxs: Sequence[VContext]):
    """The group's forward: a lone request's own main forward (which its plug-in terms share), else one forward
    of the contexts' rows stacked and right-padded (row r of request c keeps its positions)."""
    if len(ctxs) == 1:
        return ctxs[0].main_forward()
    engine, first = ctxs[0].engine, ctxs[0]
    joint = concat_batches([c.batch for c in ctxs], engine.pad_id)
    positions = [p for c in ctxs for p in c.subject_positions]
    return first.forward.main(engine, joint, positions, first.hook_point, [r for c in ctxs for r in c.last_read])


def _row_deltas(deltas: Sequence[torch.Tensor], active: Sequence[int], sizes: Sequence[int]) -> torch.Tensor:
    """δ per row of the active requests' rows [B, d]; a lone active request's δ [d] broadcasts over its rows."""
    if len(active) == 1:
        return deltas[active[0]]
    counts = torch.tensor([sizes[c] for c in active], device=deltas[0].device)
    return torch.stack([deltas[c] for c in active]).repeat_interleave(counts, dim=0)


def _optimise_group(ctxs: Sequence[VContext], terms: Sequence[Sequence[ObjectiveTerm]],
                    settings: AdamSettings) -> list[torch.Tensor]:
    _check_group(ctxs)
    sizes = [c.batch.input_ids.shape[0] for c in ctxs]
    starts = [sum(sizes[:c]) for c in range(len(ctxs) + 1)]
    forward = group_forward = _group_forward(ctxs)
    base = forward.base_hidden  # one unedited forward for the group: every context's pre-edit states
    for c, ctx in enumerate(ctxs):
        ctx.store["unedited_hidden"] = base[starts[c]:starts[c + 1], : ctx.batch.input_ids.shape[1]]
        setup_terms(ctx, terms[c])

    deltas = [torch.zeros(c.v_init.shape[0], dtype=torch.float32, device=c.v_init.device, requires_grad=True)
              for c in ctxs]
    opts = [torch.optim.Adam([d], lr=settings.lr) for d in deltas]
    max_norms = [settings.clamp_norm_factor * float(c.v_init.norm()) for c in ctxs]
    histories: list[list[dict[str, float]]] = [[] for _ in ctxs]
    active = list(range(len(ctxs)))
    for i in range(settings.steps):
        report(f"v* optimisation of {len(active)} request(s), step", i + 1, settings.steps)
        with torch.enable_grad():  # also when the caller runs under no_grad
            hidden = forward.hidden(_row_deltas(deltas, active, sizes))
            losses = _losses(ctxs, terms, deltas, hidden, active, sizes, histories)
            last = i == settings.steps - 1
            still = [c for c in active if not (float(losses[c].detach()) < settings.stop_loss or last)]
            total = sum(losses[c] for c in still)  # inside enable_grad: the sum must keep its graph
        if not still:
            break
        for c in still:
            opts[c].zero_grad()
        total.backward()
        for c in still:
            _clamped_step(opts[c], deltas[c], max_norms[c])
        if still != active:  # some requests stopped: the others' rows only from now on
            forward = group_forward.select([r for c in still for r in range(starts[c], starts[c + 1])])
        active = still
    for ctx, history in zip(ctxs, histories, strict=True):
        ctx.store["losses"] = history
    return [d.detach().double() for d in deltas]


def _check_group(ctxs: Sequence[VContext]) -> None:
    """One group shares one engine, hook point and forward strategy, and every context has its v₀."""
    engine, hook_point = ctxs[0].engine, ctxs[0].hook_point
    if hook_point is None or any(c.v_init is None or c.hook_point != hook_point or c.engine is not engine
                                 or c.forward != ctxs[0].forward for c in ctxs):
        raise ValueError("the optimiser needs contexts of one engine, one hook point and one forward strategy, "
                         "with v₀")


def _losses(ctxs: Sequence[VContext], terms: Sequence[Sequence[ObjectiveTerm]], deltas: list[torch.Tensor],
            hidden: torch.Tensor, active: list[int], sizes: list[int], histories: list[list[dict[str, float]]]
            ) -> dict[int, torch.Tensor]:
    """Each active context's loss, the sum of its terms on its rows of ``hidden`` (each term's value logged)."""
    losses, offset = {}, 0
    for c in active:
        h = hidden[offset:offset + sizes[c], : ctxs[c].batch.input_ids.shape[1]]
        offset += sizes[c]
        full = None
        if ctxs[c].forward.full_logprobs:
            full = ctxs[c].engine.logits_from_hidden(h).float().log_softmax(-1)
        parts = {term.name: term(VStep(ctxs[c], deltas[c], h, full_logprobs=full)) for term in terms[c]}
        histories[c].append({k: float(v.detach()) for k, v in parts.items()})
        losses[c] = sum(parts.values())
    return losses


def _clamped_step(opt: torch.optim.Optimizer, delta: torch.Tensor, max_norm: float) -> None:
    """One Adam step, then δ scaled back onto the ball ‖δ‖ ≤ ``max_norm`` (ROME's clamp_norm_factor·‖v₀‖)."""
    opt.step()
    with torch.no_grad():
        norm = delta.norm()
        if norm > max_norm:
            delta.mul_(max_norm / norm)
