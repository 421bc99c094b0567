#!/usr/bin/env bash
# The GPU checks of the training step captured as one CUDA graph, in one call, from the project's root (about ten
# minutes on one H200): the real-capture tests (every head captured and replayed against its eager steps; the replay
# checked against an eager step at real shapes, WikiText-2, LSTM 512, bf16, 128 x 20, a re-clustering every 25
# steps, within 1e-3; a capture that fails half-way leaving a clean eager run), then whole-model tokens/s with the
# step eager and captured, at the WikiText-2 LSTM 512 (bf16) and over a 256k-word Zipf stream. The tables go to
# docs/benchmarks/step-graph-gpu*.md; the tests print each check's measured difference (-s).
set -u
python -m pytest -q -s -rA tests/train/test_step_graph_cuda.py
python -m pytest -q tests/train/test_step_graph.py tests/train/test_device_adagrad.py
python benchmarks/step_graph_gpu.py --corpus wikitext-2 --amp bf16 --emb-size 512 --hidden-size 512 \
    --max-tokens 600000
python benchmarks/step_graph_gpu.py --zipf 256000 --amp bf16 --emb-size 512 --hidden-size 512 --max-tokens 300000 \
    --head full --head adaptive --head self_organized --output docs/benchmarks/step-graph-gpu-256k.md
