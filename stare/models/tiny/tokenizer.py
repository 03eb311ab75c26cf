"""The tiny model's character-level tokenizer over a task's alphabet (plus <pad>, <eos>, <unk>)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stare.models.tiny.spec import EOS, PAD, UNK

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def build_tokenizer(corpus: Sequence[str], whole_tokens: Sequence[str] = ()) -> PreTrainedTokenizerBase:
    """A character-level tokenizer over the characters of `corpus`, plus <pad>, <eos>, <unk>.

    Ids: <pad>=0, <eos>=1, <unk>=2, then the corpus characters in sorted order, then
    `whole_tokens` (strings that encode as one token wherever they occur, and decode as written,
    also with `skip_special_tokens=True`). Decoding fuses characters without spaces, so
    `decode(encode(s)) == s` for any string over the alphabet.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted({c for text in corpus for c in text})
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([PAD, EOS, UNK])
    if whole_tokens:
        tok.add_tokens(list(whole_tokens))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=1024,
    )
