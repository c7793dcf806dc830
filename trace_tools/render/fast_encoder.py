"""The built-in tokenizers' own encoder: tiktoken's BPE core under a recipe's pattern and added
tokens, exactly as the `tokenizers` backend encodes, several times faster on long prompts.
`--reference` (`render.spec.RENDER_PATHS`) encodes with the backend instead."""

from __future__ import annotations

import re
import threading
import unicodedata
from pathlib import Path
from typing import Sequence

from trace_tools.ids import interned
from trace_tools.render.tokenizer_files import mergeable_ranks
from trace_tools.render.tokenizer_recipes import Recipe

_MEMO_CHARS = 16 << 20
_MEMO_ENTRIES = 1 << 16  # bounds the memo of many short pieces, whose entries outweigh their text


class FastEncoder:
    """The built-in tokenizers' encoder on tiktoken's BPE core, exactly as the `tokenizers` backend
    encodes (tested on thousands of strings) but several times faster on long prompts.

    Added tokens are split off first, on the raw text, longest match first (what `tokenizers`
    does for added tokens with `normalized=False`); each piece between them is NFC-normalised and
    byte-pair encoded with the recipe's pre-tokenizer pattern. Normalising piece by piece, not the
    whole text, keeps a combining mark after an added token from merging across it.
    """

    def __init__(self, recipe: "Recipe", ranks: Path):
        import tiktoken

        self._bpe = tiktoken.Encoding(
            f"trace-tools-{ranks.stem}",
            pat_str=recipe.pattern,
            mergeable_ranks=mergeable_ranks(ranks),
            special_tokens={},
        )
        self._nfc = recipe.nfc
        self._size = recipe.vocab_size
        self._added = {content: interned([i], self._size)[0] for content, i in recipe.added_ids().items()}
        self._added_bytes = {i: content.encode() for content, i in self._added.items()}
        self._first_added = recipe.first_added_id
        alternatives = sorted(self._added, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(token) for token in alternatives) + ")")
        self._memo: dict[str, list[int]] = {}
        self._memo_chars = 0
        self._memo_lock = threading.Lock()  # the recorder's render threads share one encoder

    def encode(self, text: str) -> list[int]:
        """Ids as the shared int objects (`ids.shared_ints`); memoised pieces are stored that way,
        so they are not converted again on every use."""
        out: list[int] = []
        for position, piece in enumerate(self._split.split(text)):
            if position % 2:
                out.append(self._added[piece])
            elif piece:
                out.extend(self._piece(piece))
        return out

    def _piece(self, piece: str) -> list[int]:
        """The ids of a text between added tokens. Replay encodes the same message bodies once per
        strategy (each cuts its texts at other places, but always at added tokens), and the same
        short pieces (role headers, newlines between turns) thousands of times, so pieces are
        memoised, up to `_MEMO_CHARS` characters and `_MEMO_ENTRIES` pieces in all."""
        ids = self._memo.get(piece)
        if ids is None:
            ids = self._bpe_piece(piece)
            with self._memo_lock:
                if self._memo.setdefault(piece, ids) is ids:
                    self._memo_chars += len(piece)
                while self._memo_chars > _MEMO_CHARS or len(self._memo) > _MEMO_ENTRIES:  # oldest first
                    oldest = next(iter(self._memo))
                    del self._memo[oldest]
                    self._memo_chars -= len(oldest)
        return ids

    def _bpe_piece(self, piece: str) -> list[int]:
        return interned(
            self._bpe.encode_ordinary(unicodedata.normalize("NFC", piece) if self._nfc else piece), self._size
        )

    def decode(self, ids: Sequence[int]) -> str | None:
        """The backend's decode (byte-level bytes of every token, joined, invalid UTF-8 replaced);
        None for an id outside the vocabulary, which the backend handles its own way."""
        out, run = bytearray(), []
        for token_id in ids:
            if 0 <= token_id < self._first_added:
                run.append(token_id)
                continue
            added = self._added_bytes.get(token_id)
            if added is None:
                return None
            out += self._bpe.decode_bytes(run) + added
            run = []
        out += self._bpe.decode_bytes(run)
        return out.decode("utf-8", errors="replace")
