"""The tokenizers of today's models, read offline: Llama 3's (128,256 tokens) and o200k's (200,019).

``load_corpus(..., tokenizer="llama3")`` (or ``"o200k"``) reads a corpus with a tokenizer whose files ship in
the ``quicktok-v1`` wheel (``pip install 'sohsm[tokenizers]'``): nothing is trained or downloaded. The output
layer then has the tokenizer's whole vocabulary as rows, as a model trained with it has, though a small corpus
uses a fraction of them. The text is read as :mod:`sohsm.data.subwords` reads it (each line's words joined by
single spaces, a space before the first; ids by count in the training split, unseen tokens last), with these
differences:

* **Every id is a row.** Token names are the tokenizer's bytes in GPT-2's byte alphabet (`` the`` is ``Ġthe``),
  special tokens by their names, ids the tokenizer leaves unassigned (o200k has 17) ``<|unused_ID|>``.
* **``<eos>`` and ``<unk>`` are rows of the tokenizer, not added ones**, so that N is the tokenizer's: its
  end-of-text token (``<|end_of_text|>``, ``<|endoftext|>``) is named ``<eos>`` and ends each line; a token no
  text produces (Llama 3's ``<|reserved_special_token_0|>``, o200k's unassigned id 199,998) is named ``<unk>``.
  Byte-level BPE has no unknown text: WikiText's literal ``<unk>`` is read as the characters it is.
* **Special tokens in the text are text**: ``<|endoftext|>`` written in a file is cut as characters.

A run keeps, as ``tokenizer.json``, a small JSON naming the tokenizer, its package's release and the digest of
its vocabulary file (:meth:`PackagedSubwords.save`); :func:`sohsm.data.subwords.Subwords.from_file` reads it
back. ``import sohsm`` never imports ``quicktok``.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sohsm.atomic_writes import write_atomic_text
from sohsm.data.errors import DataError
from sohsm.data.vocab import EOS, UNK, Vocabulary, ordered_vocabulary

if TYPE_CHECKING:
    import numpy as np

#: ``--tokenizer`` value -> (the package's encoding name, its vocabulary file, the id named ``<unk>``)
PACKAGED = {"llama3": ("llama3", "llama3.vocab", 128002), "o200k": ("o200k_base", "o200k.vocab", 199998)}
#: what installs the package that ships them
INSTALL_HINT = "pip install 'sohsm[tokenizers]'"
#: the ``format`` of the ``tokenizer.json`` a run keeps
FORMAT = "sohsm.packaged-tokenizer/1"


def _quicktok() -> Any:
    """The ``quicktok`` module, or a one-line error saying how to install it."""
    try:
        import quicktok
    except ImportError:
        raise ValueError(f"--tokenizer llama3 and o200k need the quicktok-v1 package: {INSTALL_HINT}") from None
    return quicktok


@cache
def _byte_alphabet() -> list[str]:
    """GPT-2's printable character for each byte (the names ``tokenizers`` gives byte-level tokens)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    names, extra = {}, 0
    for b in range(256):
        if b in kept:
            names[b] = chr(b)
        else:
            names[b] = chr(256 + extra)
            extra += 1
    return [names[b] for b in range(256)]


class PackagedSubwords:
    """A packaged tokenizer (:data:`PACKAGED`) with the face of :class:`~sohsm.data.subwords.Subwords`.

    Attributes:
        name: ``"llama3"`` or ``"o200k"``.
        json: what :meth:`save` writes: the name, the package's release, the vocabulary file's sha256.
        digest: the first 16 hex digits of the sha256 of ``json`` (the corpus cache's and a run's key).
    """

    def __init__(self, name: str) -> None:
        if name not in PACKAGED:
            raise ValueError(f"unknown packaged tokenizer {name!r}: one of {', '.join(PACKAGED)}")
        quicktok = _quicktok()
        encoding, vocab_file, unk_id = PACKAGED[name]
        self.name = name
        self._enc = quicktok.get_encoding(encoding)
        data = Path(quicktok.__file__).parent / "data" / vocab_file
        vocab_digest = hashlib.sha256(data.read_bytes()).hexdigest() if data.is_file() else "absent"
        self.json: str = json.dumps({"format": FORMAT, "name": name, "package": "quicktok-v1",
                                     "release": quicktok.__version__, "vocab_sha256": vocab_digest}, indent=1)
        self.digest: str = hashlib.sha256(self.json.encode("utf-8")).hexdigest()[:16]
        self._bytes: list[bytes | None] = []
        alphabet = _byte_alphabet()
        names: list[str] = []
        eot = self._enc.eot_token
        for i in range(self._enc.n_vocab):
            try:
                raw = self._enc.decode_single_token_bytes(i)
            except Exception:  # an id the tokenizer leaves unassigned
                raw = None
            special = raw is not None and self._enc.is_special_token(i)
            self._bytes.append(None if special else raw)
            if i == eot:
                names.append(EOS)
            elif i == unk_id:
                names.append(UNK)
            elif raw is None:
                names.append(f"<|unused_{i}|>")
            elif special:
                names.append(raw.decode("utf-8"))
            else:
                names.append("".join(alphabet[b] for b in raw))
        self._names = names
        self._ids: dict[str, int] = {t: i for i, t in enumerate(names)}

    def __repr__(self) -> str:
        return f"PackagedSubwords({self.name!r}, size={len(self._names)}, digest={self.digest!r})"

    def __len__(self) -> int:
        return len(self._names)

    @classmethod
    def from_json(cls, text: str, where: str | os.PathLike[str]) -> PackagedSubwords:
        """The tokenizer a run's ``tokenizer.json`` names (:meth:`save`).

        Raises:
            DataError: it names no packaged tokenizer, or one whose vocabulary file differs from the run's.
        """
        record = json.loads(text)
        if record.get("name") not in PACKAGED:
            raise DataError(f"{where}: names no packaged tokenizer ({', '.join(PACKAGED)})")
        made = cls(record["name"])
        if json.loads(made.json)["vocab_sha256"] != record.get("vocab_sha256"):
            raise DataError(f"{where}: the run's {record['name']} vocabulary file differs from the installed "
                            f"quicktok-v1 {json.loads(made.json)['release']}'s (the run had "
                            f"{record.get('release')}): install that release")
        return made

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :attr:`json` as the run's ``tokenizer.json``, atomically."""
        write_atomic_text(path, self.json)

    # -- text and ids -----------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The tokenizer's ids of each text, read with a space before it (special tokens' names are text)."""
        return [list(self._enc.encode_ordinary(" " + text)) for text in texts]

    def vocabulary(self, train_ids: np.ndarray, lines: bool) -> tuple[Vocabulary, np.ndarray]:
        """Every id of the tokenizer ordered by its count in ``train_ids``, and the map of the tokenizer's ids to
        the vocabulary's (:meth:`sohsm.data.subwords.Subwords.vocabulary`)."""
        return ordered_vocabulary(self._ids, train_ids, lines)

    def tokens(self, text: str) -> list[str]:
        """The tokens of one line of ``text`` (vocabulary entries)."""
        return [self._names[i] for i in self.encode([text])[0]]

    def token_ids(self, tokens: Iterable[str]) -> list[int]:
        """The tokenizer's ids of ``tokens`` (vocabulary entries)."""
        return [self._ids[t] for t in tokens]

    def decode(self, tokens: Sequence[str]) -> str:
        """The text of ``tokens``: a new line for each ``<eos>``, without the space put before each line."""
        lines: list[bytearray] = [bytearray()]
        for token in tokens:
            if token == EOS:
                lines.append(bytearray())
            else:
                lines[-1] += self._token_bytes(token)
        texts = (line.decode("utf-8", errors="replace") for line in lines)
        return "\n".join(t[1:] if t.startswith(" ") else t for t in texts)

    def _token_bytes(self, token: str) -> bytes:
        raw = self._bytes[self._ids[token]]
        return token.encode("utf-8") if raw is None else raw

    def readable(self, token: str) -> str:
        """``token`` as text (``Ġthe`` -> `` the``); a token that is part of a character's bytes stays a name."""
        i = self._ids.get(token)
        if i is None or self._bytes[i] is None:
            return token
        try:
            return self._bytes[i].decode("utf-8")  # type: ignore[union-attr]
        except UnicodeDecodeError:
            return token
