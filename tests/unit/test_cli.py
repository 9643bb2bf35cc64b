"""A command line or variable that does not fit: each problem named, exit status 2, not a
traceback (protos/cli.py), for every service's and the proxy's settings."""

from __future__ import annotations

import pytest

from predictors.settings import PredictorSettings
from preprocess.settings import PreprocessSettings
from protos.cli import joined, settings_from
from protos.errors import few
from proxy.settings import ProxySettings


@pytest.mark.parametrize(
    ("cls", "argv", "environ", "says"),
    [
        (
            PredictorSettings,
            ["--model-control-mode", "sometimes"],
            {},
            "invalid setting --model-control-mode (PREDICTOR_MODEL_CONTROL_MODE): Input should "
            "be 'none', 'explicit' or 'poll' (given 'sometimes')",
        ),
        (
            PredictorSettings,
            ["--load-model", "digits_mlp"],
            {},
            "invalid settings: --load-model names the models loaded at start in explicit mode",
        ),
        (
            PreprocessSettings,
            ["--load-model", "digits_input"],
            {"PREPROCESS_MODEL_CONTROL_MODE": "poll"},
            "invalid settings: --load-model names the models loaded at start in explicit mode; "
            "with --model-control-mode poll every model is loaded",
        ),
        (
            PreprocessSettings,
            [],
            {"PREPROCESS_WORKERS": "four"},
            "invalid setting --workers (PREPROCESS_WORKERS): Input should be a valid integer",
        ),
        (
            ProxySettings,
            ["--cache-check-ms", "0"],
            {},
            "invalid setting --cache-check-ms (PROXY_CACHE_CHECK_MS): Input should be greater "
            "than 0 (given '0')",
        ),
    ],
)
def test_a_setting_that_does_not_fit_is_named_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, cls, argv, environ, says
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        settings_from(cls, argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "value",
    ["redis://mesh:s3cret@cache:6379/0?maxlen=lots", "amqp://mesh:s3cret@queue:5672/"],
)
def test_a_setting_that_does_not_fit_is_named_without_the_password_in_it(
    capsys: pytest.CaptureFixture, value: str
) -> None:
    """Start-up errors reach logs others read: an address's password is not printed there
    (pydantic's error carried the value as given)."""
    with pytest.raises(SystemExit):
        settings_from(ProxySettings, ["--prediction-log", value])
    err = capsys.readouterr().err
    assert "invalid setting --prediction-log (PROXY_PREDICTION_LOG)" in err, err
    assert "s3cret" not in err and "mesh:" not in err, err
    assert "***@" in err


def test_settings_that_fit_are_read() -> None:
    settings = settings_from(
        PredictorSettings, ["--model-control-mode", "explicit", "--load-model", "*"]
    )
    assert settings.loaded_at_start() is None  # every model
    assert settings_from(PredictorSettings, []).model_control_mode == "none"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--load-model", "a", "--port", "1", "--load-model=b"],
            ["--port", "1", "--load-model", "a,b"],
        ),
        (["--port", "1"], ["--port", "1"]),
        (["--load-model", "*"], ["--load-model", "*"]),
    ],
)
def test_a_repeated_load_model_loads_every_one_named(argv: list[str], expected: list[str]) -> None:
    """Triton's command lines repeat --load-model; read once, only the last was loaded."""
    assert joined(argv, "--load-model") == expected


def test_a_long_list_is_named_in_part() -> None:
    assert few([f"m{i}" for i in range(3)]) == "m0, m1, m2"
    assert few([f"m{i}" for i in range(25)], most=2) == "m0, m1 and 23 more"
