"""Hostile recipes, options and output paths through the real CLI: one line, exit 1 or 2.

Cases are generated deterministically: every key of the recipe schema with a value of the wrong
type, broken TOML, nesting bombs, symlink loops, impossible dims, output paths that would
replace inputs, bad command-line options. The harness (tests/hostile_cli.py) runs each in a
fresh interpreter under an address-space limit.
"""

import json
import os
from pathlib import Path

import pytest
from hostile_cli import Case, check_clean_failure

from onebuild.recipe import Recipe

ROOT = Path(__file__).parent.parent
MODEL = ROOT / "examples" / "models" / "tiny_mobilenet.onnx"
CALIBRATION = ROOT / "examples" / "models" / "tiny_mobilenet_calib.npz"
IMPORT = '[import]\nsource = "m.onnx"\ninput_shapes = { x = [1, 3, 32, 32] }\n'
REQUIRED = {"source": "m.onnx", "output": "out/p.nnpkg"}  # valid values of required keys
BASE = {"m.onnx": MODEL.read_bytes(), "c.npz": CALIBRATION.read_bytes()}


def recipe_case(case_id: str, text: str, mentions: str, command: str = "build", **kw) -> Case:
    extra = kw.pop("argv", [])
    files = {**BASE, "r.toml": text, **kw.pop("files", {})}
    return Case(case_id, [command, "{tmp}/r.toml", *extra], files, mentions, **kw)


def _wrong_values(prop: dict, defs: dict) -> list:
    """Values of another type than the property accepts."""
    if "$ref" in prop:
        return [3, "text"]
    kinds = {p.get("type") for p in prop.get("anyOf", [prop])} | {"$ref" in p for p in [prop]}
    if "enum" in prop:
        return ["no-such-choice", 7]
    wrong = []
    if "string" not in kinds:
        wrong.append("text")
    if not kinds & {"integer", "number"}:
        wrong.append(12)
    if "array" not in kinds and "object" not in kinds:
        wrong.append([1, 2])
    if "boolean" in kinds:
        wrong = ["maybe", 2]
    return wrong[:2]


def _toml_value(value) -> str:
    return json.dumps(value)


def schema_cases() -> list[Case]:
    """Every key of every table of the recipe schema, set to values of the wrong type."""
    schema = Recipe.model_json_schema(by_alias=True)
    defs = schema["$defs"]
    tables = {
        "quantize": "QuantizeStep",
        "partition": "PartitionStep",
        "codegen": "CodegenStep",
        "pack": "PackStep",
        "optimize": "OptimizeStep",
        "build": "BuildSection",
        "import": "ImportStep",
    }
    cases = []
    for table, definition in tables.items():
        for key, prop in sorted(defs[definition]["properties"].items()):
            for index, value in enumerate(_wrong_values(prop, defs)):
                required = defs[definition].get("required", [])
                body = {k: REQUIRED[k] for k in required if k != key}
                body[key] = value
                lines = [f"{k} = {_toml_value(v)}" for k, v in body.items()]
                head = "" if table == "import" else IMPORT
                text = head + f"[{table}]\n" + "\n".join(lines) + "\n"
                cases.append(
                    recipe_case(f"schema-{table}.{key}-{index}", text, f"{table}.{key}", "list")
                )
    return cases


def _symlink(target: str, name: str):
    def setup(folder: Path) -> None:
        os.symlink(target, folder / name)

    return setup


def _loop(a: str, b: str):
    def setup(folder: Path) -> None:
        os.symlink(a, folder / b)
        os.symlink(b, folder / a)

    return setup


def _folder(name: str, *files: str):
    def setup(folder: Path) -> None:
        (folder / name).mkdir(parents=True, exist_ok=True)
        for file in files:
            (folder / name / file).write_text("the user's")

    return setup


def structural_cases() -> list[Case]:
    deep_array = "a = " + "[" * 5000 + "]" * 5000 + "\n"
    deep_table = "".join(f"[{'.'.join(['t'] * n)}]\n" for n in range(1, 40))
    cases = [
        recipe_case("toml-unclosed-table", IMPORT + "[quantize\n", "TOML syntax error"),
        recipe_case("toml-bad-string", IMPORT + '[pack]\noutput = "out\n', "TOML syntax error"),
        recipe_case("toml-duplicate-key", IMPORT + "[optimize]\n[optimize]\n", "TOML syntax"),
        recipe_case("toml-binary", "\x00\x01\x02", "r.toml"),
        recipe_case("toml-latin1", "", "UTF-8", files={"r.toml": b"[import]\nsource = '\xe9'\n"}),
        recipe_case("toml-deep-array", IMPORT + deep_array, "nested too deeply"),
        recipe_case("toml-deep-tables", IMPORT + deep_table, "nested too deeply"),
        recipe_case("toml-huge", "# " + "x" * (2 << 20) + "\n" + IMPORT, "larger than"),
        recipe_case("no-import", "[optimize]\n", "[import]"),
        recipe_case("empty", "", "no step"),
        recipe_case("unknown-table", IMPORT + "[optimise]\n", "did you mean 'optimize'"),
        recipe_case("unknown-key", IMPORT + "[quantize]\ndtyp = 'int8'\n", "quantize.dtyp"),
        recipe_case("top-level-scalar", IMPORT.replace("[import]", "x = 1\n[import]"), "x"),
        recipe_case("source-missing", IMPORT.replace("m.onnx", "nope.onnx"), "import.source"),
        recipe_case(
            "source-symlink-loop",
            IMPORT.replace("m.onnx", "loop1"),
            "import.source",
            setup=_loop("loop1", "loop2"),
        ),
        recipe_case("source-is-folder", IMPORT.replace("m.onnx", "."), "r.toml"),
        recipe_case("source-not-onnx", IMPORT.replace("m.onnx", "r.toml"), "r.toml"),
        recipe_case("extends-missing", 'extends = "base.toml"\n' + IMPORT, "base.toml"),
        recipe_case("extends-not-string", "extends = 3\n" + IMPORT, "extends"),
        recipe_case("extends-self", 'extends = "r.toml"\n' + IMPORT, "cycle"),
        recipe_case(
            "extends-cycle",
            'extends = "a.toml"\n' + IMPORT,
            "cycle",
            files={"a.toml": 'extends = "r.toml"\n'},
        ),
        recipe_case(
            "extends-symlink-loop", 'extends = "l1"\n' + IMPORT, "l1", setup=_loop("l1", "l2")
        ),
        Case("recipe-missing", ["build", "{tmp}/none.toml"], {}, "none.toml"),
        Case("recipe-is-folder", ["build", "{tmp}"], {}, "no such recipe file"),
        Case(
            "recipe-symlink-loop",
            ["list", "{tmp}/r1.toml"],
            {},
            "r1.toml",
            setup=_loop("r1.toml", "r2.toml"),
        ),
    ]
    for dims, mentions in [
        ("[0, 3, 32, 32]", "import.input_shapes.x.0"),
        ("[-1, 3, 32, 32]", "import.input_shapes.x.0"),
        ("[1, 3, 99999999999999999999, 32]", "import.input_shapes.x.2"),
        ("[1, 3, 9223372036854775807, 32]", "import.input_shapes.x.2"),
        ("[1.5, 3, 32, 32]", "import.input_shapes.x.0"),
        ('["a", 3, 32, 32]', "import.input_shapes.x.0"),
        ("[1, 3, 32]", "x"),
        ("[1, 3, 64, 64]", "x"),
        ("[]", "x"),
    ]:
        text = IMPORT.replace("[1, 3, 32, 32]", dims)
        cases.append(recipe_case(f"dims-{dims}", text, mentions))
    cases.append(recipe_case("dims-unknown-input", IMPORT.replace("x =", "y ="), "'y'"))
    outputs = [
        ("pack-at-recipe-folder", ".", "the recipe", None),
        ("pack-above-recipe", "..", "the recipe", None),
        ("pack-at-root", "/", "the recipe", None),
        ("pack-at-model", "m.onnx", "import.source", None),
        ("pack-at-calibration", "c.npz", "quantize.calibration", None),
        ("pack-at-data-folder", "data", "quantize.calibration", None),
        ("pack-at-foreign-folder", "mine", "did not make", _folder("mine", "notes.txt")),
        ("pack-at-foreign-file", "mine.txt", "did not make", None),
        ("pack-at-build-dir", "build/r", "build.dir", None),
    ]
    calibrated = "[quantize]\ncalibration = '{}'\n"
    for case_id, output, mentions, setup in outputs:
        data = "data/c.npz" if case_id == "pack-at-data-folder" else "c.npz"
        text = IMPORT + calibrated.format(data) + f"[pack]\noutput = '{output}'\n"
        files = {"data/c.npz": CALIBRATION.read_bytes(), "mine.txt": "the user's"}
        cases.append(recipe_case(case_id, text, mentions, setup=setup, files=files))
        cases.append(
            recipe_case(case_id + "-clean", text, mentions, "clean", setup=setup, files=files)
        )
    builds = [
        ("build-dir-proc", "/proc/onebuild/b", "build.dir"),
        ("build-dir-file", "m.onnx", "is a file"),
        ("build-dir-foreign", "mine", "did not make"),
    ]
    for case_id, folder, mentions in builds:
        text = IMPORT + f"[build]\ndir = '{folder}'\n"
        cases.append(recipe_case(case_id, text, mentions, setup=_folder("mine", "a.txt")))
    text = IMPORT + "[build]\ncache = 'm.onnx'\n"
    cases.append(recipe_case("cache-is-file", text, "build.cache"))
    return cases


def option_cases() -> list[Case]:
    recipe = {"r.toml": IMPORT, **BASE}
    deep = ".".join(["a"] * 3000) + "=1"
    cases = [
        Case("jobs-negative", ["build", "{tmp}/r.toml", "-j", "-5"], recipe, "--jobs"),
        Case("jobs-zero", ["build", "{tmp}/r.toml", "-j", "0"], recipe, "--jobs"),
        Case("jobs-text", ["build", "{tmp}/r.toml", "-j", "many"], recipe, "--jobs"),
        Case("set-no-equals", ["list", "{tmp}/r.toml", "--set", "quantize.dtype"], recipe, "--set"),
        Case("set-empty-key", ["list", "{tmp}/r.toml", "--set", "a..b=1"], recipe, "--set"),
        Case("set-deep-keys", ["list", "{tmp}/r.toml", "--set", deep], recipe, "nested keys"),
        Case("set-extends", ["list", "{tmp}/r.toml", "--set", "extends=x.toml"], recipe, "extends"),
        Case(
            "set-unknown", ["list", "{tmp}/r.toml", "--set", "quantize.x=1"], recipe, "quantize.x"
        ),
        Case(
            "set-deep-value",
            ["list", "{tmp}/r.toml", "--set", "quantize.layers=" + "[" * 3000 + "]" * 3000],
            recipe,
            "quantize.layers",
        ),
        Case(
            "set-not-table",
            ["list", "{tmp}/r.toml", "--set", "import.source.x=1"],
            recipe,
            "source",
        ),
        Case("unknown-command", ["compile", "{tmp}/r.toml"], recipe, "compile"),
        Case("unknown-option", ["build", "{tmp}/r.toml", "--fast"], recipe, "--fast"),
    ]
    model = {"m.onnx": MODEL.read_bytes()}
    for shape in ["x=0,3,32,32", "x=-1,3,32,32", "x=1,3,a,32", "x", "=1,2", "x=99999999999,3,1,1"]:
        argv = ["inspect", "{tmp}/m.onnx", "--input-shape", shape]
        cases.append(Case(f"input-shape-{shape}", argv, model, "--input-shape"))
    shape = ["--input-shape", "x=1,3,32,32"]
    for name, argv, mentions in [
        ("import-o-folder", ["import", "{tmp}/m.onnx", *shape, "-o", "{tmp}"], "is a folder"),
        ("export-o-folder", ["export", "{tmp}/m.onnx", *shape, "-o", "{tmp}"], "is a folder"),
        ("import-o-proc", ["import", "{tmp}/m.onnx", *shape, "-o", "/proc/m.obir"], "/proc/m.obir"),
        (
            "import-o-under-file",
            ["import", "{tmp}/m.onnx", *shape, "-o", "{tmp}/m.onnx/x"],
            "m.onnx",
        ),
    ]:
        cases.append(Case(name, argv, model, mentions))
    return cases


CASES = schema_cases() + structural_cases() + option_cases()


def test_the_corpus_is_large_and_has_unique_names():
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_recipe_fails_cleanly(case, tmp_path):
    check_clean_failure(case, tmp_path)
