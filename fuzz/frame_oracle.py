"""The reference's frame decoder, written from spec section 3.2 (run by the
frame-diff fuzz target, fuzz/fuzz-frame-diff.c, in its embedded CPython).

This is the decision procedure of adk-code-mode's decoder as the spec states
it, kept apart from forkbox's own Python decoder (src/pyrt/py/.../protocol.py)
on purpose: the target holds forkbox to *this* file, so it must not share
code with what it judges. Read it next to the spec:

  0. The bytes are UTF-8 text. A WebSocket text message that is not valid
     UTF-8 never reaches the reference's decoder: the library closes with
     1007 (spec 1.4); a stream line that is not is "a line that cannot be
     decoded" (8.2). Both refuse it, so here it is an error ("utf8").
  1. Strip all trailing \\r and \\n. Nothing left: error.
  2. json.loads with Python's defaults: NaN, Infinity and -Infinity
     accepted; the last of duplicate keys wins; integers of at most 4300
     digits (sys.int_info.default_max_str_digits, Python >= 3.11 and the
     security releases before it: a longer one is a ValueError, i.e. a parse
     failure); nesting as deep as the interpreter's recursion limit allows.
     Anything else, or more than one value: error.
  3. An object whose "kind" is a string naming one of the eight kinds.
  4. tool_result: a non-null "error" must be an object; its "type" becomes
     str(type) (default "Error"), "message" str(message) (default ""),
     "trace" is taken as it is (default None).
  5. Unknown keys dropped, missing keys defaulted, no other type checks.

decode(data) returns ("ok", canon, kind, {field: value}) or ("error",
reason); canon is a text that names the kind and every field's value with
its exact Python type (canon() below), so two decodes agree iff their canon
texts are equal.
"""

import json

# Spec 3.3: each kind's fields and defaults, in the reference's order.
FIELDS = {
    "ready": (("protocol_version", 2), ("python_version", ""), ("packages", {})),
    "run": (("code", ""),),
    "tool_call": (("id", ""), ("name", ""), ("args", {}), ("timeout", None)),
    "tool_result": (("id", ""), ("ok", True), ("value", None), ("error", None)),
    "log": (("level", "info"), ("msg", "")),
    "done": (("exit_code", 0),),
    "output": (("stdout", ""), ("stderr", ""), ("exit_code", 0)),
    "shutdown": (),
}


class ErrorInfo:
    """tool_result.error after step 4 (the reference's ErrorInfo dataclass)."""

    def __init__(self, type_, message, trace):
        self.type, self.message, self.trace = type_, message, trace


def decode(data):
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return ("error", "utf8")
    text = text.rstrip("\r\n")
    if not text:
        return ("error", "empty")
    try:
        obj = json.loads(text)
    except RecursionError:
        return ("error", "depth")
    except ValueError:  # JSONDecodeError, and the 4300-digit limit
        return ("error", "json")
    if not isinstance(obj, dict):
        return ("error", "not an object")
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in FIELDS:
        return ("error", "kind")
    values = []
    for name, default in FIELDS[kind]:
        v = obj.get(name, default)
        if kind == "tool_result" and name == "error" and v is not None:
            if not isinstance(v, dict):
                return ("error", "error is not an object")
            try:
                v = ErrorInfo(str(v.get("type", "Error")), str(v.get("message", "")),
                              v.get("trace"))
            except RecursionError:  # str() of a deeply nested value
                return ("error", "depth")
        values.append((name, v))
    return ("ok", canon_frame(kind, values), kind, dict(values))


def canon_frame(kind, values):
    return kind + "{" + ",".join(name + "=" + canon(v) for name, v in values) + "}"


def canon(v):
    """The value with its exact type: True is not 1, 1 is not 1.0, -0.0 is
    not 0.0, NaN equals NaN, a lone surrogate is itself, key order and
    duplicates as the dict holds them. Iterative: values nest ~1000 deep."""
    out = []
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, _Mark):  # punctuation pushed below
            out.append(x.text)
        elif x is None:
            out.append("n")
        elif x is True or x is False:
            out.append("b" + str(int(x)))
        elif isinstance(x, int):
            out.append("i" + hex(x))  # hex: no digit limit
        elif isinstance(x, float):
            out.append("f" + x.hex())
        elif isinstance(x, str):
            out.append("s" + ascii(x))
        elif isinstance(x, list):
            out.append("[")
            stack.append(_CLOSE)
            for e in reversed(x):
                stack += (_COMMA, e)
        elif isinstance(x, dict):
            out.append("{")
            stack.append(_CLOSE)
            for k, e in reversed(list(x.items())):
                stack += (_COMMA, e, _COLON, k)
        elif type(x).__name__ == "ErrorInfo":  # ours, or the runtime's dataclass
            out.append("E(")
            stack.append(_CLOSE)
            for e in reversed((x.type, x.message, x.trace)):
                stack += (_COMMA, e)
        else:
            raise TypeError("unexpected value of type " + type(x).__name__)
    return "".join(out)


class _Mark:
    """Punctuation on canon()'s stack (never taken for a value)."""

    def __init__(self, text):
        self.text = text


_CLOSE, _COMMA, _COLON = _Mark(")"), _Mark(","), _Mark(":")


def canon_values(kind, obj):
    """canon_frame() of a decoded frame object with the reference's shape
    (forkbox's runtime decoder returns dataclasses with these attributes)."""
    return canon_frame(kind, [(name, getattr(obj, name)) for name, _ in FIELDS[kind]])
