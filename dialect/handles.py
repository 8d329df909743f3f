"""Erasing ops and changing operands safely, and the IR debug mode (``TASO_DEBUG_IR=1``).

A Python handle (``ir.Value``, ``ir.Operation``, ``OpView``) to an op that has been erased is a
use-after-free in C++: reading it can crash the process or silently read another op that now lives
at that address. Every erasure in ``passes/`` and ``dialect/`` goes through ``erase_op``, every value
a pass puts into the IR through ``create_taso_op`` (``dialect/ops.py``), ``set_operand`` or
``replace_uses``, and every pass and every step of ``taso-search`` runs as a *step* (``ir_step``,
``step``), whose name the internal errors raised in it carry.

``erase_op`` always refuses (a one-line internal error, never a crash) to erase an op whose results
are still used. Outside debug mode it then erases the op at once.

Debug mode (the environment variable ``TASO_DEBUG_IR`` set to anything but ``""`` or ``"0"``; the
test suite turns it on) makes a stale handle safe to read and its use detectable:

- ``erase_op`` does not free the op: it replaces each operand with a placeholder value of the same
  type (so the op no longer counts as a user of live values), detaches it from its block, marks it
  (``taso.erased`` = the step that erased it) and keeps it in a graveyard: the block of a module made
  for that, outside every function, which is freed when the outermost step ends. A stale handle
  reads valid memory until then (its block too: an op detached from every block would crash the
  bindings' ``block`` and ``is_before_in_block`` through a handle taken before); erasing it again is
  an error, and so is moving it back into a function (the checks below find it).
- ``create_taso_op``, ``set_operand`` and ``replace_uses`` refuse a value of an erased op (and
  ``set_operand`` / ``replace_uses`` an erased op or value to change).
- At the end of every step: every op of the step's functions reads only values defined in its own
  function by ops that are in it (no erased op, no op of another function), the MLIR verifier passes
  and every ``taso`` op satisfies its spec (``verify_taso_op``). Where the IR did not verify when the
  outermost step began (a pass run on input that is already invalid), only the first check is made
  for that step, so that no step is blamed for its input.

Each failure is a ``TasoError`` of one line, ``internal error: ... (in <step> > <inner step>)``.
Where a step fails (that error, or any other exception), an op of its functions still reading a
value of an erased op (or of another function) is made to read a placeholder in its own function
instead before the graveyard is freed: the IR is wrong after a failed step anyway, but no op of it
points into freed memory.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager

from .errors import TasoError, one_line
from .mlir import ir

ENV = "TASO_DEBUG_IR"
DEAD_ATTR = "taso.erased"


def debug_enabled() -> bool:
    """Whether the IR debug mode is on (read at each call, so a test can turn it on or off)."""
    return os.environ.get(ENV, "") not in ("", "0")


_steps: list = []  # the active steps' names, outermost first (in and outside debug mode)
_verify: list = []  # per active step of the debug mode: whether the IR is verified at its end
_graveyard: list = []  # (erased op, its operands' placeholder op or None), freed when the outermost step ends
_graveyard_module: list = []  # [the module whose block holds them], made at the first erasure of a step


def _where() -> str:
    return " > ".join(_steps) if _steps else "no pass step"


def internal_error(what: str) -> TasoError:
    """A one-line TasoError for a bug in a pass, naming the step it happened in."""
    return TasoError(f"internal error: {what} (in {_where()})")


def _op(x) -> ir.Operation:
    return x.operation if hasattr(x, "operation") else x


def _describe(op: ir.Operation) -> str:
    return f"'{op.name}' at {op.location}"


def is_dead(op) -> bool:
    """``op`` was erased in debug mode (and is in the graveyard). Reads only what a graveyard op keeps
    valid; outside debug mode an erased op is freed and no handle to it may be read at all."""
    return DEAD_ATTR in _op(op).attributes


def _erased_in(op: ir.Operation) -> str:
    try:
        return str(ir.StringAttr(op.attributes[DEAD_ATTR]).value)
    except Exception:  # noqa: BLE001 - a placeholder's marker is a unit attribute
        return "an earlier step"


def _check_value(v: ir.Value, what: str) -> None:
    """Debug mode: ``v`` is not a result of an erased op (nor of an erased op's operand placeholder)."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return
    p = _op(owner)
    if DEAD_ATTR in p.attributes:
        raise internal_error(f"{what} is a value of {_describe(p)}, which was erased in {_erased_in(p)}")


def check_live(op, what: str) -> None:
    """Debug mode: ``op`` has not been erased (a TasoError naming ``what`` if it has); else nothing."""
    if debug_enabled() and is_dead(op):
        p = _op(op)
        raise internal_error(f"{what} is {_describe(p)}, which was erased in {_erased_in(p)}")


def check_operands(operands, what: str) -> None:
    """Debug mode: none of ``operands`` is a value of an erased op (``create_taso_op`` calls this)."""
    if debug_enabled():
        for k, v in enumerate(operands):
            _check_value(v, f"operand #{k} of {what}")


def set_operand(op, index: int, value: ir.Value) -> None:
    """``op.operands[index] = value``; in debug mode, neither ``op`` nor ``value``'s op may be erased."""
    op = _op(op)
    if debug_enabled():
        check_live(op, "an op whose operand is set")
        _check_value(value, f"the new operand #{index} of {_describe(op)}")
    op.operands[index] = value


def replace_uses(old: ir.Value, new: ir.Value) -> None:
    """``old.replace_all_uses_with(new)``; in debug mode, neither value may be of an erased op."""
    if debug_enabled():
        _check_value(old, "a value whose uses are replaced")
        _check_value(new, "the value that replaces another's uses")
    old.replace_all_uses_with(new)


def erase_op(op) -> None:
    """Erase ``op`` (an Operation or OpView). Its results must have no uses: else a TasoError (an
    internal error naming the op, its user and the step) and nothing is erased. In debug mode the op
    goes to the graveyard instead of being freed (module docstring)."""
    op = _op(op)
    debug = debug_enabled()
    if debug and is_dead(op):
        raise internal_error(f"{_describe(op)} is erased a second time (first in {_erased_in(op)})")
    for r in op.results:
        for u in r.uses:
            user = _op(u.owner)
            raise internal_error(f"erasing {_describe(op)} whose result #{r.result_number} is still used by "
                                 f"{_describe(user)}")
    if not (debug and _verify):  # (outside a step of the debug mode, nothing says when to free it)
        op.erase()
        return
    if not _graveyard_module:
        _graveyard_module.append(ir.Module.create(loc=ir.Location.unknown(op.context)))
    grave = ir.InsertionPoint(_graveyard_module[0].body)
    placeholder = None
    if len(op.operands):
        placeholder = ir.Operation.create("builtin.unrealized_conversion_cast", results=[v.type for v in op.operands],
                                          operands=[], loc=op.location, ip=grave)
        placeholder.attributes[DEAD_ATTR] = ir.UnitAttr.get(op.context)
        for i in range(len(op.operands)):
            op.operands[i] = placeholder.results[i]
    if op.attached:
        op.detach_from_parent()
    grave.insert(op)
    op.attributes[DEAD_ATTR] = ir.StringAttr.get(_where(), op.context)
    _graveyard.append((op, placeholder))


def ops_of(block: ir.Block) -> list:
    """The ops of ``block``, as a list taken now (to walk with ``each_live`` while erasing)."""
    return [o.operation for o in block.operations]


def each_live(ops, what: str = "an op of a list taken before the walk erased any"):
    """Yield ``ops`` (a list taken before a walk that erases ops), checking in debug mode that each is
    not erased when it is reached: such a walk may erase the op it is at and ops before it, never one it
    has yet to reach (outside debug mode that op would be freed memory)."""
    if not debug_enabled():
        yield from ops
        return
    for op in ops:
        check_live(op, what)
        yield op


def _flush() -> None:
    """Free the graveyard: the erased ops, then their placeholders (no longer used by them)."""
    dead = list(_graveyard)
    del _graveyard[:]
    for op, placeholder in dead:
        op.erase()
        if placeholder is not None:
            placeholder.erase()
    del dead
    del _graveyard_module[:]  # (empty now)


def _functions(scope: ir.Operation) -> list:
    if scope.name == "func.func":
        return [scope]
    out = []
    for region in scope.regions:
        for block in region.blocks:
            for o in block.operations:
                p = o.operation
                if p.name == "func.func" and len(p.regions[0].blocks):
                    out.append(p)
    return out


def _check_uses(scope: ir.Operation) -> None:
    """Every op of ``scope``'s functions reads values of its own function: arguments of its block, results
    of ops in its block (by pointer: no attribute or block of an op outside is read unless it is one
    the graveyard keeps)."""
    for f in _functions(scope):
        for block in f.regions[0].blocks:
            ops = [o.operation for o in block.operations]
            live = {hash(p) for p in ops}
            for p in ops:
                if DEAD_ATTR in p.attributes:
                    raise internal_error(f"{_describe(p)}, erased in {_erased_in(p)}, is back in the function")
                for k, v in enumerate(p.operands):
                    owner = v.owner
                    if isinstance(owner, ir.Block):
                        if owner != block:
                            raise internal_error(f"operand #{k} of {_describe(p)} is an argument of another block")
                        continue
                    d = _op(owner)
                    if hash(d) in live:
                        continue
                    if DEAD_ATTR in d.attributes:
                        raise internal_error(f"operand #{k} of {_describe(p)} is a value of {_describe(d)}, which was "
                                             f"erased in {_erased_in(d)}")
                    if len(f.regions[0].blocks) == 1:
                        raise internal_error(f"operand #{k} of {_describe(p)} is a value of {_describe(d)}, which is "
                                             f"not in the function")


def _quarantine(scope: ir.Operation) -> None:
    """After a failed step: every operand of an op of ``scope``'s functions that is not a value of its own
    block (an erased op's, another function's) is replaced by the result of a placeholder op at the
    start of that block, so that freeing the graveyard leaves no op reading freed memory."""
    for f in _functions(scope):
        for block in f.regions[0].blocks:
            ops = [o.operation for o in block.operations]
            live = {hash(p) for p in ops if DEAD_ATTR not in p.attributes}  # (an erased op moved back is not)
            for p in ops:
                for k, v in enumerate(p.operands):
                    owner = v.owner
                    inside = owner == block if isinstance(owner, ir.Block) else hash(_op(owner)) in live
                    if not inside:
                        poison = ir.Operation.create("builtin.unrealized_conversion_cast", results=[v.type], operands=[],
                                                     loc=p.location, ip=ir.InsertionPoint.at_block_begin(block))
                        p.operands[k] = poison.results[0]


#: the checks of one `taso` op against its spec (``ops.verify_taso_op`` adds itself when ``ops`` is
#: imported: ``ops`` builds on this module, so this module does not import it)
OP_CHECKS: list = []


def _verified(scope: ir.Operation, specs: bool = True) -> str:
    """'' where ``scope`` passes the MLIR verifier and (``specs``) every `taso` op its spec, else why not."""
    try:
        if not scope.verify():
            return "the MLIR verifier failed"
    except ir.MLIRError as e:
        diags = getattr(e, "error_diagnostics", None)
        return f"{diags[0].location}: {diags[0].message}" if diags else one_line(e)
    if not specs:
        return ""
    for f in _functions(scope):
        for block in f.regions[0].blocks:
            for o in block.operations:
                p = o.operation
                if p.name.startswith("taso."):
                    try:
                        for check in OP_CHECKS:
                            check(p)
                    except TasoError as e:
                        return str(e)
    return ""


@contextmanager
def step(name: str, scope, specs: bool = True):
    """Run the body as a step named ``name`` over ``scope`` (a function or a module op): its name is in
    the internal errors raised meanwhile; in debug mode its IR is checked when it ends (module
    docstring; ``specs`` False leaves the spec checks, the costly part, to an enclosing step: the
    replay's rewrites, each a step, are checked against the specs together when the replay ends)."""
    if not debug_enabled():
        _steps.append(name)
        try:
            yield
        finally:
            _steps.pop()
        return
    scope = _op(scope)
    outermost = not _verify
    verify = (not _verified(scope)) if outermost else _verify[-1]
    _steps.append(name)
    _verify.append(verify)
    ok = False
    try:
        yield
        if not is_dead(scope):
            _check_uses(scope)
            if verify:
                why = _verified(scope, specs)
                if why:
                    raise internal_error(f"the IR is invalid after this step: {why}")
        ok = True
    finally:
        _steps.pop()
        _verify.pop()
        if outermost:
            if not ok and not is_dead(scope):
                _quarantine(scope)
            _flush()


def ir_step(fn=None, *, name: str = ""):
    """Decorator: the function (whose first argument is the function or module op it changes) runs as a
    step (``step``) named ``name`` or its own name."""
    def deco(fn):
        label = name or fn.__name__

        @functools.wraps(fn)
        def wrapper(scope, *args, **kwargs):
            with step(label, scope):
                return fn(scope, *args, **kwargs)
        return wrapper

    return deco(fn) if fn is not None else deco
