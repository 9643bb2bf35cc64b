"""`python deploy/kserve/validate.py FILE...`: check KServe objects (ServingRuntime,
InferenceService) against the `kserve` package's models: every field known to its model,
every value of its type, every required field present. Exits 1 naming the first problem of
each invalid object.

Run with the interpreter of `.venv-kserve` (./mesh test creates it): the kserve package
pins protobuf and starlette versions the mesh does not use.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import kserve.models as kserve_models
import kubernetes.client.models as k8s_models
import yaml

MODELS = {
    "ServingRuntime": "V1alpha1ServingRuntime",
    "ClusterServingRuntime": "V1alpha1ClusterServingRuntime",
    "InferenceService": "V1beta1InferenceService",
}
PRIMITIVES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "bool": bool,
    "float": (int, float),
    "object": object,
}


def build(data: object, typ: str, path: str) -> object:
    """`data` as an instance of the OpenAPI type `typ`; raises naming `path`."""
    if m := re.fullmatch(r"[lL]ist\[(.+)\]", typ):
        if not isinstance(data, list):
            raise TypeError(f"{path}: expected a list")
        return [build(v, m[1], f"{path}[{i}]") for i, v in enumerate(data)]
    if m := re.fullmatch(r"dict\((\w+), (.+)\)|Dict\[(\w+), (.+)\]", typ):
        if not isinstance(data, dict):
            raise TypeError(f"{path}: expected a mapping")
        return {k: build(v, m[2] or m[4], f"{path}.{k}") for k, v in data.items()}
    if typ in PRIMITIVES:
        if not isinstance(data, PRIMITIVES[typ]) or (typ == "int" and isinstance(data, bool)):
            raise TypeError(f"{path}: expected {typ}, got {data!r}")
        return data
    cls = getattr(kserve_models, typ, None) or getattr(k8s_models, typ)
    if not isinstance(data, dict):
        raise TypeError(f"{path}: expected a {typ} mapping")
    fields = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise KeyError(f"{path}: {typ} has no field {key!r}")
        kwargs[fields[key]] = build(value, cls.openapi_types[fields[key]], f"{path}.{key}")
    return cls(**kwargs)


def main(paths: list[str]) -> int:
    failed = 0
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if not doc or doc.get("kind") not in MODELS:
                continue
            name = f"{doc['kind']}/{doc['metadata']['name']}"
            try:
                build(doc, MODELS[doc["kind"]], doc["kind"])
                print(f"valid {name}")
            except (KeyError, TypeError, ValueError) as exc:
                failed += 1
                print(f"invalid {name}: {exc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
