"""The partition step prints one short table on the console (parts per backend, share of the
MACs on the NPU, fallback reasons with counts) and nothing with --json; the numbers agree with
partition.json."""

import json
import subprocess
import sys

from test_partition import mixed_model, write_project


def test_partition_table_on_the_console_not_with_json(tmp_path, rng):
    recipe = write_project(tmp_path, mixed_model(rng), rng)
    cli = [sys.executable, "-m", "onebuild.cli", "build", str(recipe)]
    quiet = subprocess.run([*cli, "--json"], capture_output=True)
    assert quiet.returncode == 0 and b"partition 'm'" not in quiet.stderr
    assert "partition" in [s["step"] for s in json.loads(quiet.stdout)["steps"]]
    clean = [sys.executable, "-m", "onebuild.cli", "clean", str(recipe), "--cache"]
    subprocess.run(clean, check=True, capture_output=True)
    result = subprocess.run(cli, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "build/r/partition/m.partition.json").read_text())
    macs = report["macs"]
    npu_share = 100 * macs["trix"] / (macs["trix"] + macs.get("cpu", 0))
    # the four convolutions of mixed_model: 3->8, 8->8, 8->8, 8->4 at 12x12, 3x3 kernels
    assert sum(macs.values()) == 12 * 12 * 9 * (3 * 8 + 8 * 8 + 8 * 8 + 8 * 4)
    lines = result.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "partition 'm'" in line)
    table = lines[start : start + 6]
    assert "3 part(s)" in table[0]
    assert table[1].split() == ["backend", "parts", "nodes", "MACs"]
    trix = table[2].split()
    assert trix[:2] == ["trix", "2"] and trix[3] == f"{npu_share:.1f}%"
    assert table[3].split()[:2] == ["cpu", "1"]
    reasons = [f["reasons"] for f in report["fallbacks"]]
    assert table[4].strip() == "CPU fallback reasons (nodes with each; a node may have several):"
    count, why = table[5].split(maxsplit=1)
    assert int(count) == sum(why in r for r in reasons) and why in reasons[0]
