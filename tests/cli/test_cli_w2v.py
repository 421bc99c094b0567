"""`sohsm w2v`: train with any head, resume exactly, export readable by gensim, neighbours, eval, bad input."""
from __future__ import annotations

import shlex

import numpy as np
import pytest
import torch

import sohsm.cli.w2v as w2v_cli
from sohsm.tasks.w2v.kernel import numba_available
from sohsm.tasks.w2v.vectors import load_vectors

NEEDS_NUMBA = pytest.mark.skipif(not numba_available(), reason="numba (the w2v and dev extras) is not installed")

W2V_SMALL = ["--dim", "16", "--window", "3", "--min-count", "2", "--text-mode", "running", "--batch-words", "200",
             "--eval-rows", "200", "--quiet"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """Running text of 12,000 words from 4 topics of 12 words each: words of a topic occur together."""
    rng = np.random.default_rng(0)
    topics = [[f"{t}{i}" for i in range(12)] for t in ("red", "cat", "sun", "car")]
    words = []
    while len(words) < 12_000:
        words.extend(rng.choice(topics[rng.integers(4)], size=8))
    path = tmp_path_factory.mktemp("w2v-text") / "topics.txt"
    path.write_text(" ".join(words) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("head", ["tree_huffman", "pmi", "self_organized", "tree", "two_level_frequency"])
def test_train_any_head_learns_topics(cli, text, tmp_path, head):
    run = tmp_path / head
    code, out, err = cli("w2v", "train", "--corpus", str(text), "--head", head, "--run-dir", str(run), "--epochs", "3",
                         *W2V_SMALL)
    assert code == 0, err
    assert "all epochs done" in out and "corpus words/s" in out and " rows/s, the progress bar's unit" in out
    vectors = load_vectors(run)
    assert "<unk>" not in vectors.words and len(vectors) == 48
    centred = vectors.vectors - vectors.vectors.mean(dim=0)  # the direction all words share says nothing of topics
    unit = centred / centred.norm(dim=1, keepdim=True)
    topic = torch.tensor([w[:3] == "red" for w in vectors.words])
    red = unit[topic]
    within = (red @ red.t()).mean()
    across = (red @ unit[~topic].t()).mean()
    assert within > across + 0.1, (head, float(within), float(across))


def test_clusters_of_the_self_organized_head_and_skipgram(cli, text, tmp_path):
    run = tmp_path / "so"
    code, out, err = cli("w2v", "train", "--corpus", str(text), "--head", "self_organized", "--model", "skipgram",
                         "--run-dir", str(run), "--epochs", "2", *W2V_SMALL)
    assert code == 0 and "sohsm w2v clusters" in out, err
    code, out, err = cli("w2v", "clusters", str(run), "--top", "3", "--show", "0")
    assert code == 0, err
    lines = out.strip().splitlines()
    shown = [w for line in lines[1:] for w in line.split()[1:] if not w.startswith("(+")]
    assert lines[0].endswith("shown, by frequency mass") and len(shown) == len(set(shown))
    code, _, err = cli("w2v", "clusters", str(tmp_path / "none"))
    assert code == 2 and "not a run directory" in err
    tree = tmp_path / "tree"
    assert cli("w2v", "train", "--corpus", str(text), "--run-dir", str(tree), "--epochs", "1", "--max-tokens", "100",
               *W2V_SMALL)[0] == 0
    code, _, err = cli("w2v", "clusters", str(tree))
    assert code == 2 and "head 'tree_huffman' has no word clusters" in err


def test_negative_sampling_is_word2vecs():
    from sohsm.data.vocab import Vocabulary
    from sohsm.tasks.w2v.config import W2VConfig
    from sohsm.tasks.w2v.task import build_w2v_head
    from sohsm.train.config import HeadConfig

    head = build_w2v_head(W2VConfig(head=HeadConfig(name="pmi")), Vocabulary(["a", "b", "<unk>"], [3, 2, 0], eos=None))
    assert ((head.n_samples, head.noise_power, head.shift, head.noise_per_row, head.sparse)
            == (5, 0.75, False, True, True))
    assert float(head.weight.detach().abs().max()) == 0.0  # word2vec's output layer starts at zero


@pytest.mark.parametrize("head, path", [
    ("pmi", ["--kernel", "torch"]), ("tree_huffman", ["--kernel", "torch"]), ("pmi", ["--no-fast-path"]),
    ("tree_huffman", ["--model", "skipgram", "--update-rows", "7", "--kernel", "torch"]),
    pytest.param("tree_huffman", ["--kernel", "numba"], marks=NEEDS_NUMBA),
    pytest.param("pmi", ["--kernel", "numba"], marks=NEEDS_NUMBA),
    pytest.param("pmi", ["--kernel", "numba", "--model", "skipgram"], marks=NEEDS_NUMBA)])
def test_resume_equals_uninterrupted(cli, text, tmp_path, head, path):
    common = ["--corpus", str(text), "--head", head, "--epochs", "2", *path, *W2V_SMALL]
    code, _, err = cli("w2v", "train", *common, "--run-dir", str(tmp_path / "whole"))
    assert code == 0, err
    code, out, err = cli("w2v", "train", *common, "--run-dir", str(tmp_path / "split"), "--max-tokens", "5000")
    assert code == 0 and "row budget spent" in out, err
    code, out, err = cli("w2v", "train", "--run-dir", str(tmp_path / "split"), "--resume", "--max-tokens", "10000000",
                         "--quiet")
    assert code == 0 and "all epochs done" in out, err
    whole, split = load_vectors(tmp_path / "whole"), load_vectors(tmp_path / "split")
    assert torch.equal(whole.vectors, split.vectors)
    code, _, err = cli("w2v", "train", "--run-dir", str(tmp_path / "split"), "--resume", "--epochs", "3", "--quiet")
    assert code == 2 and "--epochs is 2 in the run, 3 requested" in err


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_export_is_readable_by_gensim(cli, text, tmp_path, fmt):
    gensim_models = pytest.importorskip("gensim.models", reason="gensim (the dev extra) reads word2vec's formats")
    run = tmp_path / "run"
    assert cli("w2v", "train", "--corpus", str(text), "--run-dir", str(run), "--epochs", "1", *W2V_SMALL)[0] == 0
    out_file = tmp_path / f"vectors.{fmt}"
    code, out, err = cli("w2v", "export", str(run), "--format", fmt, "--out", str(out_file))
    assert code == 0 and "48 words x 16" in out, err
    kv = gensim_models.KeyedVectors.load_word2vec_format(str(out_file), binary=fmt == "binary")
    vectors = load_vectors(run)
    assert list(kv.index_to_key) == vectors.words
    np.testing.assert_allclose(kv.vectors, vectors.vectors.numpy(), rtol=1e-5 if fmt == "text" else 0, atol=1e-7)
    assert kv.most_similar("red0", topn=3)[0][0] == (cli("w2v", "neighbours", str(run), "red0", "--top", "1")[1]
                                                      .split(": ")[1].split()[0])


def test_eval_reports_analogies_and_similarity(cli, text, tmp_path):
    run = tmp_path / "run"
    assert cli("w2v", "train", "--corpus", str(text), "--run-dir", str(run), "--epochs", "1", *W2V_SMALL)[0] == 0
    analogies = tmp_path / "q.txt"
    analogies.write_text(": topics\nred0 red1 cat0 cat1\nred0 red1 car0 nope\n", encoding="utf-8")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("# a comment\nred0\tred1\t9\nred0\tcar1\t1\ncat0\tcat2\t8\nsun1\tred3\t2\nred0\tnope\t5\n",
                     encoding="utf-8")
    code, out, err = cli("w2v", "eval", str(run), "--analogies", str(analogies), "--similarity", str(pairs),
                         "--sections")
    assert code == 0, err
    assert "of 1 questions in the vocabulary; coverage 50.0% of 2" in out
    assert "(4 of 5 pairs in the vocabulary)" in out and "topics" in out


def test_the_summarys_evaluate_hint_runs_as_printed_or_says_where_the_files_are(cli, text, tmp_path, monkeypatch):
    run = tmp_path / "run"
    code, out, err = cli("w2v", "train", "--corpus", str(text), "--run-dir", str(run), "--epochs", "1",
                         "--max-tokens", "100", *W2V_SMALL)
    assert code == 0, err
    (hint,) = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("evaluate ")]
    if w2v_cli.eval_file("questions-words.txt") is not None:
        program, *argv = shlex.split(hint, comments=True)  # as a shell reads it
        code, out, err = cli(*argv)
        assert program == "sohsm" and code == 0 and "analogies " in out and "similarity " in out, err
    monkeypatch.setattr(w2v_cli, "eval_file", lambda name: None)  # no gensim: the hint says it needs the extra
    assert w2v_cli._eval_hint(str(run)).endswith("   # needs the w2v extra: pip install 'sohsm[w2v]' (its gensim "
                                                 "ships word2vec's files)")
    code, _, err = cli("w2v", "eval", str(run), "--analogies", "questions-words.txt")
    assert code == 2 and ("questions-words.txt comes with the w2v extra (pip install 'sohsm[w2v]': its gensim ships "
                          "it, in gensim/test/test_data/)") in err, err


@pytest.mark.parametrize("argv, message", [
    (["neighbours", "{run}", "zebra"], "'zebra' is not in the vocabulary"),
    (["eval", "{run}"], "give --analogies FILE, --similarity FILE or both"),
    (["eval", "{run}", "--analogies", "missing.txt"], "--analogies: no file missing.txt"),
    (["export", "{run}", "--out", "no/such/folder/v.txt"], "folder no/such/folder does not exist"),
    (["export", "nowhere"], "nowhere is not a run directory"),
])
def test_bad_input_is_one_line_and_nonzero(cli, text, tmp_path, argv, message):
    run = tmp_path / "run"
    assert cli("w2v", "train", "--corpus", str(text), "--run-dir", str(run), "--epochs", "1", "--max-tokens", "100",
               *W2V_SMALL)[0] == 0
    code, out, err = cli("w2v", *[a.replace("{run}", str(run)) for a in argv])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_bad_training_settings_are_refused_before_anything_is_written(cli, text, tmp_path):
    run = tmp_path / "run"
    code, _, err = cli("w2v", "train", "--corpus", str(text), "--run-dir", str(run), "--window", "0", *W2V_SMALL[4:])
    assert code == 2 and "--window must be >= 1, got 0" in err
    code, _, err = cli("w2v", "train", "--run-dir", str(run), "--head", "tree_huffman")
    assert code == 2 and "a new run needs --corpus" in err
    assert not run.exists()


def test_train_flags_are_the_configs_fields_with_their_defaults_and_the_earlier_names():
    from sohsm.cli.config_flags import config_flags
    from sohsm.cli.main import build_parser
    from sohsm.tasks.w2v import W2VConfig

    names = {f.option for f in config_flags(W2VConfig)}
    for old in ("--corpus", "--data-dir", "--min-count", "--sample", "--text-mode", "--eval-rows", "--model", "--dim",
                "--window", "--head", "--head-option", "--update-every", "--lr", "--row-cap", "--batch-words",
                "--epochs", "--max-tokens", "--time-budget", "--eval-every", "--checkpoint-every", "--log-every",
                "--seed", "--device"):
        assert old in names, old
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["w2v"]._subparsers._group_actions[0].choices["train"]
    text = " ".join(sub.format_help().split())
    default = W2VConfig()
    for path in ("batch_words", "epochs", "model.dim", "model.window", "data.min_count", "row_cap", "head.name",
                 "model.architecture"):
        assert f"(default: {default.get(path)})" in text, path
    assert "--config FILE" in text


def test_train_from_a_config_file_with_flags_overriding_it(cli, text, tmp_path):
    config = tmp_path / "w2v.yaml"
    config.write_text(f"task: w2v\ndata:\n  corpus: {text}\n  min_count: 2\n  text_mode: running\n  eval_rows: 200\n"
                      "model:\n  dim: 8\n  window: 2\nhead:\n  name: pmi\nbatch_words: 200\nepochs: 3\n",
                      encoding="utf-8")
    run = tmp_path / "run"
    code, out, err = cli("w2v", "train", "--config", str(config), "--epochs", "1", "--dim", "12", "--run-dir", str(run),
                         "--quiet")
    assert code == 0 and "all epochs done" in out, err
    from sohsm.train.loading import load_run

    loaded = load_run(run, "last", task="w2v")
    assert (loaded.config.epochs, loaded.config.model.dim, loaded.config.model.window) == (1, 12, 2)
    assert loaded.config.head.name == "pmi" and load_vectors(run).vectors.shape == (48, 12)
    code, _, err = cli("w2v", "train", "--corpus", str(text), "--clip", "1", "--run-dir", str(tmp_path / "clip"),
                       *W2V_SMALL)
    assert code == 2 and "--clip must be None for word vectors" in err and not (tmp_path / "clip").exists()


@pytest.mark.parametrize("head, argv, says", [
    ("tree_huffman", ["--kernel", "torch"], "updated by hand, 64 rows at a time"),
    ("pmi", ["--update-rows", "16", "--kernel", "torch"], "updated by hand, 16 rows at a time"),
    pytest.param("tree_huffman", [], "updated by a compiled word2vec loop (numba)", marks=NEEDS_NUMBA),
    pytest.param("pmi", ["--kernel", "numba"], "updated by a compiled word2vec loop (numba)", marks=NEEDS_NUMBA),
    ("tree_huffman", ["--no-fast-path"], "updated through autograd"),
    ("self_organized", [], "updated through autograd"),  # no hand-written step for it: the generic path
])
def test_the_plan_says_which_path_trains(cli, text, tmp_path, head, argv, says):
    small = [a for a in W2V_SMALL if a != "--quiet"]
    code, out, err = cli("w2v", "train", "--corpus", str(text), "--head", head, "--run-dir", str(tmp_path / "run"),
                         "--epochs", "1", "--max-tokens", "300", *argv, *small)
    assert code == 0 and says in out + err, out + err


def test_without_numba_auto_takes_the_torch_loop_and_says_how_to_get_the_compiled_one(cli, text, tmp_path,
                                                                                       monkeypatch):
    import sohsm.tasks.w2v.task as task_module

    monkeypatch.setattr(task_module, "numba_available", lambda: False)
    small = [a for a in W2V_SMALL if a != "--quiet"]
    common = ["w2v", "train", "--corpus", str(text), "--epochs", "1", "--max-tokens", "300", *small]
    code, out, err = cli(*common, "--run-dir", str(tmp_path / "auto"))
    assert code == 0 and "updated by hand, 64 rows at a time, in torch (pip install 'sohsm[w2v]' makes it faster" \
        in out + err, out + err
    code, out, err = cli(*common, "--run-dir", str(tmp_path / "numba"), "--kernel", "numba")
    assert code == 2 and "kernel is 'numba' but numba cannot be imported: pip install 'sohsm[w2v]'" in err, err
    assert not (tmp_path / "numba" / "last.pt").exists()


def test_a_diverging_hand_written_step_stops_the_run_without_a_checkpoint(cli, text, tmp_path):
    run = tmp_path / "run"
    code, _, err = cli("w2v", "train", "--corpus", str(text), "--run-dir", str(run), "--epochs", "1", "--lr", "1e30",
                       "--update-row-cap", "None", *W2V_SMALL)
    assert code == 2 and "training diverged at step" in err and "the loss is nan" in err, err
    assert "a lower learning rate (--lr 1e+29, a tenth of this run's) in another run directory" in err, err
    assert "--clip" not in err  # word vectors take none
    assert not (run / "last.pt").exists()


@NEEDS_NUMBA
def test_compiling_the_numba_loops_is_left_out_of_the_speed_and_said_apart(cli, text, tmp_path, monkeypatch):
    """The loops compiled (or loaded from Numba's cache) in a session's first step are not training time: the
    summary's rows/s is the training's, as the estimate's and the bar's are, and the compiling is named apart."""
    import sohsm.tasks.w2v.kernel as kernel

    monkeypatch.setattr(kernel, "_compiled", None)  # as in a fresh process: the first step compiles (or loads)
    monkeypatch.setattr(kernel, "_compiled_windows", None)
    code, out, err = cli("w2v", "train", "--corpus", str(text), "--head", "tree_huffman", "--run-dir",
                         str(tmp_path / "run"), "--epochs", "1", *W2V_SMALL)
    assert code == 0, err
    line = out.splitlines()[0]
    assert " s compiling (Numba's word2vec loops, cached on disk for the next run; not counted)" in line, line
    assert kernel.compilations() >= 2


def test_the_start_up_line_counts_the_vocabulary_as_the_signature_and_the_export_do(cli, text, tmp_path):
    """48 words are trained and exported; the signature's vocab counts <unk> too (49), and the header says both."""
    run = tmp_path / "run"
    small = [a for a in W2V_SMALL if a != "--quiet"]
    code, out, err = cli("w2v", "train", "--corpus", str(text), "--run-dir", str(run), "--epochs", "1", "--max-tokens",
                         "100", *small)
    assert code == 0, err
    assert "topics: 48 words (vocab 49 with <unk>, which is neither trained nor exported; min_count 2)" in err, err
    assert "|vocab:49|" in out
    assert len(load_vectors(run)) == 48
