"""Old module names kept for a release: ``import OLD`` warns (DeprecationWarning) and gives the new module itself.

A package whose modules moved calls ``alias_moved(__name__, {old_name: "new.module"})`` from its ``__init__``: the
old name then imports as the very object of the new one (what is set on one is set on the other, and objects
pickled under the old name load), while the module keeps its own ``__spec__`` (a reload or a pickle names the new
place).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.own_spec  # the import system set the old name's spec on it: give its own back


class _Moved(importlib.abc.MetaPathFinder):
    def __init__(self, package: str, table: dict[str, str]) -> None:
        self.package, self.table = package, table

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != self.package or name not in self.table:
            return None
        warnings.warn(f"{fullname} is now {self.table[name]}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(self.table[name]))


def alias_moved(package: str, table: dict[str, str]) -> None:
    """Let ``package.NAME`` import as ``table[NAME]`` (a dotted module name), with a DeprecationWarning."""
    if not any(isinstance(f, _Moved) and f.package == package for f in sys.meta_path):
        sys.meta_path.insert(0, _Moved(package, table))
