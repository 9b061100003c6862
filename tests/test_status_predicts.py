"""`status` predicts what `build` then does, for random option changes over the examples.

A definite prediction (up-to-date, restored, run) must be what the build reports; `pending`
(a step downstream of one that recomputes: the build runs it, restores it or leaves it when
the new output is byte-identical) accepts any of them.
"""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
CHANGES = {
    "digits_npu.toml": [
        "quantize.dtype=uint8",
        "quantize.dtype=int16",
        "quantize.method=minmax",
        "quantize.method=mse",
        "quantize.bias_correction=false",
        "quantize.bias_correction=true",
        "codegen.hw=trix-s",
        "codegen.hw=trix-m",
        "codegen.pref=memory",
        "codegen.pref=performance",
        "optimize.preset=O0",
        "optimize.preset=O1",
        "pack.archive=true",
        "pack.archive=false",
    ],
    "tiny_mobilenet_npu.toml": [
        "quantize.granularity=layer",
        "quantize.granularity=channel",
        "partition.strategy=cost",
        "partition.strategy=capability",
        "codegen.hw=trix-s",
        "codegen.hw=trix-m",
        "quantize.method=percentile",
        "quantize.method=minmax",
    ],
}


def cli(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *args, "--json"], capture_output=True, text=True
    )
    assert result.returncode in (0, 2) and result.stdout, (args, result.stderr)
    return json.loads(result.stdout)


def statuses(report: dict) -> dict[tuple[str, str], str]:
    return {(s["step"], s["part"]): s["status"] for s in report["steps"]}


def test_status_predicts_the_build_for_random_option_changes(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    current = {name: [] for name in CHANGES}
    for name in CHANGES:
        cli("build", str(tmp_path / "examples" / name))
    chooser = random.Random(20261122)
    seen = {"up-to-date": 0, "restored": 0, "run": 0, "pending": 0}
    for trial in range(20):
        name = chooser.choice(sorted(CHANGES))
        change = chooser.choice(CHANGES[name])
        key = change.split("=")[0]
        current[name] = [c for c in current[name] if c.split("=")[0] != key] + [change]
        overrides = [a for c in current[name] for a in ("--set", c)]
        recipe = str(tmp_path / "examples" / name)
        predicted = statuses(cli("status", recipe, *overrides))
        built = statuses(cli("build", recipe, *overrides))
        fan_outs = {step for (step, part), state in predicted.items() if state == "pending"}
        for (step, part), state in built.items():
            guess = predicted.get((step, part))
            if guess is None:  # a fan-out task the partition's rerun creates
                assert step in fan_outs and (step, "") in predicted, (
                    trial,
                    change,
                    predicted,
                    built,
                )
                continue
            seen[guess] += 1
            if guess != "pending":
                assert guess == state, (trial, name, current[name], step, part, predicted, built)
    assert all(seen.values()), seen  # every kind of prediction was made and checked


def test_dag_draws_the_partition_to_its_codegen_tasks(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    recipe = str(tmp_path / "examples" / "tiny_mobilenet_npu.toml")
    split = ["--set", 'partition.opcode={MaxPool = "cpu"}']  # two NPU parts around the pool
    cli("build", recipe, *split)
    result = subprocess.run(
        [sys.executable, "-m", "onebuild.cli", "dag", recipe, "--dot", *split],
        capture_output=True,
        text=True,
        check=True,
    )
    steps = cli("status", recipe, *split)["steps"]
    parts = [s["part"] for s in steps if s["step"] == "codegen"]
    assert len(parts) >= 2
    for part in parts:
        assert f'"{recipe}::partition" -> "{recipe}::codegen:{part}";' in result.stdout
        assert f'"{recipe}::codegen:{part}" -> "{recipe}::pack";' in result.stdout


def test_dag_before_and_after_the_partition_has_run(tmp_path):
    """Before the partition exists, the pack still names its package and the codegen says what
    it waits for; after, each task's sources are listed once."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    recipe = str(tmp_path / "examples" / "tiny_mobilenet_npu.toml")

    def dag() -> list[str]:
        command = [sys.executable, "-m", "onebuild.cli", "dag", recipe]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        return result.stdout.splitlines()

    package = tmp_path / "out" / "tiny_mobilenet_npu.nnpkg"
    before = dag()
    assert f"tiny_mobilenet_npu.toml [pack] <- partition, codegen -> {package}" in before
    assert any(line.endswith("known once partition has run") for line in before)
    cli("build", recipe)
    after = dag()
    assert f"tiny_mobilenet_npu.toml [pack] <- partition, codegen -> {package}" in after
    assert not any("known once" in line for line in after)
