"""The catalogue of optional parts agrees with pyproject.toml, and an ImportError of a part is named."""

from __future__ import annotations

import re

import pytest
import tomllib

from ml_debug.core.errors import ExitCode
from ml_debug.core.extras import PARTS, MissingPart, Part, is_present, missing_from_import_error, require
from tests.conftest import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@pytest.mark.parametrize("part", PARTS.values(), ids=lambda p: p.name)
def test_each_install_command_installs_its_part(part: Part) -> None:
    extra = re.search(r"'mldebug\[(\w+)\]'", part.install)
    dist = part.name.lower().replace("_", "-")
    if extra:  # the extra it names exists and holds the part
        assert dist in {_name(r) for r in PROJECT["optional-dependencies"][extra.group(1)]}, part
    elif part.install.startswith("pip install"):  # a dependency of mldebug itself, reinstalled by name
        assert dist in {_name(r) for r in PROJECT["dependencies"]} and dist in part.install.replace("_", "-"), part
    else:  # a system program
        assert part.kind == "program" and "apt-get install" in part.install, part


def test_an_import_error_of_a_part_becomes_its_missing_part() -> None:
    found = missing_from_import_error(ModuleNotFoundError("No module named 'torchao'", name="torchao.float8"), "train")
    assert isinstance(found, MissingPart) and found.exit_code == ExitCode.ENVIRONMENT
    assert found.message.startswith("missing torchao: mldebug train needs it")
    assert found.hint == PARTS["torchao"].install and found.details == {"missing": {
        "name": "torchao", "kind": "python module", "install": PARTS["torchao"].install,
        "needed_by": "mldebug train"}}
    # anything else stays what it is (a bug of mldebug's, shown as an internal error)
    assert missing_from_import_error(ModuleNotFoundError("x", name="ml_debug.nope"), "train") is None
    assert missing_from_import_error(ImportError("cannot import name 'x'"), "train") is None


def test_require_passes_for_what_is_here_and_a_program_off_path_is_not_present() -> None:
    require("py-spy", "mldebug dump-stacks")  # the test venv has every part
    require("numpy", "mldebug gpu-test")
    ghost = Part("mldebug-no-such-program", "program", "apt-get install nothing", "")
    assert not is_present(ghost)
    assert str(MissingPart(ghost, "mldebug x")) == "missing mldebug-no-such-program: mldebug x needs it"
