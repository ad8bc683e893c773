"""A griffe extension for the API reference: reads this package's reST-flavoured docstrings.

The docstrings use ``:param name:`` fields and may go on with free text after them; griffe's Sphinx
parser would file that text under the last parameter, so it is moved before the fields. Sphinx roles
(``:class:`X```) become code spans, and a ``::`` literal-block marker a plain colon. Only the
rendered copy changes: the source is read, never written.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_FIELD = re.compile(r":(param|type|raises?|returns?|rtype|var|ivar|cvar)\b[^:]*:")
_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):`~?([^`]+)`")


def rewrite(text: str) -> str:
    lines = _ROLE.sub(r"``\1``", text).split("\n")
    fields = [i for i, line in enumerate(lines) if _FIELD.match(line)]
    if fields:
        end = fields[-1] + 1  # past the last field's continuation lines (indented) and blank lines
        while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
            end += 1
        if end < len(lines):
            trailing = lines[end:]
            lines = [*lines[:fields[0]], *trailing, "", *lines[fields[0]:end]]
    out = []
    for line in lines:
        if line.strip() == "::":
            continue
        out.append(line[:-1] if line.endswith("::") else line)
    return "\n".join(out).strip("\n")


class RstFields(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
