"""mypy plug-in: ``X = choices("X", values)`` (flowerbed.clients.core.params) defines a class.

``choices`` builds a ``StrEnum`` whose member names are its values (``scale-free`` included), from
any iterable, so mypy cannot read it as its functional enum syntax and would see a variable of type
``type[StrEnum]``, not a type a field may be annotated with. This hook declares ``X`` a subclass
of ``StrEnum``; its members, not known statically, read as ``StrEnum`` members' values would
(attribute access falls back to ``Any``, as for a class mypy cannot see into).
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.nodes import GDEF, Block, ClassDef, SymbolTable, SymbolTableNode, TypeInfo
from mypy.plugin import DynamicClassDefContext, Plugin
from mypy.types import Instance

CHOICES = "flowerbed.clients.core.params.choices"


def _declare_enum(ctx: DynamicClassDefContext) -> None:
    base = ctx.api.lookup_fully_qualified_or_none("enum.StrEnum")
    if base is None or not isinstance(base.node, TypeInfo):
        ctx.api.defer()
        return
    class_def = ClassDef(ctx.name, Block([]))
    class_def.fullname = ctx.api.qualified_name(ctx.name)
    info = TypeInfo(SymbolTable(), class_def, ctx.api.cur_mod_id)
    class_def.info = info
    info.bases = [Instance(base.node, [])]
    info.mro = [info, *base.node.mro]
    info.metaclass_type = base.node.metaclass_type
    info.fallback_to_any = True
    ctx.api.add_symbol_table_node(ctx.name, SymbolTableNode(GDEF, info))


class ChoicesPlugin(Plugin):
    def get_dynamic_class_hook(
        self, fullname: str
    ) -> Callable[[DynamicClassDefContext], None] | None:
        return _declare_enum if fullname == CHOICES else None


def plugin(version: str) -> type[Plugin]:
    return ChoicesPlugin
