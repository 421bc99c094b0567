"""benchmarks/subword_hf.py end to end on a small text: a Hugging Face Llama with the full and the self-organized head,
trained by the Trainer on sohsm's batches, evaluated by sohsm's code, kept, skipped once kept, resumed from a
Trainer checkpoint as if never interrupted, and reported beside sohsm's own runs."""
import json
import math
import shutil

import pytest
import torch

from benchmark_scripts import load_script
from needs import HF_HOW, need_corpus, need_packages

need_packages("transformers", "tokenizers", how=HF_HOW)

from sohsm.data.batching import batchify, bptt_batches  # noqa: E402

subword_hf = load_script("subword_hf")

#: a tiny model and budget in place of the protocol's (sohsm lm train flags): 10 steps of 4 x 8 tokens
TINY = ("--layers 1 --hidden-size 16 --attention-heads 2 --bptt 8 --batch-size 4 --eval-batch-size 4 "
        "--max-tokens 320 --warmup 2")
SENTENCES = ["the cat sat on the mat", "a dog ran after the cat", "the bird saw a dog on the mat"]
SCORES = ("nll_nats", "ppl", "ppl_word", "bits_per_byte")


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SOHSM_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "text"
    folder.mkdir()
    for name, lines in (("train.txt", 200), ("valid.txt", 40), ("test.txt", 40)):
        (folder / name).write_text("\n".join(SENTENCES[i % 3] for i in range(lines)) + "\n")
    return folder


def _argv(tmp_path, corpus, heads="full,self_organized", extra=TINY):
    return ["train", "--vocabularies", "bpe:270", "--heads", heads, "--seeds", "1", "--runs-dir",
            str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--corpus", str(corpus), "--extra", extra]


def test_train_keeps_each_run_and_the_report_sets_them_beside_sohsm(corpus, tmp_path):
    results = tmp_path / "results"
    assert subword_hf.main(_argv(tmp_path, corpus)) == 0
    for head in subword_hf.HEADS:
        kept = results / "bpe-270" / "seed-1" / f"hf-llama-{head}"
        assert sorted(p.name for p in kept.iterdir()) == ["result.json"]
        result = json.loads((kept / "result.json").read_text())
        assert result["steps"] == result["planned_steps"] == 10 and result["tokens"] == 320  # sohsm's budget
        assert result["llama"]["hidden_size"] == 16 and result["llama"]["intermediate_size"] == 64
        assert result["llama"]["tie_word_embeddings"] and result["llama"]["max_position_embeddings"] == 8
        assert result["optimizer"] == {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1,
                                       "decayed": "the blocks' linear weights", "clip": 1.0, "schedule": "cosine",
                                       "warmup": 2, "fused": result["optimizer"]["fused"]}
        assert "tokenizer=" in result["corpus"] and result["train_tokens_per_s"] > 0
        for split in ("valid", "test"):
            scores = result[split]
            assert all(math.isfinite(scores[key]) for key in SCORES), scores
            assert scores["words"] > 0 and scores["text_bytes"] > scores["words"]
            assert scores["split_tokens"] >= scores["tokens"] > 0
            loss = scores["nll_nats"] * scores["split_tokens"]  # sohsm lm eval's conventions
            assert scores["ppl_word"] == pytest.approx(math.exp(loss / scores["words"]))
            assert scores["bits_per_byte"] == pytest.approx(loss / math.log(2) / scores["text_bytes"])
    so = json.loads((results / "bpe-270" / "seed-1" / "hf-llama-self_organized" / "result.json").read_text())
    assert so["K"] >= 1 and so["valid"]["ppl_cluster"] is not None

    kept = results / "bpe-270" / "seed-1" / "hf-llama-full" / "result.json"
    before = kept.stat().st_mtime_ns
    assert subword_hf.main(_argv(tmp_path, corpus, heads="full")) == 0 and kept.stat().st_mtime_ns == before

    sohsm_results = tmp_path / "sohsm"  # a kept run of subword.py for the full head, none for the other
    ours = sohsm_results / "bpe-270" / "seed-1" / "full-tied"
    ours.mkdir(parents=True)
    (ours / "config.json").write_text("{}")
    (ours / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 10, "tokens": 320, "elapsed_s": 1.0})
                                        + "\n")
    for split, ppl_word in (("valid", 30.0), ("test", 40.0)):
        (ours / f"{split}.json").write_text(json.dumps({"ppl": 5.0, "ppl_word": ppl_word, "bits_per_byte": 2.0,
                                                        "split_tokens": 600, "words": 300, "step": 10}))
    text = subword_hf.report(tmp_path / "subword-hf.md", results, sohsm_results)
    assert (tmp_path / "subword-hf.md").read_text() == text and "## bpe:270" in text
    rows = [line for line in text.splitlines() if line.startswith("| HF Llama")]
    assert len([r for r in rows if "| 1 | 10 | 320 |" in r]) == len(subword_hf.HEADS)  # a row per head, seed 1
    full = json.loads(kept.read_text())
    assert any(f"| {full['valid']['ppl_word']:.2f} | {full['test']['ppl_word']:.2f} |" in r for r in rows)
    assert "| sohsm transformer | full-tied | 1 | 10 | 320 | 5.00 | 5.00 | 30.00 | 40.00 |" in text
    assert "| sohsm transformer | self_organized-tied | 1 | not run yet |" in text
    gap = math.expm1(math.log(full['test']['ppl_word'] / 40.0)) * 100
    assert f"- full: HF / sohsm - 1, test ppl per word {gap:+.2f}%" in text
    assert "- self_organized: HF / sohsm - 1, test ppl per word not run yet" in text
    assert "python benchmarks/subword_hf.py train --vocabularies bpe:270 --heads self_organized --seeds 1" in text
    assert "| sohsm transformer | full-tied | 1 | not run yet |" in text.split("## bpe:8000")[1]  # the protocol's
    assert "- self_organized / full - 1 within each model, test ppl per word: not run yet" in text

    theirs = sohsm_results / "bpe-270" / "seed-1" / "self_organized-tied"  # both heads of both models: head vs head
    theirs.mkdir()
    for name in ("config.json", "metrics.jsonl", "valid.json"):
        (theirs / name).write_bytes((ours / name).read_bytes())
    (theirs / "test.json").write_text((ours / "test.json").read_text().replace("40.0", "36.0"))
    text = subword_hf.report(tmp_path / "subword-hf.md", results, sohsm_results)
    so_test = so["test"]["ppl_word"] / full["test"]["ppl_word"]
    assert (f"- self_organized / full - 1 within each model, test ppl per word: sohsm transformer -10.00% (one seed), "
            f"HF Llama {math.expm1(math.log(so_test)) * 100:+.2f}% (one seed)") in text


def test_a_resumed_run_ends_as_the_uninterrupted_one(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(subword_hf, "SAVE_STEPS", 5)
    monkeypatch.setattr(subword_hf, "KEEP_CHECKPOINTS", None)
    argv = _argv(tmp_path, corpus, heads="self_organized", extra=TINY + " --update-every 3")  # re-clusters at 3, 6, 9
    assert subword_hf.main(argv) == 0
    kept = tmp_path / "results" / "bpe-270" / "seed-1" / "hf-llama-self_organized" / "result.json"
    whole = json.loads(kept.read_text())
    run = tmp_path / "runs" / "bpe-270" / "seed-1" / "hf-llama-self_organized"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-5"]
    shutil.rmtree(run / "checkpoint-10")  # stopped after step 5's checkpoint
    kept.unlink()
    assert subword_hf.main(argv) == 0
    resumed = json.loads(kept.read_text())
    assert resumed["steps"] == 10 and resumed["sessions"] == 1
    for split in ("valid", "test"):
        for key in SCORES:
            assert resumed[split][key] == pytest.approx(whole[split][key], rel=1e-5), (split, key)
    assert [step for step, _ in resumed["train_loss"]] == [step for step, _ in whole["train_loss"]] == [2, 4, 6, 8, 10]
    # the Trainer logs the mean loss since its last log: at step 6, after the resume at 5, step 6's alone
    assert [loss for step, loss in resumed["train_loss"] if step != 6] == pytest.approx(
        [loss for step, loss in whole["train_loss"] if step != 6], abs=2e-4)
    assert whole["K"] == resumed["K"] == 3


def test_the_examples_are_sohsm_s_batches_in_its_order():
    windows_class, _ = subword_hf._torch_parts()
    ids = torch.arange(1000)
    windows = windows_class(ids, 4, 16, 40)  # 249 rows: 16 windows an epoch, the last of 8 rows; 40 steps
    expected = [batch for _ in range(3) for batch in bptt_batches(batchify(ids, 4), 16)][:40]
    assert len(windows) == 40 * 4 and windows.steps_per_epoch == 16
    for step, (inputs, targets) in enumerate(expected):
        items = [windows[step * 4 + column] for column in range(4)]
        assert torch.equal(torch.stack([item["input_ids"] for item in items]), inputs.t())
        assert torch.equal(torch.stack([item["shift_labels"] for item in items]), targets.t())
    assert windows.tokens() == sum(inputs.numel() for inputs, _ in expected)


def test_the_config_is_sohsm_lm_train_s():
    config = subword_hf.sohsm_config(subword_hf.sohsm_args("bpe:8000", "self_organized", 3))
    assert (config.data.corpus, config.data.tokenizer, config.seed) == ("wikitext-2", "bpe:8000", 3)
    assert (config.model.hidden_size, config.model.layers, config.model.attention_heads) == (256, 4, 4)
    assert (config.bptt, config.batch_size, config.max_tokens, config.model.tie_weights) == (128, 32, 1_000_000, True)
    o = config.optim
    assert (o.optimizer, o.learning_rate, o.weight_decay, o.clip, o.lr_schedule, o.warmup) == (
        "adamw", 1e-3, 0.1, 1.0, "cosine", 100)
    llama = subword_hf.llama_config(config, 8000)
    assert (llama.hidden_size, llama.intermediate_size, llama.num_hidden_layers, llama.num_attention_heads) == (
        256, 1024, 4, 4)
    assert llama.max_position_embeddings == 128 and llama.tie_word_embeddings and llama.vocab_size == 8000
    assert subword_hf.head_options(config) == {"seed": 3}


@pytest.mark.slow
def test_wikitext_2_a_few_steps(tmp_path, monkeypatch):
    """The real corpus from the data directory: a BPE of 300 trained on WikiText-2's training split (about a
    minute), a tiny model, 2 steps of sohsm's 32 x 128 batches."""
    need_corpus("wikitext-2")
    monkeypatch.setenv("SOHSM_CACHE", str(tmp_path / "cache"))
    argv = ["train", "--vocabularies", "bpe:300", "--heads", "self_organized", "--seeds", "1",
            "--runs-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results"),
            "--extra", "--layers 1 --hidden-size 16 --attention-heads 2 --max-tokens 8192 --warmup 1"]
    assert subword_hf.main(argv) == 0
    result = json.loads((tmp_path / "results" / "bpe-300" / "seed-1" / "hf-llama-self_organized" / "result.json")
                        .read_text())
    assert result["steps"] == 2 and result["tokens"] == 8192 and result["corpus"].startswith("wikitext-2 ")
    assert all(math.isfinite(result["test"][key]) for key in SCORES)


def test_the_matched_report_says_what_still_differs_and_its_commands(tmp_path):
    """``report --matched``: sohsm's transformer with Llama's rotary positions and no dropout, said in its table, its
    folders and its commands (no runs kept yet: every row "not run yet")."""
    text = subword_hf.report(tmp_path / "m.md", tmp_path / "subword-hf-matched", tmp_path / "subword-matched",
                             matched=True)
    assert text.startswith("# Subword vocabularies: sohsm's transformer against the same model as a Hugging Face "
                           "Llama, matched: rotary positions, no dropout")
    assert "| positions | rotary (base 10000; `--positions rotary`) | rotary (base 10000) |" in text
    assert "| dropout | none (`--dropout 0`) | none (attention dropout: sohsm's, 0) |" in text
    assert "[subword-hf-matched/](subword-hf-matched/)" in text and "[subword-matched/](subword-matched/)" in text
    assert "python benchmarks/subword.py train --matched --vocabularies bpe:8000" in text
    assert "python benchmarks/subword_hf.py report --matched" in text
    assert "| HF Llama | `use_head(model, \"full\")` | 1 | not run yet |" in text
    assert subword_hf.subword.MATCHED_FLAGS == ("--dropout", "0", "--positions", "rotary")
