from __future__ import annotations

from pathlib import Path

import pytest

from predictors.config import ConfigError, ModelConfig, VersionPolicy, load_config


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (VersionPolicy(), [7]),
        (VersionPolicy(latest=2), [3, 7]),
        (VersionPolicy(all=True), [1, 3, 7]),
        (VersionPolicy(specific=[3, 1]), [1, 3]),
    ],
)
def test_version_policy(policy: VersionPolicy, expected: list[int]) -> None:
    assert policy.select([7, 1, 3]) == expected


def test_version_policy_errors() -> None:
    with pytest.raises(ValueError, match="missing versions \\[9\\]"):
        VersionPolicy(specific=[9]).select([1])
    with pytest.raises(ValueError, match="one of"):
        VersionPolicy(latest=1, all=True)


def test_missing_config_means_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path) == ModelConfig()


def test_json_config_and_validation(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"max_batch_size": 8, "dynamic_batching": {}}')
    assert load_config(tmp_path).max_batch_size == 8
    (tmp_path / "config.json").write_text('{"dynamic_batching": {}}')
    with pytest.raises(ConfigError, match="dynamic_batching needs max_batch_size"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text('{"max_batch_sise": 8}')
    with pytest.raises(ConfigError, match="max_batch_sise"):
        load_config(tmp_path)


def test_name_must_match_folder(tmp_path: Path) -> None:
    folder = tmp_path / "alpha"
    folder.mkdir()
    (folder / "config.yaml").write_text("name: beta\n")
    with pytest.raises(ConfigError, match="differs from folder 'alpha'"):
        load_config(folder)
