"""The HTTP API's request bodies (pydantic: validation, 422s naming the field, the OpenAPI document).

``POST /embed`` takes tokenized ``sentences`` or whitespace-split ``texts``; ``POST /v1/embeddings``
takes OpenAI's body. Limits (sentences, tokens, bytes) are checked by the app, not here: they are
413s, not 422s.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, FiniteFloat, StrictBool, StrictStr, model_validator

from elmo_core.names import ENCODINGS, OUTPUT_MODES, POOLS
from elmo_core.whitespace import split_tokens

Output = Literal[OUTPUT_MODES]  # type: ignore[valid-type]
Pool = Literal[("none",) + POOLS]  # type: ignore[valid-type]
Encoding = Literal[ENCODINGS]  # type: ignore[valid-type]


class EmbedRequest(BaseModel):
    """``{"sentences": [["The", "cat"], ...]}`` or ``{"texts": ["The cat", ...]}``, plus options."""

    model_config = ConfigDict(extra="forbid")

    sentences: list[list[StrictStr]] | None = None
    texts: list[StrictStr] | None = None
    output: Output = "mixed"
    mix: list[FiniteFloat] | None = None  # the scalar mix's s before softmax, one per layer (default equal)
    gamma: FiniteFloat = 1.0
    pool: Pool = "none"
    encoding: Encoding = "float"  # base64: each embedding's little-endian float32 bytes
    normalize: StrictBool = False  # each vector (per token, or pooled) scaled to unit L2 norm

    @model_validator(mode="after")
    def _one_input(self) -> "EmbedRequest":
        if (self.sentences is None) == (self.texts is None):
            raise ValueError("give exactly one of 'sentences' (lists of tokens) or 'texts' (strings)")
        return self

    def token_lists(self) -> list[list[str]]:
        return self.sentences if self.sentences is not None else [split_tokens(t) for t in self.texts or []]


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI's embeddings body: ``input`` a string or a list of strings (token-id inputs are
    refused: ELMo reads characters)."""

    model_config = ConfigDict(extra="forbid")

    input: StrictStr | list[StrictStr]
    model: str | None = None
    encoding_format: Encoding = "float"
    dimensions: int | None = None
    user: str | None = None
    normalize: StrictBool = True  # unit-length vectors, as OpenAI's are (false: the raw mean)

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
