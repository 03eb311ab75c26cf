"""The config's discriminated unions are built from their registries at runtime (LOSS_CONFIGS,
ENGINE_SECTIONS); the type checker cannot evaluate that, so each module spells the same union out in
an `if TYPE_CHECKING:` branch. These tests keep the spelled-out union equal to the registry, so a
registered loss or engine the type checker does not know about fails here."""

import ast
from pathlib import Path

import pytest

from stare.config import ENGINE_SECTIONS
from stare.config.algo import LOSS_CONFIGS

CONFIG = Path(__file__).resolve().parents[2] / "stare" / "config"


def _checked_union(module: Path, alias: str) -> set[str]:
    """Class names in the `alias = Annotated[A | B | ..., ...]` of the module's `if TYPE_CHECKING:` branch."""
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and [t.id for t in stmt.targets if isinstance(t, ast.Name)] == [alias]:
                    assert isinstance(stmt.value, ast.Subscript) and isinstance(stmt.value.slice, ast.Tuple)
                    union = stmt.value.slice.elts[0]
                    return {n.id for n in ast.walk(union) if isinstance(n, ast.Name)}
    raise AssertionError(f"{module.name}: no `{alias} = ...` under `if TYPE_CHECKING:`")


@pytest.mark.parametrize(
    ("module", "alias", "registry"),
    [("algo.py", "LossConfig", LOSS_CONFIGS), ("sections.py", "EngineSection", ENGINE_SECTIONS)],
)
def test_the_type_checked_union_names_every_registered_class(module, alias, registry):
    assert _checked_union(CONFIG / module, alias) == {cls.__name__ for cls in registry.values()}
