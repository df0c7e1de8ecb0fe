"""A strict parser for the expression strings of a serialized ExportedProgram.

torch's program deserializer evaluates several strings of an ``*.ep.json`` file: symbolic shapes
(``{"as_expr": {"expr_str": ...}}``) go to ``sympy.sympify``, which ``eval``s them, and the
program's ``guards_code`` is compiled into a Python function by ``ExportedProgram.module()``. A
tampered file can therefore run any code. Each such string must first be accepted here: a small
tokenizer and recursive-descent parser (no ``eval``, no sympy) that accept only what torch 2.13
writes and refuse everything else with an :class:`ExprError` giving the position.

Three languages (checked on exports of real dynamic programs: derived dims, modulo
constraints, unbacked sizes, float scales):

* :func:`check_sym_expr`: ``sympy.srepr`` text, which torch writes for every symbolic value::

      Add(Mul(Integer(2), Symbol('s40', positive=True, integer=True)), Integer(1))
      Equality(Mod(Symbol('u0', integer=True), Integer(2)), Integer(0))
      TruncToInt(Mul(Float('1.5', precision=53), ToFloat(Symbol('s53', integer=True))))

  and the ``str()`` form (``2*s40 + 1``, ``(s0//2)``, ``Max(s0, 3)``), which keys the range
  constraints. Names are symbols (``s0``, ``u12``, ``zf3``), sympy/torch function names of a
  fixed list, or ``true``/``false``/``oo``; numbers are integers (floats only as
  ``Float('1.5', precision=53)``); operators ``+ - * / // % **``; no attribute access,
  subscripts, strings (except a ``Symbol``'s name and a ``Float``'s digits), lambdas or
  keywords other than sympy assumptions. Powers and shifts take a small literal or a symbol as
  exponent and do not nest, so a constant cannot make sympy compute a huge number.
* :func:`check_guard`: a guard as torch prints it (``L['x'].size()[0] <= 1024``,
  ``((-1) + L['x'].size()[0]) == L['y'].size()[0]``): Python comparisons, ``and``/``or``/
  ``not``, ``a if c else b``, arithmetic, inputs reached from ``L`` by ``['key']``, ``[0]`` and
  ``.field`` and read by ``.size()[i]``, ``.stride()[i]``, ``.storage_offset()``, ``.dim()``,
  calls of a fixed list of functions (``max``, ``math.floor``, ``torch.sym_float``, ...), and
  string literals of letters, digits and ``_.:+-`` only (a guard is pasted into generated code).
* :func:`check_target`: an operator name of a node (``torch.ops.aten.add.Tensor``,
  ``_operator.mul``, ``math.trunc``, ``torch.sym_max``).

Inputs are bounded (length, nesting depth, digits of a number, digits of a symbol's index).
"""

from __future__ import annotations

import re

__all__ = ["ExprError", "check_guard", "check_sym_expr", "check_sym_key", "check_target"]

MAX_LENGTH = 100_000
MAX_DEPTH = 100
MAX_INT_DIGITS = 40
MAX_POWER_EXPONENT = 64

_SYMBOL = re.compile(r"[a-z]{1,6}_?[0-9]{1,6}")  # s0, u12, zf3, zuf1, ps4, r0_2
_FLOAT_TEXT = re.compile(r"-?[0-9]{1,40}(\.[0-9]{0,40})?([eE][-+]?[0-9]{1,4})?|[-+]?inf|nan")
_STRING_TEXT = re.compile(r"[A-Za-z0-9_.:+\- ]{0,200}")

# sympy's own classes (srepr names and their str() aliases) and torch's sympy functions, as
# torch's deserializer knows them (torch/_export/serde/serialize.py, sympy_functions).
_SYM_FUNCTIONS = frozenset(
    {
        "Add", "Mul", "Pow", "Max", "Min", "Abs", "floor", "ceiling", "Piecewise",
        "ExprCondPair", "Equality", "Unequality", "GreaterThan", "StrictGreaterThan",
        "LessThan", "StrictLessThan", "Eq", "Ne", "Ge", "Gt", "Le", "Lt", "And", "Or", "Not",
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
        "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow",
        "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat",
        "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
    }
)  # fmt: skip
_SYM_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"})
_SYM_CONSTANTS = frozenset({"true", "false", "True", "False", "oo", "zoo", "nan", "int_oo"})
# sympy assumptions a Symbol may carry (keyword arguments of Symbol(...)).
_ASSUMPTIONS = frozenset(
    {
        "integer", "positive", "negative", "nonnegative", "nonpositive", "nonzero", "zero",
        "real", "finite", "infinite", "rational", "irrational", "even", "odd", "prime",
        "composite", "commutative", "complex", "extended_real", "extended_positive",
        "extended_negative", "extended_nonnegative", "extended_nonpositive",
        "extended_nonzero", "algebraic", "transcendental", "imaginary", "hermitian",
        "antihermitian", "noninteger",
    }
)  # fmt: skip

# What ShapeGuardPythonPrinter writes in guards (and what the guard function's namespace holds).
_GUARD_FUNCTIONS = frozenset(
    {
        "abs", "min", "max", "round", "int", "float", "math.floor", "math.ceil", "math.trunc",
        "math.sqrt", "math.isnan", "math.isinf", "math.isfinite", "torch.sym_float",
        "torch.sym_int", "torch.sym_max", "torch.sym_min", "torch.sym_sqrt", "torch.sym_ite",
        "torch.sym_not", "IntInfinity", "NegativeIntInfinity", "Where",
        "IsNonOverlappingAndDenseIndicator",
    }
)  # fmt: skip
_GUARD_CONSTANTS = frozenset({"True", "False", "None", "inf", "math.inf", "math.pi", "math.e"})
_GUARD_KEYWORDS = frozenset({"and", "or", "not", "if", "else", "is", "in"})
_SOURCE_METHODS_INDEXED = frozenset({"size", "stride"})
_SOURCE_METHODS = frozenset({"storage_offset", "dim", "numel"})
_COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})

# Node targets: what torch's serializer writes for an op (torch.ops...), the Python operators,
# math and torch.sym_* functions of its symbolic ops, and the grad/autocast markers of
# pre-dispatch graphs.
_TARGET_OPS = re.compile(r"torch\.ops(\.[A-Za-z_][A-Za-z0-9_]*){1,3}")
_TARGET_EXTENSION = re.compile(r"#[A-Za-z_][A-Za-z0-9_]*:[A-Za-z_][A-Za-z0-9_.]*")
_TARGET_FUNCTIONS = frozenset(
    {f"_operator.{n}" for n in (
        "getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg", "pos",
        "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "abs",
        "lshift", "rshift",
    )}
    | {f"math.{n}" for n in ("trunc", "floor", "ceil", "sqrt")}
    | {f"torch.{n}" for n in (
        "sym_not", "sym_int", "sym_float", "sym_ite", "sym_max", "sym_min", "sym_sqrt",
        "sym_sum",
    )}
    | {
        "torch._C._set_grad_enabled",
        "torch.amp.autocast_mode._enter_autocast",
        "torch.amp.autocast_mode._exit_autocast",
    }
)  # fmt: skip

_TOKEN = re.compile(
    r"""(?P<ws>[ ]+)
    |(?P<float>[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)
    |(?P<int>[0-9]+)
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<str>'[^'"\\\n\r{}]*'|"[^'"\\\n\r{}]*")
    |(?P<op>//|\*\*|==|!=|<=|>=|[-+*/%()<>,=\[\].])""",
    re.VERBOSE,
)


class ExprError(ValueError):
    """An expression string that is not one torch writes (``where``: its character offset)."""

    def __init__(self, message: str, where: int | None = None):
        super().__init__(message if where is None else f"{message} (at character {where})")


def _tokens(text: object) -> list[tuple[str, str, int]]:
    if not isinstance(text, str):
        raise ExprError(f"expected a string, found {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"{len(text)} characters, more than the {MAX_LENGTH} allowed")
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExprError(f"unexpected character {text[pos]!r}", pos)
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            out.append((kind, m.group(), pos))
        pos = m.end()
    out.append(("end", "", pos))
    return out


class _Parser:
    def __init__(self, text: object):
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0
        self.powers = 0  # power (and shift) nodes parsed so far

    # -- helpers -------------------------------------------------------------------------------

    def peek(self, k: int = 0) -> tuple[str, str, int]:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def at(self, value: str) -> bool:
        kind, text, _ = self.peek()
        return kind in ("op", "name") and text == value

    def take(self) -> tuple[str, str, int]:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        kind, text, pos = self.take()
        if text != value or kind not in ("op", "name"):
            raise ExprError(f"expected {value!r}, found {text or 'the end'!r}", pos)

    def error(self, what: str) -> ExprError:
        _, text, pos = self.peek()
        return ExprError(f"{what}, found {text or 'the end'!r}", pos)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH} levels")

    def leave(self) -> None:
        self.depth -= 1

    def finish(self) -> None:
        if self.peek()[0] != "end":
            raise self.error("unexpected text after the expression")

    def int_literal(self) -> int:
        kind, text, pos = self.take()
        if kind != "int":
            raise ExprError(f"expected an integer, found {text or 'the end'!r}", pos)
        if len(text) > MAX_INT_DIGITS:
            raise ExprError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})", pos)
        return int(text)

    def signed_int(self) -> int:
        negative = self.at("-")
        if negative:
            self.take()
        value = self.int_literal()
        return -value if negative else value

    # -- arithmetic, shared by both languages --------------------------------------------------

    def arith(self) -> None:
        self.enter()
        self.product()
        while self.at("+") or self.at("-"):
            self.take()
            self.product()
        self.leave()

    def product(self) -> None:
        self.unary()
        while any(self.at(op) for op in ("*", "/", "//", "%")):
            self.take()
            self.unary()

    def unary(self) -> None:
        if self.at("-") or (self.guard and self.at("+")):
            self.take()
            self.enter()
            self.unary()
            self.leave()
            return
        powers = self.powers
        self.atom()
        if self.at("**"):
            self.no_power_since(powers)
            self.take()
            self.exponent()

    def no_power_since(self, powers: int) -> None:
        """Refuses a power whose base holds a power (``powers``: the count before the base)."""
        self.powers += 1
        if self.powers - 1 != powers:
            raise self.error("a power of a power (torch writes none; it could make a huge number)")

    def exponent(self) -> None:
        """The exponent of a power (or the amount of a shift): a literal of at most
        MAX_POWER_EXPONENT in magnitude, or a symbol (a guard: an input's value)."""
        negative = self.at("-")
        kind, text, pos = self.peek(1 if negative else 0)
        too_big = ExprError(f"an exponent larger than {MAX_POWER_EXPONENT}", pos)
        if kind == "int":
            if negative:
                self.take()
            if self.int_literal() > MAX_POWER_EXPONENT:
                raise too_big
            return
        if kind == "float" and self.guard:
            if negative:
                self.take()
            self.take()
            if abs(float(text)) > MAX_POWER_EXPONENT:
                raise too_big
            return
        if kind == "name" and not negative:
            literal = text in ("Integer", "Rational", "Float") and not self.guard
            if (
                literal
                or _SYMBOL.fullmatch(text)
                or text == "Symbol"
                or (self.guard and text == "L")
            ):
                powers = self.powers
                self.last_literal_small = True
                self.atom()
                if self.powers != powers:  # pragma: no cover - a symbol holds no power
                    raise too_big
                if not self.last_literal_small:
                    raise too_big
                return
        raise ExprError(
            f"an exponent must be a literal of at most {MAX_POWER_EXPONENT} or a symbol", pos
        )

    guard = False
    last_literal_small = True

    def atom(self) -> None:
        raise NotImplementedError


class _SymParser(_Parser):
    """srepr and str() text of sympy expressions over torch's symbols."""

    def atom(self) -> None:
        kind, text, pos = self.take()
        if kind == "int":
            self.i -= 1
            self.int_literal()
            return
        if text == "(" and kind == "op":
            self.arith()
            self.expect(")")
            return
        if kind != "name":
            raise ExprError(f"unexpected {text or 'end'!r}", pos)
        if not self.at("("):
            if text in _SYM_CONSTANTS or _SYMBOL.fullmatch(text):
                return
            raise ExprError(f"{text!r} is not a symbol or a constant torch writes", pos)
        self.take()  # "("
        self.enter()
        if text == "Symbol":
            self.symbol(pos)
        elif text == "Integer":
            self.last_literal_small = abs(self.signed_int()) <= MAX_POWER_EXPONENT
        elif text == "Rational":
            a = self.signed_int()
            self.expect(",")
            b = self.signed_int()
            self.last_literal_small = abs(a) <= MAX_POWER_EXPONENT and abs(b) <= MAX_POWER_EXPONENT
        elif text == "Float":
            self.float_literal()
        elif text in _SYM_FUNCTIONS:
            self.arguments(power=text in _SYM_POWERS)
        else:
            raise ExprError(f"{text!r} is not a function torch writes", pos)
        self.expect(")")
        self.leave()

    def symbol(self, pos: int) -> None:
        kind, text, spos = self.take()
        if kind != "str" or not _SYMBOL.fullmatch(text[1:-1]):
            raise ExprError(f"Symbol({text}...): not a symbol name torch writes", spos)
        while self.at(","):
            self.take()
            kind, name, kpos = self.take()
            if kind != "name" or name not in _ASSUMPTIONS:
                raise ExprError(f"{name!r} is not a sympy assumption", kpos)
            self.expect("=")
            kind, value, vpos = self.take()
            if value not in ("True", "False"):
                raise ExprError(f"assumption {name} = {value!r}: expected True or False", vpos)

    def float_literal(self) -> None:
        kind, text, pos = self.take()
        if kind != "str" or not _FLOAT_TEXT.fullmatch(text[1:-1]):
            raise ExprError(f"Float({text}...): not a decimal number", pos)
        try:
            self.last_literal_small = abs(float(text[1:-1])) <= MAX_POWER_EXPONENT
        except ValueError:  # pragma: no cover - the pattern admits only numbers
            self.last_literal_small = False
        if self.at(","):
            self.take()
            self.expect("precision")
            self.expect("=")
            if not 1 <= self.int_literal() <= 4096:
                raise self.error("a Float precision outside 1..4096")

    def arguments(self, *, power: bool) -> None:
        if self.at(")"):
            return
        if power:
            powers = self.powers
            self.arith()
            self.no_power_since(powers)
            self.expect(",")
            self.exponent()
            return
        self.arith()
        while self.at(","):
            self.take()
            self.arith()


class _GuardParser(_Parser):
    """Python guard expressions as ShapeGuardPythonPrinter writes them."""

    guard = True

    def expression(self) -> None:
        self.enter()
        self.disjunction()
        if self.at("if"):
            self.take()
            self.disjunction()
            self.expect("else")
            self.expression()
        self.leave()

    def disjunction(self) -> None:
        self.conjunction()
        while self.at("or"):
            self.take()
            self.conjunction()

    def conjunction(self) -> None:
        self.negation()
        while self.at("and"):
            self.take()
            self.negation()

    def negation(self) -> None:
        if self.at("not"):
            self.take()
            self.enter()
            self.negation()
            self.leave()
            return
        self.arith()
        while self.peek()[0] == "op" and self.peek()[1] in _COMPARISONS:
            self.take()
            self.arith()

    def atom(self) -> None:
        kind, text, pos = self.take()
        if kind == "int":
            self.i -= 1
            self.int_literal()
            return
        if kind == "float":
            if len(text) > 2 * MAX_INT_DIGITS:
                raise ExprError("a number of too many digits", pos)
            return
        if kind == "str":
            if not _STRING_TEXT.fullmatch(text[1:-1]):
                raise ExprError(f"string {text} holds other than letters, digits, _.:+-", pos)
            return
        if kind == "op" and text == "(":
            self.expression()
            self.expect(")")
            return
        if kind != "name" or text in _GUARD_KEYWORDS:
            raise ExprError(f"unexpected {text or 'end'!r}", pos)
        if text == "L":
            self.source(pos)
            return
        name = text
        while self.at(".") and self.peek(1)[0] == "name":
            self.take()
            name += "." + self.take()[1]
        if self.at("("):
            if name not in _GUARD_FUNCTIONS:
                raise ExprError(f"{name!r} is not a function torch writes in guards", pos)
            self.take()
            self.enter()
            if not self.at(")"):
                self.expression()
                while self.at(","):
                    self.take()
                    self.expression()
            self.expect(")")
            self.leave()
            return
        if name not in _GUARD_CONSTANTS and not _SYMBOL.fullmatch(name):
            raise ExprError(f"{name!r} is not an input, symbol or constant of a guard", pos)

    def source(self, pos: int) -> None:
        """``L`` then ``['key']``/``[0]``/``.field`` steps, then optionally a size read."""
        if not (self.at("[") and self.peek(1)[0] == "str"):
            raise ExprError("'L' must be followed by an input name such as ['x']", pos)
        while True:
            if self.at("["):
                self.take()
                kind, text, kpos = self.take()
                if kind == "str":
                    if not _STRING_TEXT.fullmatch(text[1:-1]):
                        raise ExprError(f"input key {text} is not a plain name", kpos)
                elif kind == "int":
                    self.i -= 1
                    self.int_literal()
                else:
                    raise ExprError(
                        f"an input key must be a string or an index, found {text!r}", kpos
                    )
                self.expect("]")
            elif self.at(".") and self.peek(1)[0] == "name":
                self.take()
                _, field, fpos = self.take()
                if field.startswith("_"):
                    raise ExprError(
                        f"attribute {field!r} of an input (names start with a letter)", fpos
                    )
                if field in _SOURCE_METHODS_INDEXED or field in _SOURCE_METHODS:
                    self.expect("(")
                    self.expect(")")
                    if field in _SOURCE_METHODS_INDEXED:
                        self.expect("[")
                        self.int_literal()
                        self.expect("]")
                    break
            else:
                break


def check_sym_expr(text: object) -> None:
    """Accepts a symbolic expression (srepr or str form) as torch writes it; else ExprError."""
    p = _SymParser(text)
    p.arith()
    p.finish()


def check_sym_key(text: object) -> None:
    """Accepts a range-constraint key (``s0``, ``2*s40 + 1``, ``6*s69``); else ExprError."""
    check_sym_expr(text)


def check_guard(text: object) -> None:
    """Accepts a guard as torch prints it into ``guards_code``; else ExprError."""
    p = _GuardParser(text)
    p.expression()
    p.finish()


def check_target(text: object) -> None:
    """Accepts a node target (an operator name) as torch's serializer writes it."""
    if not isinstance(text, str):
        raise ExprError(f"expected a string, found {type(text).__name__}")
    if len(text) > 500:
        raise ExprError(f"an operator name of {len(text)} characters")
    if text in _TARGET_FUNCTIONS or _TARGET_EXTENSION.fullmatch(text):
        return
    m = _TARGET_OPS.fullmatch(text)
    if m and "__" not in text:
        return
    raise ExprError(f"{text!r} is not an operator torch writes")
