"""The HTTP API's request bodies (pydantic: validation, 422s naming the field, the OpenAPI document).
Limits (sentences, tokens, bytes) are the app's to check: they are 413s, not 422s."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictFloat, StrictInt, StrictStr,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

from elmo_core.errors import InputError
from elmo_core.names import ENCODINGS, OUTPUT_NAMES, POOLS
from elmo_core.whitespace import split_tokens
from elmo_core.vectors import VectorRequest

Encoding = Literal[ENCODINGS]  # type: ignore[valid-type]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 422


class EmbedRequest(_Body):
    """``{"sentences": [["The", "cat"], ...]}`` or ``{"texts": ["The cat", ...]}``, plus options."""

    sentences: list[list[StrictStr]] | None = None
    texts: list[StrictStr] | None = None
    # output, mix, gamma and pool are checked once, by the VectorRequest they make (``vectors``)
    output: StrictStr = Field("mixed", json_schema_extra={"enum": list(OUTPUT_NAMES)})
    mix: list[StrictFloat] | None = None  # the scalar mix's s before softmax, one per layer (default equal)
    gamma: StrictFloat = 1.0  # numbers only: "1" and true are refused, as every field's wrong type is
    pool: StrictStr | None = Field("none", json_schema_extra={"enum": ["none", None, *POOLS]})  # null: "none", as the library's None
    encoding: Encoding = "float"  # base64: each embedding's little-endian float32 bytes
    normalize: StrictBool = False  # each vector (per token, or pooled) scaled to unit L2 norm
    truncate: StrictBool | None = None  # cut sentences over max_sentence_tokens, not a 413 (None: --auto-truncate)

    _vectors: VectorRequest = PrivateAttr()

    @model_validator(mode="after")
    def _one_input(self) -> "EmbedRequest":
        if (self.sentences is None) == (self.texts is None):
            raise ValueError("give exactly one of 'sentences' (lists of tokens) or 'texts' (strings)")
        try:
            self._vectors = VectorRequest(self.output, None if self.mix is None else tuple(self.mix), self.gamma,
                                          pool=None if self.pool in ("none", None) else self.pool, normalize=self.normalize)
        except InputError as e:  # its message names the field: output, mix[i], gamma, pool
            raise PydanticCustomError("vectors", str(e)) from None
        return self

    @property
    def vectors(self) -> VectorRequest:
        """What each sentence's vectors become: made, and checked, once with the body."""
        return self._vectors

    def token_lists(self) -> list[list[str]]:
        return self.sentences if self.sentences is not None else [split_tokens(t) for t in self.texts or []]


class OpenAIEmbeddingRequest(_Body):
    """OpenAI's embeddings body: ``input`` a string or strings (token ids refused: ELMo reads characters)."""

    input: StrictStr | list[StrictStr]
    model: str | None = None
    encoding_format: Encoding = "float"
    dimensions: StrictInt | None = None
    user: str | None = None
    normalize: StrictBool = True  # unit-length vectors, as OpenAI's are (false: the raw mean)
    truncate: StrictBool | None = None  # as EmbedRequest's

    @field_validator("input", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise PydanticCustomError("empty_input", "must hold at least one string")
        items = value if isinstance(value, list) else [value]
        if any(isinstance(x, (int, list)) and not isinstance(x, bool) for x in items):
            raise PydanticCustomError("token_ids", "token ids are not supported: send text (ELMo reads characters)")
        return value

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class TokenizeRequest(_Body):
    """``{"texts": ["The cat", ...]}``: the tokens the model will see, with character offsets."""

    texts: list[StrictStr]
    truncate: StrictBool | None = None  # as EmbedRequest's
