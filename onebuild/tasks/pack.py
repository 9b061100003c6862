"""The pack step: model file(s) -> nnpackage directory (MANIFEST v1.3, config.cfg)."""

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("onebuild")


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..packing import write_package

    partitioned = inputs[0].suffix == ".json"
    notes = write_package(
        Path(config["output"]),
        inputs[1:] if partitioned else inputs,
        inputs[0] if partitioned else None,
        config.get("config"),
        outputs[1] if config.get("archive") else None,
    )
    for note in notes:
        log.warning("pack: %s", note)
