"""A Target's hash is made once; it must still behave as the value it is."""

from __future__ import annotations

import dataclasses
import pickle

from proxy.transport.target import Target


def test_a_target_hashes_and_compares_by_its_fields_and_shows_only_them() -> None:
    target = Target("PREDICTOR_DIGITS_MLP_URL", "127.0.0.1:8102", "digits_mlp")
    same = Target("PREDICTOR_DIGITS_MLP_URL", "127.0.0.1:8102", "digits_mlp")
    assert {target: 1}[same] == 1
    assert dataclasses.replace(target, version="2") not in {target}
    assert dataclasses.asdict(target) == {
        "endpoint": "PREDICTOR_DIGITS_MLP_URL",
        "address": "127.0.0.1:8102",
        "model": "digits_mlp",
        "version": "",
    }


def test_a_pickled_target_is_hashed_again_where_it_lands() -> None:
    target = Target("PREPROCESS_URL", "127.0.0.1:8002", "digits_input")
    state = target.__getstate__()
    assert "_hash" not in state  # another process hashes strings with another seed
    back = pickle.loads(pickle.dumps(target))
    assert back == target and hash(back) == hash(target)
