"""Structural MANIFEST mutations, in-process: valid JSON with wrong types and values (dicts
where names are expected, negative or huge indices, wrong list lengths). Loading either succeeds
(and the package then runs or refuses its inputs in one line) or raises onebuild's FormatError or
UserError with a one-line message."""

import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onebuild.errors import FormatError, UserError
from onebuild.runtime.package import load_package, run_package

TVN = "m.part.00001_trix.tvn"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The real NPU-CPU-NPU package (a copy whose MANIFEST the test rewrites), its MANIFEST
    and inputs."""
    from test_partition import build_statuses, mixed_model, write_project

    folder = tmp_path_factory.mktemp("mutations")
    rng = np.random.default_rng(7)
    build_statuses(write_project(folder, mixed_model(rng), rng))
    root = folder / "out/m.nnpkg"
    copy = folder / "scratch.nnpkg"
    shutil.copytree(root, copy)
    manifest = json.loads((root / "metadata/MANIFEST").read_text())
    return copy, manifest, dict(np.load(folder / "eval.npz"))


KEYS = ["major-version", "minor-version", "patch-version", "configs", "models", "model-types",
        "model-configs", "pkg-inputs", "pkg-outputs", "model-connect", "extra"]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["0:0:0", "2:0:0", "-1:0:0", "0:0:99", "1:0:0:0", TVN, "tvn", "obir", "1"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@st.composite
def mutations(draw):
    """A list of edits of the MANIFEST: set a key, drop one, or change a list's length or one
    of its entries."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KEYS))
        kind = draw(st.sampled_from(["set", "drop", "entry", "length"]))
        if kind == "set":
            edits.append((kind, key, draw(values)))
        elif kind == "drop":
            edits.append((kind, key, None))
        elif kind == "entry":
            edits.append((kind, key, (draw(st.integers(0, 4)), draw(values))))
        else:
            edits.append((kind, key, draw(st.integers(0, 6))))
    return edits


def apply(manifest: dict, edits) -> dict:
    manifest = json.loads(json.dumps(manifest))
    for kind, key, argument in edits:
        if kind == "set":
            manifest[key] = argument
        elif kind == "drop":
            manifest.pop(key, None)
        elif isinstance(manifest.get(key), list) and manifest[key]:
            entries = manifest[key]
            if kind == "entry":
                entries[argument[0] % len(entries)] = argument[1]
            else:
                manifest[key] = (entries * (argument + 1))[:argument]
    return manifest


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=mutations())
def test_structural_manifest_mutations_load_or_fail_in_one_line(base, edits):
    scratch, original, feeds = base
    (scratch / "metadata/MANIFEST").write_text(json.dumps(apply(original, edits)))
    try:
        package = load_package(scratch)
    except UserError as error:  # FormatError included
        message = str(error)
        assert isinstance(error, (FormatError, UserError))
        assert message and "\n" not in message and len(message) < 2000, message
        return
    try:
        outputs, _ = run_package(package, feeds)
    except UserError as error:
        assert "\n" not in str(error)
        return
    assert set(outputs) == {spec.name for spec in package.outputs}
