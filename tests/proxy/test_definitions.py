"""Pipeline definitions are checked at start-up with errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from proxy.engine import endpoints, plan
from proxy.engine.definitions import Condition
from proxy.errors import DefinitionError

ENV = {"A_URL": "127.0.0.1:1", "B_URL": "127.0.0.1:2/model_b/3"}


def load(tmp_path: Path, pipelines: dict, env: dict | None = None):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"pipelines": pipelines}))
    return plan.load(path, ENV if env is None else env)


def step(name: str, source: str, endpoint: str = "A_URL", model: str | None = "m") -> dict:
    return {"call": {"name": name, "endpoint": endpoint, "model": model, "inputs": {"x": source}}}


def test_the_shipped_pipelines_load() -> None:
    env = {
        v: "127.0.0.1:1"
        for v in (
            "PREPROCESS_URL",
            "PREDICTOR_DIGITS_A_URL",
            "PREDICTOR_DIGITS_LOGREG_URL",
            "PREDICTOR_OCR_DET_URL",
            "PREDICTOR_OCR_CLS_URL",
            "PREDICTOR_OCR_REC_URL",
        )
    }
    plans = plan.load(Path("proxy/pipelines.yaml"), env)
    assert set(plans) == {"digits", "digits-partial", "digits-fast", "digits-features", "ocr"}
    assert plans["digits-fast"].pipeline.later == "digits"
    assert plans["digits"].targets["ensemble/a"].model == "digits_a"
    assert plans["digits-features"].pipeline.input_names() == ["features"]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([step("a", "request.image", endpoint="NOPE_URL")], "NOPE_URL is not set"),
        ([step("a", "ghost.y")], "names no earlier step"),
        ([step("a", "b.y"), step("b", "request.image")], "names no earlier step"),
        ([step("a", "a.y")], "names no earlier step"),
        ([step("a", "request.image"), step("a", "request.image")], "must be unique"),
        ([step("a", "request.nothing")], "request has no tensor 'nothing'"),
        ([step("a", "request.image", model=None)], "no model named"),
        ([step("a", "noseparator")], "must be <step>.<tensor>"),
        (
            [
                {
                    "parallel": {
                        "name": "p",
                        "inputs": {"x": "request.image"},
                        "branches_from": {"prefix": "ZZZ_"},
                    }
                }
            ],
            "no ZZZ_<NAME>_URL",
        ),
        (
            [
                {
                    "parallel": {
                        "name": "p",
                        "inputs": {"x": "request.image"},
                        "branches": [{"name": "a", "endpoint": "A_URL", "model": "m"}],
                        "combine": {"op": "mean"},
                    }
                }
            ],
            "needs `tensor`",
        ),
        ([{"teleport": {"name": "t"}}], "invalid pipeline definition"),
    ],
)
def test_bad_definitions_are_explained(tmp_path: Path, steps: list, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        load(tmp_path, {"p": {"steps": steps, "result": {}}})


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"y": "a.y[0][0]"}, r"result\.y: 'a\.y\[0\]\[0\]' is not a reference"),
        ({"y": "digits"}, "'digits' is not a reference"),
        ({"rows": {"zip": {"y": "ghost.y"}}}, r"result\.rows\.zip\.y: reference 'ghost\.y'"),
        ({"m": {"per_branch": "nope", "fields": {"y": "y[0]"}}}, "per_branch 'nope' names no"),
        ({"m": {"per_branch": "a", "fields": {"y": "y[0][1]"}}}, "per_branch field 'y'"),
        ({"z": "request.nothing"}, "request has no tensor 'nothing'"),
        ({"z": "a.z"}, r"reads 'a\.z', but step 'a' asks its model for y only"),
        ({"z": "p.labl[0]"}, r"reads 'p\.labl', but parallel step 'p' makes label, y$"),
        ({"z": "c.y"}, r"parallel step 'c' makes no tensor of its own"),
        ({"m": {"per_branch": "p", "fields": {"v": "v[0]"}}}, r"reads \['v'\] of step 'p''s"),
    ],
)
def test_a_result_that_could_never_be_filled_is_refused(
    tmp_path: Path, result: dict, message: str
) -> None:
    """Each of these answered null on every request; now the proxy does not start."""
    asking = step("a", "request.image")
    asking["call"]["outputs"] = ["y"]
    branches = [{"name": "one", "endpoint": "A_URL", "model": "m"}]
    fan = {"inputs": {"x": "request.image"}, "branches": branches}
    mean = {"parallel": {"name": "p", "combine": {"op": "mean", "tensor": "y"}, **fan}}
    mean["parallel"]["outputs"] = ["y"]
    collect = {"parallel": {"name": "c", **fan}}
    with pytest.raises(DefinitionError, match=message):
        load(tmp_path, {"p": {"steps": [asking, mean, collect], "result": result}})


def test_a_result_of_references_loads(tmp_path: Path) -> None:
    result = {
        "y": "a.y",
        "first": "a.y[-1]",
        "sent": "request.image",
        "rows": {"zip": {"y": "a.y", "w": {"group": {"v": "a.v"}, "by": "a.line"}}},
        "each": {"per_branch": "a", "fields": {"y": "y[0]"}},
        "list": ["a.y", "a.z.w"],  # a tensor's name may hold dots
    }
    loaded = load(tmp_path, {"p": {"steps": [step("a", "request.image")], "result": result}})
    assert loaded["p"].pipeline.result == result


def test_endpoint_url_may_name_model_and_version(tmp_path: Path) -> None:
    plan = load(
        tmp_path, {"p": {"steps": [step("a", "request.image", endpoint="B_URL")], "result": {}}}
    )["p"]
    target = plan.targets["a"]
    assert (target.address, target.model, target.version) == ("127.0.0.1:2", "model_b", "3")


@pytest.mark.parametrize(
    ("value", "address", "model"),
    [
        ("dns:///digits-mlp.mesh.svc:8102", "dns:///digits-mlp.mesh.svc:8102", None),
        ("dns:///digits-mlp:8102/digits_mlp", "dns:///digits-mlp:8102", "digits_mlp"),
        ("ipv4:10.0.0.1:8102,10.0.0.2:8102/m", "ipv4:10.0.0.1:8102,10.0.0.2:8102", "m"),
        ("ipv6:[fd00::1]:8102,[fd00::2]:8102", "ipv6:[fd00::1]:8102,[fd00::2]:8102", None),
        ("[::1]:8102", "[::1]:8102", None),
    ],
)
def test_endpoints_may_name_replicas(value: str, address: str, model: str | None) -> None:
    endpoint = endpoints.parse("X_URL", value)
    assert (endpoint.address, endpoint.model) == (address, model)


@pytest.mark.parametrize(
    "value",
    ["localhost", "host:99999", "a b:1", "", "a:1,b:1", "dns://8.8.8.8/a:1", "ipv4:a:1/m/v/x"],
)
def test_bad_endpoint_values(value: str) -> None:
    with pytest.raises(DefinitionError):
        endpoints.resolve("X_URL", {"X_URL": value})


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"accept": ["png"]}, "`accept` is for a pipeline taking an upload"),
        ({"inputs": {}}, "`inputs` names no tensor"),
        ({"inputs": {"a b": {"datatype": "FP32", "shape": [1]}}}, "input names must match"),
        ({"inputs": {"x": {"datatype": "FP33", "shape": [1]}}}, "inputs.x.datatype"),
        (
            {"inputs": {"x": {"datatype": "BYTES", "shape": [1], "max": 3}}},
            "min and max bound numbers, not BYTES elements",
        ),
        (
            {"inputs": {"x": {"datatype": "FP32", "shape": [-1, 2], "min": 2, "max": 1}}},
            "min 2 is above max 1",
        ),
    ],
)
def test_declared_inputs_are_checked(tmp_path: Path, change: dict, complaint: str) -> None:
    spec = {
        "inputs": {"x": {"datatype": "FP32", "shape": [-1, 2]}},
        "steps": [
            {"call": {"name": "a", "endpoint": "E_URL", "model": "m", "inputs": {"x": "request.x"}}}
        ],
        "result": {"y": "a.y"},
        **change,
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"pipelines": {"p": spec}}))
    with pytest.raises(DefinitionError) as refused:
        plan.load(path, {"E_URL": "127.0.0.1:1"})
    assert complaint in str(refused.value)


@pytest.mark.parametrize(
    ("when", "value", "holds"),
    [
        ({"empty": True}, np.zeros((0, 4), np.float32), True),
        ({"empty": True}, np.zeros((2, 4), np.float32), False),
        ({"empty": False}, np.zeros((2, 4), np.float32), True),
        ({"equals": 1}, np.array([1], np.int64), True),
        ({"equals": 1}, np.array([0], np.int64), False),
        ({"equals": "cat"}, np.array([b"cat"], dtype=object), True),
        ({"one_of": ["a", "b"]}, np.array([[b"b"]], dtype=object), True),
        ({"one_of": [2, 3]}, np.array([4.0], np.float32), False),
        ({"equals": 1}, np.zeros((0,), np.int64), False),  # nothing to compare
        ({"empty": False, "equals": 7}, np.array([7], np.int32), True),
    ],
)
def test_a_switch_condition_looks_at_the_first_element(when: dict, value, holds: bool) -> None:
    assert Condition(**when).holds(value) is holds
