"""Subword vocabularies: a byte-level BPE trained on a corpus's training split, or a tokenizer file of your own.

``load_corpus(..., tokenizer="bpe:8000")`` trains a byte-level BPE of 8,000 tokens (the ``tokenizers``
library with GPT-2's byte alphabet, so that every text has a spelling and nothing is unknown;
``pip install 'sohsm[hf]'``) on the training split; ``tokenizer="path/tokenizer.json"`` reads one. The
corpus is then read as subword tokens:

* **The text the tokenizer reads.** A corpus of lines (PTB, WikiText, your text in ``lines`` mode): each
  line's whitespace-separated words joined by single spaces, then the special token ``<eos>``, as a word
  vocabulary has one after every line. The tokenizer puts a space before the first word, so that a word is
  cut the same way at the start of a line as inside it. Running text (text8): its words joined by single
  spaces, read in pieces cut between words.
* **Special tokens.** ``<unk>`` and ``<eos>`` (a tokenizer file that lacks one gets it added). PTB and
  WikiText write ``<unk>`` in their text: it is one token, which takes the space before it along
  (``lstrip``) and gives it back when decoded.
* **Ids.** The tokenizer's tokens sorted by their count in the tokenized training split, ties by the
  tokenizer's own id, tokens never seen there last with count 0: low ids are frequent, as the heads expect
  of a word vocabulary. :attr:`~sohsm.data.vocab.Vocabulary.itos` holds the tokens as the tokenizer writes
  them (``Ġthe``), so a token's id in the tokenizer follows from its string.

``import sohsm`` and the command line's help never import ``tokenizers``: it is imported when a subword
vocabulary is first made or read.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sohsm.atomic_writes import write_atomic_text
from sohsm.data.errors import DataError, DataFieldError
from sohsm.data.vocab import EOS, UNK, Vocabulary, ordered_vocabulary
from sohsm.fields import has

if TYPE_CHECKING:  # imported where arrays are made: a config that names a tokenizer is checked without it
    import numpy as np

#: where a subword run keeps its tokenizer, beside ``vocab.json``
TOKENIZER_FILE = "tokenizer.json"
#: what installs the ``tokenizers`` library
INSTALL_HINT = "pip install 'sohsm[hf]'"
#: the special tokens every subword vocabulary has
SPECIAL_TOKENS = (UNK, EOS)
#: the smallest byte-level BPE: the 256 bytes and the special tokens
MIN_BPE_SIZE = 256 + len(SPECIAL_TOKENS)

_BPE = re.compile(r"bpe:(.*)")


def _tokenizers() -> Any:
    """The ``tokenizers`` module, or a one-line error saying how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise ValueError(f"subword vocabularies need the tokenizers library: {INSTALL_HINT}") from None
    return tokenizers


def tokenizers_version() -> str:
    """The release of ``tokenizers`` (a BPE trained by another may cut text otherwise)."""
    return _tokenizers().__version__


def bpe_size(value: str) -> int | None:
    """SIZE of a ``bpe:SIZE`` tokenizer value; ``None`` for any other value (a tokenizer file's path).

    Raises:
        DataFieldError: a ``bpe:`` value whose SIZE is not an integer >= :data:`MIN_BPE_SIZE`.
    """
    match = _BPE.fullmatch(value)
    if match is None:
        return None
    size = match.group(1)
    if not size.isdigit() or int(size) < MIN_BPE_SIZE:
        raise DataFieldError(f"{{}}: SIZE must be an integer >= {MIN_BPE_SIZE} (the 256 bytes and {UNK}, {EOS})",
                             has("tokenizer", value))
    return int(size)


def tokenizer_file(value: str) -> Path:
    """The file a tokenizer value that is not ``bpe:SIZE`` names.

    Raises:
        DataFieldError: no such file.
    """
    path = Path(value).expanduser()
    if not path.is_file():
        raise DataFieldError("{} is neither bpe:SIZE (a byte-level BPE trained on the training split), llama3 or "
                             "o200k (a packaged tokenizer) nor an existing tokenizer file (a tokenizer.json)",
                             has("tokenizer", value))
    return path


def packaged_name(value: str) -> str | None:
    """``value`` when it names a packaged tokenizer (``llama3``, ``o200k``); ``None`` otherwise."""
    from sohsm.data.packaged_tokenizers import PACKAGED

    return value if value in PACKAGED else None


def _packaged_record(path: str | os.PathLike[str]) -> str | None:
    """The text of ``path`` when it is the ``tokenizer.json`` a packaged tokenizer's run keeps; else ``None``."""
    from sohsm.data.packaged_tokenizers import FORMAT

    try:
        with open(path, encoding="utf-8") as file:
            head = file.read(4096)
    except (OSError, UnicodeDecodeError):
        return None
    return head if f'"format": "{FORMAT}"' in head and len(head) < 4096 else None


class Subwords:
    """A tokenizer that cuts text into subword tokens: a ``tokenizers.Tokenizer`` with ``<unk>`` and ``<eos>``.

    Make one with :meth:`train_bpe` or :meth:`from_file`.

    Attributes:
        tokenizer: the ``tokenizers.Tokenizer``.
        digest: the first 16 hex digits of the sha256 of its JSON, what the corpus cache and a run's
            signature know it by.
    """

    def __init__(self, tokenizer: Any) -> None:
        tk = _tokenizers()
        missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            tokenizer.add_special_tokens([tk.AddedToken(t, special=True, lstrip=t == UNK) for t in missing])
        self.tokenizer = tokenizer
        self.json: str = tokenizer.to_str()
        self.digest: str = hashlib.sha256(self.json.encode("utf-8")).hexdigest()[:16]
        self._ids: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
        self._added: dict[int, Any] = tokenizer.get_added_tokens_decoder()

    def __repr__(self) -> str:
        return f"Subwords(size={len(self._ids)}, digest={self.digest!r})"

    def __len__(self) -> int:
        return len(self._ids)

    # -- making one -------------------------------------------------------------------
    @classmethod
    def train_bpe(cls, texts: Iterable[str], size: int) -> Subwords:
        """A byte-level BPE of at most ``size`` tokens (fewer where ``texts`` has too few pairs to merge), the
        256 bytes and :data:`SPECIAL_TOKENS` included, learnt from ``texts``.

        Raises:
            ValueError: ``size`` below :data:`MIN_BPE_SIZE`, or ``tokenizers`` missing.
        """
        if size < MIN_BPE_SIZE:
            raise ValueError(f"a byte-level BPE needs at least {MIN_BPE_SIZE} tokens, got {size}")
        tk = _tokenizers()
        tokenizer = tk.Tokenizer(tk.models.BPE())
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=True)
        tokenizer.decoder = tk.decoders.ByteLevel()
        specials = [tk.AddedToken(t, special=True, lstrip=t == UNK) for t in SPECIAL_TOKENS]
        trainer = tk.trainers.BpeTrainer(vocab_size=size, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                         special_tokens=specials, show_progress=False)
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Subwords:
        """Read a ``tokenizer.json`` (``<unk>`` or ``<eos>`` added where it lacks them); the one a run of a
        packaged tokenizer keeps gives that tokenizer (:mod:`sohsm.data.packaged_tokenizers`).

        Raises:
            DataError: the file is not a tokenizer ``tokenizers`` can read.
        """
        packaged = _packaged_record(path)
        if packaged is not None:
            from sohsm.data.packaged_tokenizers import PackagedSubwords

            return PackagedSubwords.from_json(packaged, path)  # type: ignore[return-value]  # the same face
        tk = _tokenizers()
        try:
            tokenizer = tk.Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises its own exception types
            raise DataError(f"{path}: not a tokenizer file ({str(error).splitlines()[0] if str(error) else error!r})"
                            ) from None
        return cls(tokenizer)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the tokenizer as ``tokenizer.json``, atomically (:meth:`from_file` reads it)."""
        write_atomic_text(path, self.json)

    # -- text and ids -----------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The tokenizer's ids of each text (nothing added around them: no start or end token)."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def vocabulary(self, train_ids: np.ndarray, lines: bool) -> tuple[Vocabulary, np.ndarray]:
        """The vocabulary of the tokens by their count in ``train_ids`` (the tokenizer's ids of the training
        split), and the map of the tokenizer's ids to its ids (``np.int64``, indexed by the tokenizer's id).

        ``lines``: the corpus has lines, so ``<eos>`` is the vocabulary's end-of-line token.
        """
        return ordered_vocabulary(self._ids, train_ids, lines)

    def tokens(self, text: str) -> list[str]:
        """The tokens of one line of ``text`` (vocabulary entries)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids  # its .tokens spell <unk> with its space
        return [self.tokenizer.id_to_token(i) for i in ids]

    def token_ids(self, tokens: Iterable[str]) -> list[int]:
        """The tokenizer's ids of ``tokens`` (vocabulary entries)."""
        return [self._ids[t] for t in tokens]

    def decode(self, tokens: Sequence[str]) -> str:
        """The text of ``tokens`` (vocabulary entries): the tokenizer's decoding, a new line for each ``<eos>``,
        without the space the tokenizer put before each line's first word."""
        lines: list[list[int]] = [[]]
        for token in tokens:
            if token == EOS:
                lines.append([])
            else:
                lines[-1].append(self._ids[token])
        return "\n".join(self._decode_line(ids) for ids in lines)

    def _decode_line(self, ids: list[int]) -> str:
        parts, run = [], []
        for i in ids:
            added = self._added.get(i)
            if added is None or not added.special:
                run.append(i)
                continue
            if run:
                parts.append(self.tokenizer.decode(run, skip_special_tokens=False))
                run = []
            parts.append((" " if added.lstrip else "") + added.content)
        if run:
            parts.append(self.tokenizer.decode(run, skip_special_tokens=False))
        text = "".join(parts)
        return text[1:] if text.startswith(" ") else text

    def readable(self, token: str) -> str:
        """``token`` as text (``Ġthe`` -> `` the``); a token that is part of a character's bytes stays as the
        tokenizer writes it."""
        i = self._ids.get(token)
        if i is None:
            return token
        added = self._added.get(i)
        if added is not None and added.special:
            return added.content
        text = self.tokenizer.decode([i], skip_special_tokens=False)
        return token if "\ufffd" in text else text
