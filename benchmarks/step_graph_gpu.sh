#!/usr/bin/env bash
# The GPU checks of the training step captured as one CUDA graph, in one call, from the project's root (about ten
# minutes on one H200): the real-capture tests, then whole-model tokens/s with the step eager and captured, at the
# WikiText-2 LSTM 512 (bf16) and over a 256k-word Zipf stream. The tables go to docs/benchmarks/step-graph-gpu*.md.
set -u
python -m pytest -q tests/train/test_step_graph_cuda.py tests/train/test_step_graph.py tests/train/test_device_adagrad.py
python benchmarks/step_graph_gpu.py --corpus wikitext-2 --amp bf16 --emb-size 512 --hidden-size 512 \
    --max-tokens 600000
python benchmarks/step_graph_gpu.py --zipf 256000 --amp bf16 --emb-size 512 --hidden-size 512 --max-tokens 300000 \
    --head full --head adaptive --head self_organized --output docs/benchmarks/step-graph-gpu-256k.md
