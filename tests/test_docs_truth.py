"""The docs cannot drift from the code: every recipe key the README and docs/ name exists in the
recipe schema, and every command and option the README's command list shows exists in the CLI."""

import argparse
import re
from pathlib import Path

import pytest

from onebuild.cli import build_parser
from onebuild.recipe import Recipe

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TABLES = "import|optimize|quantize|partition|codegen|pack|build"
FILE_SUFFIXES = {"json", "py", "tvn", "obir", "npz", "toml", "md", "log", "sqlite3", "onnx"}
DOTTED = re.compile(rf"(?<![\w/.-])(?:{TABLES})(?:\.[a-z_]+)+\b")
BRACKETED = re.compile(rf"`\[({TABLES})(?:\.([a-z_]+))?\]\s+([a-z_]+)")


def _schema_keys() -> set[str]:
    """Every dotted key path of the recipe schema (tables and their keys)."""
    schema = Recipe.model_json_schema(by_alias=True)
    defs = schema["$defs"]

    def table_of(prop: dict) -> dict | None:
        for option in [prop, *prop.get("anyOf", []), prop.get("items", {})]:
            if "$ref" in option:
                return defs[option["$ref"].rsplit("/", 1)[-1]]
            if option.get("type") == "array" and "$ref" in option.get("items", {}):
                return table_of(option["items"])
        return None

    keys: set[str] = set()

    def walk(table: dict, prefix: str) -> None:
        for name, prop in table.get("properties", {}).items():
            path = f"{prefix}.{name}" if prefix else name
            keys.add(path)
            inner = table_of(prop)
            if inner is not None:
                walk(inner, path)

    walk(schema, "")
    return keys


def _named_keys() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in DOTTED.finditer(text):
            if match.group(0).rsplit(".", 1)[-1] not in FILE_SUFFIXES:
                found.append((doc.name, match.group(0)))
        for table, sub, key in BRACKETED.findall(text):
            found.append((doc.name, ".".join(filter(None, (table, sub, key)))))
    return sorted(set(found))


KEYS = _schema_keys()
NAMED = _named_keys()


def test_the_docs_name_recipe_keys():
    assert len(NAMED) >= 10, NAMED  # the extraction finds what the docs name


@pytest.mark.parametrize(("doc", "key"), NAMED, ids=[f"{d}:{k}" for d, k in NAMED])
def test_every_recipe_key_in_the_docs_exists(doc, key):
    assert key in KEYS, f"{doc} names recipe key '{key}', which the schema does not have"


def _commands_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Commands", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.startswith("onebuild ")]


def _parser_options() -> dict[str, set[str]]:
    """Options by command, and by "command subcommand" for commands that have subcommands."""

    def commands(parser, prefix: str) -> dict[str, set[str]]:
        found = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    key = f"{prefix} {name}".strip()
                    found[key] = {s for a in child._actions for s in a.option_strings}
                    found.update(commands(child, key))
        return found

    return commands(build_parser(), "")


def test_every_command_and_option_in_the_readme_exists():
    options = _parser_options()
    lines = _commands_block()
    assert len(lines) >= 15
    for line in lines:
        words = line.split()
        command = words[1]
        if len(words) > 2 and f"{command} {words[2]}" in options:
            command = f"{command} {words[2]}"
        assert command in options, f"README shows 'onebuild {command}', which does not exist"
        code = line.split("#", 1)[0]
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", code):
            assert flag in options[command], f"README: 'onebuild {command}' has no {flag}"
