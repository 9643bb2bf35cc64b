"""The recipe file as model control reads it (preprocess/repository.py): a recipe edited is
reloaded and answers by its new definition, the others are left alone, and a file that cannot
be read changes nothing. The real service, edited under load: tests/contract/
test_recipe_control.py."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from prometheus_client import REGISTRY

from preprocess.config import RecipeFileError
from preprocess.repository import RecipeRepository
from protos.errors import InvalidInput
from protos.version import code_digest
from v2server.control import ModelControl

GRAY = """
  {name}:
    inputs: [{{name: image, datatype: BYTES, shape: [-1]}}]
    outputs: [{{name: out, datatype: FP32, shape: [-1, 16]}}]
    steps:
      - decode: {{input: image, color: gray}}
      - resize: {{width: 4, height: 4, interpolation: area}}
      - normalize: {{scale: {scale}}}
      - stack: {{output: out, flatten: true}}
"""
CTC = """
  letters:
    inputs: [{name: logits, datatype: FP32, shape: [-1, -1, -1]}]
    outputs: [{name: text, datatype: BYTES, shape: [-1]}]
    steps:
      - ocr_ctc_decode: {characters_file: chars.txt}
"""


def write(path: Path, *, scale: float = 1.0, other: float = 1.0, extra: str = "") -> None:
    recipes = GRAY.format(name="gray", scale=scale) + GRAY.format(name="other", scale=other)
    path.write_text("recipes:" + recipes + extra)


def put(path: Path, text: str) -> None:
    path.write_text(text)


def image(level: int = 100) -> np.ndarray:
    """One PNG of a uniform grey, as a BYTES batch of one."""
    ok, png = cv2.imencode(".png", np.full((8, 8), level, np.uint8))
    assert ok
    batch = np.empty(1, dtype=object)
    batch[0] = png.tobytes()
    return batch


@pytest.fixture
def path(tmp_path: Path) -> Path:
    write(tmp_path / "recipes.yaml")
    return tmp_path / "recipes.yaml"


def test_a_stamp_changes_with_what_decides_the_recipes_answers(path: Path) -> None:
    (path.parent / "chars.txt").write_text("a\nb\n")
    write(path, extra=CTC)
    repo = RecipeRepository(path)
    assert repo.names() == ["gray", "letters", "other"]
    before = {name: repo.stamp(name) for name in repo.names()}

    write(path, scale=2.0, extra=CTC)  # one recipe edited
    assert repo.stamp("gray") != before["gray"]
    assert repo.stamp("other") == before["other"] and repo.stamp("letters") == before["letters"]

    (path.parent / "chars.txt").write_text("a\nc\n")  # a file a recipe names, by content
    assert repo.stamp("letters") != before["letters"]
    assert repo.stamp("other") == before["other"]

    limits = "limits: {max_pixels: 1000}\n"  # the image limits count for every recipe
    path.write_text(limits + path.read_text())
    assert all(repo.stamp(name) != before[name] for name in ("gray", "other"))


def test_a_stamp_changes_with_the_operations_code(path: Path, monkeypatch) -> None:
    """An upgrade that changes how images are read moves every recipe's stamp (and with it
    the proxy's cache keys), though the package's version stays the same."""
    from preprocess import recipes

    names = {source.name for source in recipes.CODE_SOURCES}
    assert {"images.py", "ops.py", "ocr.py", "media.py"} <= names
    copies = []
    for source in recipes.CODE_SOURCES[:2]:
        copy = path.parent / source.name
        copy.write_bytes(source.read_bytes())
        copies.append(copy)
    assert code_digest(tuple(copies)) == code_digest(recipes.CODE_SOURCES[:2])
    before = RecipeRepository(path).stamp("gray")
    copies[0].write_bytes(copies[0].read_bytes() + b"# one line more\n")
    monkeypatch.setattr(recipes, "CODE", code_digest(tuple(copies)))
    assert RecipeRepository(path).stamp("gray") != before


def test_a_file_that_cannot_be_read_keeps_its_recipes_and_fails_their_loads(path: Path) -> None:
    repo = RecipeRepository(path)
    good = repo.stamp("gray")
    path.write_text("recipes:\n  gray: [half written")
    assert repo.names() == ["gray", "other"], "nothing is unloaded by a broken edit"
    broken = repo.stamp("gray")
    assert broken != good and repo.stamp("other") == broken
    with pytest.raises(RecipeFileError, match=r"recipes\.yaml"):
        repo.build("gray")
    path.unlink()  # and the file gone altogether
    assert repo.names() == ["gray", "other"] and repo.stamp("gray") not in (good, broken)


def test_the_registry_refuses_a_recipe_the_file_lacks(path: Path) -> None:
    with pytest.raises(RecipeFileError, match=r"has no recipe \['nope'\] \(it has gray, other\)"):
        RecipeRepository(path).registry(["gray", "nope"])._load()


async def test_poll_mode_reloads_an_edited_recipe_and_survives_a_broken_file(path: Path) -> None:
    repo = RecipeRepository(path, workers=1)
    registry = repo.registry()
    await registry.start()
    control = ModelControl(registry, repo, "poll", linger_s=0.01, grace_s=5)
    await control.start()

    async def out(name: str = "gray") -> float:
        return float((await registry.resolve(name).infer({"image": image()}, None))["out"][0, 0])

    def failing(name: str) -> float | None:
        return REGISTRY.get_sample_value("v2_model_load_failing", {"model": name})

    try:
        assert await out() == 100.0
        other = registry.resolve("other")
        write(path, scale=2.0)
        await control.rescan()
        assert await out() == 200.0, "the edited recipe, at once"
        assert registry.resolve("other") is other, "an unchanged recipe is left alone"

        put(path, "recipes: {gray: {steps: []}}")  # invalid: every load fails, named
        await control.rescan()
        assert await out() == 200.0 and await out("other") == 100.0
        assert failing("gray") == 1 and failing("other") == 1

        write(path, scale=3.0, extra=GRAY.format(name="third", scale=0.5))
        await control.rescan()
        assert await out() == 300.0 and await out("third") == 50.0
        assert failing("gray") == 0

        write(path, scale=3.0)  # a recipe taken out of the file is unloaded
        await control.rescan()
        assert registry.names() == ["gray", "other"]
    finally:
        await control.stop()
        await registry.stop()


async def test_explicit_mode_says_why_a_load_fails(path: Path) -> None:
    repo = RecipeRepository(path, workers=1)
    registry = repo.registry(["gray"])
    await registry.start()
    control = ModelControl(registry, repo, "explicit", linger_s=0.01)
    await control.start()
    try:
        assert registry.names() == ["gray"] and control.reasons == {"other": "not loaded"}
        await control.load("other")
        assert registry.names() == ["gray", "other"]
        put(path, "recipes: [")
        with pytest.raises(InvalidInput, match=r"(?s)recipes\.yaml.*still serving version\(s\) 1"):
            await control.load("gray")
        await control.unload("other")
        assert registry.names() == ["gray"]
    finally:
        await control.stop()
        await registry.stop()
