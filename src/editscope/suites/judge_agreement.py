"""How well each wild-suite judge agrees with answers labelled by hand.

Each labelled answer (:mod:`editscope.data.judge_labels`) is judged by every judge of its kind: an answer judge
(:data:`~editscope.metrics.answers.JUDGES`) for the rewrite and paraphrase roles, with the question shown as the
wild suite showed it; a neighbourhood judge (:data:`~editscope.metrics.answers.NEIGHBOUR_JUDGES`) for the
neighbourhood role, on the answers before and after the edit. The verdicts are compared with the hand labels per
(dataset, role) group and over all of a kind (:func:`editscope.metrics.agreement.agreement`: accuracy, Cohen's κ,
false-positive and false-negative rates with 95 % intervals), and written as one :class:`~editscope.tables.Table`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from editscope.data.judge_labels import LabelledAnswer
from editscope.metrics.agreement import Agreement, agreement
from editscope.metrics.answers import judge_answer, judge_neighbour
from editscope.suites.wild import QA_TEMPLATE
from editscope.tables import Table

ALL = "all"


def shown_question(item: LabelledAnswer) -> str:
    """The prompt as the wild suite showed it (the QA wrapper for ``qa`` items)."""
    return item.prompt if item.context == "plain" else QA_TEMPLATE.format(prompt=item.prompt)


def verdict(item: LabelledAnswer, judge: str) -> float:
    """The judge's verdict on one labelled answer: an answer judge for rewrite/paraphrase, a neighbourhood judge
    (before vs after) for neighbours."""
    if item.role == "neighborhood":
        assert item.before is not None
        return judge_neighbour(judge, shown_question(item), item.before, item.answer, list(item.gold))
    return judge_answer(judge, shown_question(item), item.answer, list(item.gold))


@dataclass(frozen=True)
class GroupAgreement:
    """One judge against the labels of one group of answers."""

    dataset: str
    role: str
    judge: str
    figures: Agreement


def _groups(items: Sequence[LabelledAnswer]) -> dict[tuple[str, str], list[LabelledAnswer]]:
    groups: dict[tuple[str, str], list[LabelledAnswer]] = {}
    for item in items:
        groups.setdefault((item.dataset, item.role), []).append(item)
        kind = "neighborhood" if item.role == "neighborhood" else "rewrite+paraphrase"
        if kind != "neighborhood":
            groups.setdefault((item.dataset, kind), []).append(item)
        groups.setdefault((ALL, kind), []).append(item)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0] == ALL, kv[0])))


def judge_agreement(items: Sequence[LabelledAnswer], answer_judges: Sequence[str], neighbour_judges: Sequence[str],
                    *, progress: Callable[[int, int], None] | None = None) -> list[GroupAgreement]:
    """Every judge against the labels of every group (dataset × role, dataset × rewrite+paraphrase, and ``all``)
    that holds answers of its kind."""
    verdicts: dict[tuple[str, str], float] = {}
    jobs = [(item, j) for item in items
            for j in (neighbour_judges if item.role == "neighborhood" else answer_judges)]
    for done, (item, j) in enumerate(jobs, 1):
        verdicts[(item.id, j)] = verdict(item, j)
        if progress is not None:
            progress(done, len(jobs))
    out = []
    for (dataset, role), group in _groups(items).items():
        judges = neighbour_judges if role == "neighborhood" else answer_judges
        for j in judges:
            figures = agreement([i.label for i in group], [verdicts[(i.id, j)] for i in group])
            out.append(GroupAgreement(dataset, role, j, figures))
    return out


def best_judges(rows: Sequence[GroupAgreement]) -> dict[tuple[str, str], str]:
    """The judge with the highest κ (ties: higher accuracy, then the name) per (dataset, role) group."""
    best: dict[tuple[str, str], GroupAgreement] = {}
    for r in rows:
        key = (r.dataset, r.role)
        cur = best.get(key)
        score = (_finite(r.figures.kappa[0]), r.figures.accuracy[0])
        if cur is None or score > (_finite(cur.figures.kappa[0]), cur.figures.accuracy[0]):
            best[key] = r
    return {k: v.judge for k, v in best.items()}


def _finite(x: float) -> float:
    return x if x == x else -2.0  # NaN (undefined κ) ranks below every defined value


def _pct(triple: tuple[float, float, float]) -> str:
    value, low, high = triple
    if value != value:
        return "–"
    return f"{100 * value:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def _kappa(triple: tuple[float, float, float]) -> str:
    value, low, high = triple
    return "–" if value != value else f"{value:.2f} [{low:.2f}, {high:.2f}]"


def agreement_table(rows: Sequence[GroupAgreement], *, caption: str = "") -> Table:
    """The agreement figures as one table, the best κ of each group in bold."""
    best = best_judges(rows)
    cells, bold = [], set()
    for i, r in enumerate(rows):
        f = r.figures
        cells.append([r.dataset, r.role, r.judge, f.n, f.positives, _pct(f.accuracy), _kappa(f.kappa),
                      _pct(f.false_positive_rate), _pct(f.false_negative_rate)])
        if best[(r.dataset, r.role)] == r.judge:
            bold.add((i, 6))
    return Table(["dataset", "role", "judge", "n", "labelled right", "accuracy %", "Cohen's κ",
                  "false-positive rate %", "false-negative rate %"], cells, bold=frozenset(bold),
                 align="lllrrrrrr", caption=caption,
                 notes=["Each judge against answers labelled by hand (sample/judge-labels/README.md gives the rule). "
                        "95 % intervals: Wilson for the rates, Cohen's large-sample normal interval for κ. "
                        "False-positive rate: accepted among the answers labelled wrong; false-negative rate: "
                        "rejected among those labelled right. Bold: the highest κ of the group."])


__all__ = ["ALL", "GroupAgreement", "agreement_table", "best_judges", "judge_agreement", "shown_question",
           "verdict"]
