"""The `mesh` fixture lives in tests/conftest.py (the fault suite shares it)."""

from tests.conftest import Mesh

__all__ = ["Mesh"]
