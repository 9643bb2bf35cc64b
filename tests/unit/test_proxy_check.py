"""`python -m proxy --check true`: the pipeline file checked against the environment as a
start would check it, and nothing started: each pipeline's calls listed, or the problem named
with exit status 2 (a pipelines ConfigMap checked in CI before it rolls out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.__main__ import main

ENDPOINTS = {
    "PREPROCESS_URL": "preprocess:8002",
    "PREDICTOR_DIGITS_LOGREG_URL": "digits-logreg:8101",
    "PREDICTOR_DIGITS_MLP_URL": "dns:///digits-mlp:8102",
    "PREDICTOR_OCR_DET_URL": "ocr-det:8111",
    "PREDICTOR_OCR_CLS_URL": "ocr-cls:8112",
    "PREDICTOR_OCR_REC_URL": "ocr-rec:8113/ocr_rec/2",
}


@pytest.fixture
def endpoints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # anything the check wrote would land here
    for name, value in ENDPOINTS.items():
        monkeypatch.setenv(name, value)


def test_the_shipped_pipelines_list_every_call(endpoints, capsys, tmp_path: Path) -> None:
    assert main(["--check", "true", "--port", "1"]) == 0  # port 1: never bound
    out = capsys.readouterr().out.splitlines()
    digits = out[out.index("digits:") + 1 : out.index("digits-partial:")]
    assert digits == [
        "  preprocess: digits_input at preprocess:8002 (PREPROCESS_URL)",
        "  ensemble/logreg: digits_logreg at digits-logreg:8101 (PREDICTOR_DIGITS_LOGREG_URL)",
        "  ensemble/mlp: digits_mlp at dns:///digits-mlp:8102 (PREDICTOR_DIGITS_MLP_URL)",
    ]
    assert "  rec: ocr_rec version 2 at ocr-rec:8113 (PREDICTOR_OCR_REC_URL)" in out
    assert out[-1].endswith("pipelines.yaml: 5 pipelines, every reference and endpoint resolved")
    assert list(tmp_path.iterdir()) == []  # no jobs' database, no cache, nothing


def test_a_steps_canary_and_shadow_are_listed_under_it(endpoints, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PREDICTOR_DIGITS_MLP_URL_CANARY", "mlp-v2:8102/digits_mlp/2")
    monkeypatch.setenv("PREDICTOR_DIGITS_MLP_URL_CANARY_PERCENT", "5")
    monkeypatch.setenv("PREPROCESS_URL_SHADOW", "preprocess-next:8002")
    assert main(["--check", "true", "--port", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    digits = out[out.index("digits:") + 1 : out.index("digits-partial:")]
    assert digits == [
        "  preprocess: digits_input at preprocess:8002 (PREPROCESS_URL)",
        "    shadow: 100% copied to digits_input at preprocess-next:8002 (PREPROCESS_URL_SHADOW)",
        "  ensemble/logreg: digits_logreg at digits-logreg:8101 (PREDICTOR_DIGITS_LOGREG_URL)",
        "  ensemble/mlp: digits_mlp at dns:///digits-mlp:8102 (PREDICTOR_DIGITS_MLP_URL)",
        "    canary: 5% sent instead to digits_mlp version 2 at mlp-v2:8102 "
        "(PREDICTOR_DIGITS_MLP_URL_CANARY)",
    ]


def test_a_problem_is_named_as_a_start_would_name_it(
    endpoints, monkeypatch, capsys, tmp_path: Path
) -> None:
    monkeypatch.delenv("PREDICTOR_OCR_DET_URL")
    assert main(["--check", "true"]) == 2
    assert (
        "step 'det': endpoint variable PREDICTOR_OCR_DET_URL is not set" in capsys.readouterr().err
    )
    monkeypatch.setenv("PREDICTOR_OCR_DET_URL", "ocr-det:8111")
    shipped = (Path(__file__).parents[2] / "proxy" / "pipelines.yaml").read_text()
    typo = tmp_path / "pipelines.yaml"
    typo.write_text(shipped.replace("label: ensemble.label[0]", "label: ensemble.labl[0]"))
    assert main(["--check", "true", "--pipelines", str(typo)]) == 2
    err = capsys.readouterr().err
    # The pipeline named, not its last v2 output's name ("pipeline 'probabilities'" before).
    assert "pipeline 'digits', result: reads 'ensemble.labl'" in err, err
    assert "Traceback" not in err
    # A typo in the v2 `outputs:` names the output it is in, not the result.
    typo.write_text(shipped.replace("{tensor: ensemble.label,", "{tensor: ensemble.labl,"))
    assert main(["--check", "true", "--pipelines", str(typo)]) == 2
    err = capsys.readouterr().err
    assert "pipeline 'digits', output 'label': reads 'ensemble.labl'" in err, err


def test_a_declared_batch_size_is_listed_and_a_bad_one_named(
    endpoints, monkeypatch, capsys
) -> None:
    """`<VARIABLE>_MAX_BATCH_SIZE`, for a server that cannot say its model's batch size (not
    a branch of `branches_from`, though it starts with the prefix)."""
    monkeypatch.setenv("PREDICTOR_DIGITS_FOREIGN_URL", "mlserver:8081/digits")
    monkeypatch.setenv("PREDICTOR_DIGITS_FOREIGN_URL_MAX_BATCH_SIZE", "32")
    assert main(["--check", "true", "--port", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    digits = out[out.index("digits:") + 1 : out.index("digits-partial:")]
    assert digits[1:3] == [
        "  ensemble/foreign: digits at mlserver:8081 (PREDICTOR_DIGITS_FOREIGN_URL)",
        "    up to 32 rows a call, unless its server says otherwise",
    ]
    assert len(digits) == 5  # preprocess, foreign (two lines), logreg, mlp: no branch of its own
    for bad in ("0", "many", "-4", "70000"):
        monkeypatch.setenv("PREDICTOR_DIGITS_FOREIGN_URL_MAX_BATCH_SIZE", bad)
        assert main(["--check", "true"]) == 2
        err = capsys.readouterr().err
        assert f"PREDICTOR_DIGITS_FOREIGN_URL_MAX_BATCH_SIZE={bad!r}: expected the rows" in err


def test_a_shadow_and_a_canary_declare_their_own_batch_size(endpoints, monkeypatch) -> None:
    """Each target's declaration is its own variable's (`<VARIABLE>_SHADOW_MAX_BATCH_SIZE`,
    `<VARIABLE>_CANARY_MAX_BATCH_SIZE`): a candidate on MLServer merges its calls too."""
    import os

    from proxy.engine import plan

    monkeypatch.setenv("PREDICTOR_DIGITS_MLP_URL_SHADOW", "mlserver:8081/mlp")
    monkeypatch.setenv("PREDICTOR_DIGITS_MLP_URL_SHADOW_MAX_BATCH_SIZE", "4")
    monkeypatch.setenv("PREDICTOR_DIGITS_MLP_URL_CANARY", "kserve:8081/mlp")
    monkeypatch.setenv("PREDICTOR_DIGITS_MLP_URL_CANARY_PERCENT", "10")
    monkeypatch.setenv("PREDICTOR_DIGITS_MLP_URL_CANARY_MAX_BATCH_SIZE", "8")
    shipped = Path(__file__).parents[2] / "proxy" / "pipelines.yaml"
    declared = plan.load(shipped, dict(os.environ))["digits"].declared_batches
    assert {(t.endpoint, t.address, t.model): rows for t, rows in declared.items()} == {
        ("PREDICTOR_DIGITS_MLP_URL_SHADOW", "mlserver:8081", "mlp"): 4,
        ("PREDICTOR_DIGITS_MLP_URL_CANARY", "kserve:8081", "mlp"): 8,
    }
