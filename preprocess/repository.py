"""The recipe file as a model repository: the recipes the service starts with, and what model
control reads while it runs (v2server/control.py), so that a recipe edited in the file is
reloaded with no request failed, as a predictor's model is."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from preprocess.config import RecipeFileError
from preprocess.recipes import INLINE_MAX_BYTES, Recipe, load
from protos.errors import few
from v2server.model import Scheduling, Served
from v2server.registry import Registry
from v2server.served import ServedModel


class RecipeRepository:
    """One recipe file, read again whenever its content, or that of a file it names (a
    `_file` parameter), changes. A file that cannot be read changes nothing: its last good
    recipes are still the ones it holds, and loading any of them fails with the file's
    error, so that a half-written or broken edit never unloads what serves."""

    def __init__(
        self, path: Path, workers: int = 2, max_queue: int = 256, inline_below_ms: float = 0.0
    ) -> None:
        self.path = path
        self.scheduling = Scheduling(
            instances=workers,
            max_queue=max_queue,
            inline_below_s=inline_below_ms / 1000,
            inline_max_bytes=INLINE_MAX_BYTES,
        )
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="recipe")
        """One pool of `workers` threads for every recipe, those retired by a reload too."""
        self._recipes: dict[str, Recipe] = {}
        """The last good read."""
        self._error: RecipeFileError | None = None
        """Why the file as it is now cannot be read; None when it can."""
        self._signature = b""
        self._named: list[Path] = []
        """The files the last good read's recipes name (`_file` parameters)."""

    def registry(self, only: list[str] | None = None) -> Registry:
        """The registry the service starts with: every recipe of the file, or those of
        `only` (model control's explicit mode); a file that cannot be read, or that lacks
        a recipe named, stops the start-up (exit status 2)."""

        def start() -> list[Served]:
            self._read()
            if self._error is not None:
                raise self._error
            missing = [name for name in only or () if name not in self._recipes]
            if missing:
                raise RecipeFileError(
                    f"{self.path} has no recipe {missing} (it has {few(list(self._recipes))})"
                )
            chosen = self._recipes if only is None else only
            return [ServedModel(self._recipes[name], self.pool) for name in chosen]

        return Registry(start, noun="recipe", executor=self.pool)

    # ------------------------------------------------------------ model control's Repository

    def names(self) -> list[str]:
        self._read()
        return sorted(self._recipes)

    def stamp(self, name: str) -> object:
        """The recipe's digest (its definition, the files it names by content, the image
        limits, the release); while the file cannot be read, a stamp of the broken file,
        so that each recipe's load is tried once and fails naming why."""
        self._read()
        if self._error is not None:
            return ("unreadable", self._signature)
        recipe = self._recipes.get(name)
        return recipe.digest if recipe is not None else None

    def build(self, name: str) -> list[Served]:
        self._read()
        if self._error is not None:
            raise self._error
        if name not in self._recipes:
            raise RecipeFileError(f"{self.path} has no recipe '{name}'")
        return [ServedModel(self._recipes[name], self.pool)]

    def _read(self) -> None:
        """Parse the file again if it, or a file its recipes name, changed since."""
        signature = _contents([self.path, *self._named])
        if signature == self._signature:
            return
        try:
            self._recipes = load(self.path, self.scheduling)
            self._error = None
            self._named = _named_files(self._recipes.values())
        except RecipeFileError as exc:
            self._error = exc
        self._signature = signature


def _contents(paths: list[Path]) -> bytes:
    """A digest of the files' contents (a file missing counts as such): by content, not by
    size and time, so that two edits within one tick of the file system's clock are told
    apart. The files are small: a recipe file and what its operations read."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        except OSError as exc:
            digest.update(f"missing {exc.errno}".encode())
    return digest.digest()


def _named_files(recipes: Iterable[Recipe]) -> list[Path]:
    files: set[Path] = set()
    for recipe in recipes:
        for step in recipe.config.steps:
            ((_, params),) = step.items()
            files.update(Path(v) for k, v in params.items() if k.endswith("_file"))
    return sorted(files)
