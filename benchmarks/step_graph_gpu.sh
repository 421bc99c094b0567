#!/usr/bin/env bash
# The GPU checks of the training step captured as one CUDA graph, in one call from any directory, offline, on a
# one-GPU CUDA machine with torch and triton (the project runs from src/; no install needed). Under ten minutes
# (each stage has a time limit):
#   (1) the real-capture tests (tests/train/test_step_graph_cuda.py, -s: each check's measured difference, the
#       optimizer that runs, the LSTM state's dtype under bf16): every head captured and replayed against its eager
#       steps; the replay checked at real shapes (WikiText-2, LSTM 512, bf16, 128 x 20); a freeze that recaptures; a
#       multi-layer dropout LSTM kept eager; a capture failing with a Python-level and with a CUDA error, each in a
#       process of its own, leaving the allocator clean;
#   (2) the CPU emulator's failure-path tests, under Triton's interpreter (TRITON_INTERPRET=1 for them alone);
#   (3) whole-model tokens/s with the step eager and captured: WikiText-2 LSTM 512 bf16 (where the data is found)
#       and a 256k-word Zipf stream. A table is written to docs/benchmarks/ only where every row ran.
# Data: $SOHSM_DATA, else ../shared/data, ./shared/data, ./.gpu-data (the folder holding wikitext-2/).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src
for d in "${SOHSM_DATA:-}" ../shared/data ./shared/data ./.gpu-data; do
  [ -n "$d" ] && [ -d "$d/wikitext-2" ] && { export SOHSM_DATA=$(cd "$d" && pwd); break; }
done
export SOHSM_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'commit', end=' ')"
git rev-parse --short HEAD 2>/dev/null || echo "(no git)"
python -c "import pooch, yaml, tqdm, numpy" 2>/dev/null || { echo "missing pooch/yaml/tqdm/numpy: install them first"; exit 1; }
[ -n "${SOHSM_DATA:-}" ] && echo "data: $SOHSM_DATA" || echo "no data directory with wikitext-2: its rows are left out"
status=0

echo "== (1) real-capture tests"
timeout 230 python -m pytest -q -s -rA -p no:cacheprovider tests/train/test_step_graph_cuda.py 2>&1 | tail -60
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== (2) the emulator's failure-path tests (CPU, Triton interpreted; the rest of its tests take minutes: CPU CI)"
TRITON_INTERPRET=1 timeout 90 python -m pytest -q -p no:cacheprovider tests/train/test_step_graph_failures.py 2>&1 \
  | tail -5
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== (3) tokens/s, the step eager and captured"
if [ -n "${SOHSM_DATA:-}" ]; then
  timeout 120 python benchmarks/step_graph_gpu.py --corpus wikitext-2 --amp bf16 --emb-size 512 --hidden-size 512 \
    --max-tokens 400000 || status=1
fi
timeout 120 python benchmarks/step_graph_gpu.py --zipf 256000 --amp bf16 --emb-size 512 --hidden-size 512 \
  --max-tokens 300000 --head full --head adaptive --head self_organized \
  --output docs/benchmarks/step-graph-gpu-256k.md || status=1
echo "step_graph_gpu.sh: $([ $status = 0 ] && echo 'every stage passed' || echo 'SOME STAGE FAILED (above)')"
exit $status
