"""GRACE's codebook at lifelong sizes: placing edits and searching the keys, against the previous code's structure.

(p) ``--place`` placements (new keys, as a stream's edits mostly are) into a codebook of N entries (``--sizes``,
    SmolLM2's widths: keys 1,536, values 576): :class:`editscope.edit.grace.GraceCodebook` as it runs now (rows
    appended into spare room, the keys kept in float64 with their norms) against the baseline that ran before: each
    new entry concatenated onto copies of the keys, values and radii, each search converting every key to float64
    and calling ``torch.cdist``. Checks both place the same entries with the same radii; prints ``ratio`` =
    baseline / now.
(s) A governed forward's search of ``--rows`` queries: :func:`editscope.edit.memory.nearest` on keys prepared once
    (:class:`SearchKeys`, as a memory does once per install) against converting the keys and ``torch.cdist`` on
    every forward (the baseline); same nearest keys; ``ratio`` = baseline / now.

Random keys (no model): the costs depend on the codebook's size and widths only. Run alone for the seconds; the
ratios are taken in one process.
"""

from __future__ import annotations

import argparse
import time

import torch

from editscope.edit.grace import GraceCodebook
from editscope.edit.memory import SearchKeys, nearest

D_KEY, D_VALUE = 1536, 576


class BaselineCodebook(GraceCodebook):
    """The previous code's costs under the same Algorithm 1 (:meth:`GraceCodebook.place`): each search converts
    every key to float64 and calls ``torch.cdist``; each new entry is concatenated onto copies of the codebook."""

    def _nearest(self, key: torch.Tensor) -> tuple[float, int]:
        dist, index = torch.cdist(key.double()[None][None], self.keys.double()[None])[0].min(dim=1)
        return float(dist[0]), int(index[0])

    def _add(self, key: torch.Tensor, label: str, radius: float, value: torch.Tensor) -> int:
        self.keys = torch.cat([self.keys, key[None]])
        self.values = torch.cat([self.values, value[None]])
        self.radii = torch.cat([self.radii, torch.tensor([radius], dtype=torch.float64)])
        self.labels = self.labels + (label,)
        return self.size - 1


def codebook_of(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    torch.manual_seed(0)
    return (torch.randn(n, D_KEY), torch.randn(n, D_VALUE), torch.ones(n, dtype=torch.float64),
            [f"y{i}" for i in range(n)])


def timed_places(book, keys: torch.Tensor) -> tuple[float, list[tuple[int, str]]]:
    start = torch.zeros(D_VALUE)
    t = time.perf_counter()
    placed = [book.place(k, f"n{i}", 1.0, start) for i, k in enumerate(keys)]
    return time.perf_counter() - t, placed


def bench_place(n: int, count: int) -> None:
    keys, values, radii, labels = codebook_of(n)
    new = torch.randn(count, D_KEY)
    # a few near an existing key: an expand and a split on the way
    new[1], new[2] = keys[5] + 0.01, keys[9] + 0.01
    now = GraceCodebook.from_state_dict({"keys": keys, "values": values, "radii": radii}, {"labels": labels}, "bench")
    now_s, now_placed = timed_places(now, new)
    base = BaselineCodebook(keys, values, radii, labels)
    base_s, base_placed = timed_places(base, new)
    assert now_placed == base_placed, "the two codebooks placed the edits differently"
    assert torch.equal(now.keys, base.keys) and torch.allclose(now.radii, base.radii, rtol=0, atol=1e-9)
    print(f"place  {n:>6} entries, {count} edits: baseline {base_s:.2f} s, now {now_s:.2f} s, "
          f"ratio {base_s / now_s:.1f}")


def bench_search(n: int, rows: int, repeats: int) -> None:
    keys = codebook_of(n)[0]
    queries = torch.randn(rows, D_KEY)
    t = time.perf_counter()
    for _ in range(repeats):
        base = torch.cdist(queries.double()[None], keys.double()[None])[0].min(dim=1)
    base_s = (time.perf_counter() - t) / repeats
    search = SearchKeys.of(keys)
    t = time.perf_counter()
    for _ in range(repeats):
        dist, index = nearest(queries, search)
    now_s = (time.perf_counter() - t) / repeats
    assert torch.equal(index, base.indices) and torch.allclose(dist, base.values, rtol=1e-9)
    print(f"search {n:>6} entries, {rows} rows: baseline {base_s * 1e3:.1f} ms, now {now_s * 1e3:.1f} ms, "
          f"ratio {base_s / now_s:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="codebook sizes, comma-separated")
    parser.add_argument("--place", type=int, default=100, help="placements per size (a round of 100 edits)")
    parser.add_argument("--rows", type=int, default=16, help="queries in one governed forward")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for n in (int(x) for x in args.sizes.split(",")):
        bench_place(n, args.place)
        bench_search(n, args.rows, args.repeats)


if __name__ == "__main__":
    main()
