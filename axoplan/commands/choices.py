"""Choices shared by the executor's commands (`run`, `probe`)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Device", "Dtype"]


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Dtype(StrEnum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
