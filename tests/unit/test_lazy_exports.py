"""``lazy_exports.lazy_attributes``, the one PEP 562 mechanism of the package's lazy name tables: the defining module
is imported at the first lookup (not at the package's import), the value is then a plain attribute; a
``(module, attribute path)`` target, a submodule, ``dir()`` and an unknown name behave as documented."""
import sys

import pytest

PACKAGE_SOURCE = '''
from paddletrainer.lazy_exports import lazy_attributes

_NAMES = {"VALUE": "heavy", "method": ("heavy", "Owner.method")}
__getattr__, __dir__ = lazy_attributes(globals(), _NAMES, ("tool",))
'''


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "lazy_probe_pkg"
    root.mkdir()
    (root / "__init__.py").write_text(PACKAGE_SOURCE)
    (root / "heavy.py").write_text("VALUE = 41\n\nclass Owner:\n    def method(self):\n        return 42\n")
    (root / "tool.py").write_text("NAME = 'tool'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazy_probe_pkg
    yield lazy_probe_pkg
    for name in [m for m in sys.modules if m == "lazy_probe_pkg" or m.startswith("lazy_probe_pkg.")]:
        del sys.modules[name]


def test_a_name_imports_its_module_at_first_lookup_and_is_then_a_plain_attribute(package):
    assert "lazy_probe_pkg.heavy" not in sys.modules
    assert package.VALUE == 41
    assert "lazy_probe_pkg.heavy" in sys.modules
    assert vars(package)["VALUE"] == 41  # cached: the next lookup does not go through __getattr__


def test_an_attribute_path_target_and_a_submodule_resolve(package):
    assert package.method is sys.modules["lazy_probe_pkg.heavy"].Owner.method
    assert package.tool.NAME == "tool"


def test_dir_lists_unresolved_names_and_an_unknown_name_is_an_attribute_error(package):
    assert {"VALUE", "method", "tool"} <= set(dir(package))
    assert "lazy_probe_pkg.heavy" not in sys.modules
    with pytest.raises(AttributeError, match="module 'lazy_probe_pkg' has no attribute 'missing'"):
        package.missing
