"""ONE circle-partitioner `.part` files: an INI file with `[partition]` (backends, default,
comply), `[OPCODE]` (op type = backend) and `[OPNAME]` (node name = backend) sections."""

import configparser
import os

from ...errors import UserError
from .op_keys import check_keys

SECTIONS = {"partition", "OPCODE", "OPNAME"}


def read_part_file(path: str | os.PathLike) -> dict:
    """The settings of a .part file: any of backends, default, comply, opcode, opname."""
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # node names and op types are case-sensitive
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle)
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read the .part file: {error}") from None
    except configparser.Error as error:
        first = " ".join(str(error).split())
        raise UserError(f"{path}: not a valid .part (INI) file: {first}") from None
    unknown = sorted(set(parser.sections()) - SECTIONS)
    if unknown:
        raise UserError(
            f"{path}: unknown section(s) {', '.join(unknown)} (known: partition, OPCODE, OPNAME)"
        )
    settings: dict = {}
    if parser.has_section("partition"):
        section = dict(parser["partition"])
        extra = sorted(set(section) - {"backends", "default", "comply"})
        if extra:
            raise UserError(
                f"{path}: [partition] {extra[0]}: unknown key (known: backends, default, comply)"
            )
        if "backends" in section:
            settings["backends"] = [b.strip() for b in section["backends"].split(",") if b.strip()]
        for key in ("default", "comply"):
            if key in section:
                settings[key] = section[key].strip()
        if settings.get("comply", "opcode") not in ("opcode", "opname"):
            raise UserError(f"{path}: [partition] comply must be opcode or opname")
    for section, key in (("OPCODE", "opcode"), ("OPNAME", "opname")):
        if parser.has_section(section):
            settings[key] = {k: v.strip() for k, v in parser[section].items()}
    check_keys(settings.get("opcode", {}), f"{path}: [OPCODE]")
    return settings
