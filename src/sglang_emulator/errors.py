"""Request errors, each carrying the body SGLang 0.5.23 sends for it.

Validation runs in SGLang's order, and each failure keeps SGLang's body shape:

* ``ValidationError``: FastAPI/pydantic type errors -> 400 ``{"object": "error", ...,
  "type": "Bad Request"}``;
* ``ContractError``: the ``sglang.api.v1`` schema (unknown sampling keys, wrong JSON types)
  -> 400 ``{"error": "<serde text>"}``;
* ``GenerateValueError``: a ``ValueError`` from normalisation, length checks or
  ``SamplingParams.verify`` -> 400 ``{"error": {"message": ...}}`` (also what the emulator
  answers to request features the pipeline never sends: batches, text, streaming, ``n`` > 1);
* ``ServiceError``: an ``HTTPException`` such as a full queue -> 503 ``{"object": "error", ...}``.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request rejected before generation; ``body()`` is the JSON SGLang would send."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message}}


class ValidationError(ApiError):
    """FastAPI's RequestValidationError, which SGLang turns into a 400 ErrorResponse."""

    def body(self) -> dict[str, Any]:
        return {
            "object": "error",
            "message": self.message,
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }


class ContractError(ApiError):
    """A ``sglang.api.v1`` schema violation: the body's ``error`` is a plain string."""

    def body(self) -> dict[str, Any]:
        return {"error": self.message}


class GenerateValueError(ApiError):
    """A ValueError inside ``generate_request``."""


class ServiceError(ApiError):
    """An HTTPException (e.g. queue full): ``{"object": "error", "type": "503", ...}``."""

    def body(self) -> dict[str, Any]:
        return {
            "object": "error",
            "message": self.message,
            "type": str(self.status),
            "param": None,
            "code": self.status,
        }


def unexpected(v: Any) -> str:
    """serde's ``Unexpected`` display, as the 0.5.23 contract decoder renders it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


def invalid_type(v: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {unexpected(v)}, expected {expected}")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def pydantic_error(loc: tuple[str, ...], msg: str, kind: str, value: Any) -> ValidationError:
    err = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}
    return ValidationError(str([err]))
