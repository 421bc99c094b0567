"""Settings files (`--config FILE`): the flags' names as keys or a run's sections, and a refused key says where it
belongs."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sohsm.cli.config_file import read_config_file
from sohsm.tasks.lm import LMConfig
from sohsm.tasks.w2v import W2VConfig

#: the guide whose settings file ptb-256.yaml is checked here
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def _read(tmp_path, text: str, config_class: type = LMConfig, name: str = "s.yaml") -> dict:
    (tmp_path / name).write_text(text)
    return read_config_file(str(tmp_path / name), config_class)


def test_flat_keys_are_the_flags_names(tmp_path):
    settings = _read(tmp_path, "corpus: ptb\nhead: full\nemb_size: 64\nhidden-size: 64\n--layers: 2\n"
                               "lr: 1e-3\nclip: 0\nmax_tokens: none\nupdate_every: 7\nmodel.dropout: 0.5\n")
    assert settings == {"data.corpus": "ptb", "head.name": "full", "model.emb_size": 64, "model.hidden_size": 64,
                        "model.layers": 2, "optim.lr": 0.001, "optim.clip": None, "max_tokens": None,
                        "head.update_every": 7, "model.dropout": 0.5}


@pytest.mark.parametrize("options", ["{gamma: 2, init: frequency}", "[gamma=2, init=frequency]",
                                     "gamma=2,init=frequency"])
def test_head_options_as_a_mapping_or_as_the_flags_texts(tmp_path, options):
    assert _read(tmp_path, f"head-option: {options}\n") == {"head.options": {"gamma": 2, "init": "frequency"}}


def test_flat_and_nested_keys_mix_but_a_setting_comes_once(tmp_path):
    assert _read(tmp_path, "corpus: ptb\nmodel:\n  emb_size: 32\nepochs: 2\n") == {
        "data.corpus": "ptb", "model.emb_size": 32, "epochs": 2}
    with pytest.raises(ValueError, match=r"model.emb_size is set twice, as emb_size and as model.emb_size"):
        _read(tmp_path, "emb_size: 32\nmodel:\n  emb_size: 64\n")


def test_a_section_name_that_is_also_a_flag_reads_by_its_value(tmp_path):
    """w2v's --model is model.architecture: a text is the flag, a mapping the section."""
    assert _read(tmp_path, "model: skipgram\ndim: 50\n", W2VConfig) == {"model.architecture": "skipgram",
                                                                        "model.dim": 50}
    assert _read(tmp_path, "model:\n  dim: 50\n", W2VConfig) == {"model.dim": 50}


@pytest.mark.parametrize("text, words", [
    ("embsize: 64\n", ["unknown setting 'embsize'", "did you mean emb_size"]),
    ("data:\n  emb_size: 64\n", ["data.emb_size", "not a data setting but a model one", "emb_size: ..."]),
    ("model:\n  corpus: ptb\n", ["not a model setting but a data one", "corpus: ..."]),
    ("model:\n  epochs: 2\n", ["epochs is not a model setting", "at the top level"]),
    ("optim:\n  corpus: ptb\n", ["corpus is not an optim setting but a data one"]),
    ("data:\n  lr: 0.1\n", ["lr is not a data setting but an optim one"]),
    ("optim:\n  epochs: 2\n", ["epochs is not an optim setting"]),
    ("model:\n  hiden_size: 2\n", ["unknown setting model.hiden_size", "did you mean hidden_size"]),
    ("data: ptb\n", ["data is a section", "corpus"]),
    ("nothing_like_it: 1\n", ["unknown setting 'nothing_like_it'", "flag's name without its dashes"]),
    ("architecture: transformer\n", ["unknown setting 'architecture': did you mean model?", "--model flag",
                                      "model: {architecture: ...}"]),
])
def test_an_unknown_key_says_where_it_belongs(tmp_path, text, words):
    with pytest.raises(ValueError) as info:
        _read(tmp_path, text)
    message = str(info.value)
    assert message.startswith(f"--config {tmp_path / 's.yaml'}: ") and "\n" not in message
    for word in words:
        assert word in message, message


def test_values_are_checked_as_the_flags_values_are(tmp_path):
    with pytest.raises(ValueError, match=r"model.hidden_size must be int, got 'big'"):
        _read(tmp_path, "hidden_size: big\n")
    with pytest.raises(ValueError, match=r"model.emb_size must be >= 1, got 0"):
        _read(tmp_path, "emb_size: 0\n")


def test_the_guides_example_is_a_valid_settings_file(tmp_path):
    (example,) = re.findall(r"```yaml\n(# ptb-256.yaml.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)
    settings = _read(tmp_path, example)
    assert settings["data.corpus"] == "ptb" and settings["head.name"] == "self_organized"
    assert settings["head.options"] == {"gamma": 2, "init": "frequency"} and settings["model.emb_size"] == 256


def test_train_from_a_flat_settings_file(tmp_path, ptb_slice, small, cli):
    (tmp_path / "run.yaml").write_text(f"corpus: {ptb_slice}\nhead: two_level_frequency\nhead-option: "
                                       "{n_clusters: 7}\nmax-tokens: 2000\nlr: 0.2\n")
    code, _, err = cli("lm", "train", "--config", tmp_path / "run.yaml", "--run-dir", tmp_path / "a", *small)
    assert code == 0, err
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["head"] == {"name": "two_level_frequency", "update_every": None, "options": {"n_clusters": 7}}
    assert saved["max_tokens"] == 2000 and saved["optim"]["lr"] == 0.2 and saved["model"]["hidden_size"] == 32
    (tmp_path / "typo.yaml").write_text(f"corpus: {ptb_slice}\nhead: full\nhiden_size: 8\n")
    code, _, err = cli("lm", "train", "--config", tmp_path / "typo.yaml", "--run-dir", tmp_path / "b")
    assert code == 2 and err.startswith("sohsm lm: error: --config ") and "did you mean hidden_size" in err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("text", ["model: transformer\nhidden_size: 16\n",
                                  "model:\n  architecture: transformer\n  hidden_size: 16\n"])
def test_a_transformer_file_giving_only_its_width_takes_it_for_both(tmp_path, text):
    """A transformer has one width: a file giving hidden_size alone is checked as a new run takes it."""
    assert _read(tmp_path, text)["model.hidden_size"] == 16


def test_flags_beside_a_file_override_it_before_it_is_checked(tmp_path, ptb_slice, cli):
    (tmp_path / "tf.yaml").write_text("model: transformer\nemb_size: 512\nhidden_size: 16\nlayers: 1\n"
                                      "attention_heads: 2\nbatch_size: 4\nbptt: 8\n")
    base = ["--config", tmp_path / "tf.yaml", "--corpus", ptb_slice, "--head", "full", "--max-tokens", "64", "--quiet"]
    code, _, err = cli("lm", "train", *base, "--run-dir", tmp_path / "bad")
    assert code == 2 and err.startswith("sohsm lm: error: --config ") and "emb_size=512" in err
    assert not (tmp_path / "bad").exists()
    code, _, err = cli("lm", "train", *base, "--emb-size", "16", "--run-dir", tmp_path / "mended")
    assert code == 0, err
    model = json.loads((tmp_path / "mended" / "config.json").read_text())["model"]
    assert model["emb_size"] == model["hidden_size"] == 16
