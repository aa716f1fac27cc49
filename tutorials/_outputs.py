"""What of a notebook's outputs must be reproduced, and how closely, when it runs again on any machine.

A fit on another processor gives other last digits (torch does not promise bitwise reproducibility
across CPUs), and downstream of them other Leiden clusters and DE call sets. So a fresh run is
compared with the stored notebook by what it *claims*, not by its text:

* every word must match: verdicts, which rows agree, sentences, table headers and row labels, the
  figures present (images themselves are left out), and the number of outputs and lines;
* every number must match exactly, unless a :class:`Tolerance` of the notebook's own
  (``tutorials/checks.py``) covers it: then it may move by the tolerance, which each rule states and
  justifies from the notebook's Monte Carlo error or seed-to-seed spread, plus one unit of its last
  printed digit (rounding);
* words that are coordinates of one fit (which latent dimension correlates best with a marker) may be
  masked by a :class:`MaskedWords` rule;
* lines whose words depend on every float (a table sorted by a fitted value, clusters by cell type)
  are named by a :class:`FreeLines` rule and compared instead by an :class:`Agreement` over the
  objects they show (ARI of cluster labels, Jaccard of gene sets), computed in the notebook's kernel
  after its last cell, against a bound.

Timings, progress bars, memory addresses, temporary and installation paths, line numbers in warnings
and dates are volatile on every run and replaced by placeholders first (:func:`normalise`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import nbformat

#: Text formats of a display that are compared (images and widget views are not).
TEXT_MIME = ("text/plain", "text/html", "text/markdown", "text/latex", "application/json")

_TIME_UNIT = r"(?:ms|us|µs|s|sec|secs|seconds?|min|mins|minutes?|h|hours?)"
_SUBSTITUTIONS = [
    # embedded images inside HTML (a figure in a report summary) are figures too
    (re.compile(r"data:image/[a-z+]+;base64,[A-Za-z0-9+/=\s]+"), "data:image;base64,<figure>"),
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0x<address>"),
    # dates and clock times, then durations: "12.3 s", "4 min", "0:01:02", "3.2 it/s"
    (re.compile(r"\b\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?\b"), "<date>"),
    (re.compile(r"\b\d+(:\d{2}){1,2}(\.\d+)?\b"), "<clock>"),
    (re.compile(rf"\b\d+(\.\d+)?(e[+-]?\d+)?\s?{_TIME_UNIT}\b(?!\w)"), "<duration>"),
    (re.compile(r"\b\d+(\.\d+)?\s?(it/s|s/it)"), "<rate>"),
    # paths that depend on where the repository, the environment or a temporary folder is
    (re.compile(r"/tmp/[^\s'\"<>)]+"), "<tmp>"),
    (re.compile(r"(?:/[^\s'\"<>:]+)?/site-packages/"), "<site-packages>/"),
    (re.compile(r"\S*/countvae/(?=[\w/]+\.py)"), "<countvae>/"),
    (re.compile(r"(\.py):\d+"), r"\1:<line>"),
]
#: A progress bar line (tqdm and Lightning draw them on stderr): "42%|████      | 21/50".
_PROGRESS = re.compile(r"\d+%\|.*\|")
#: A number standing on its own (not part of a name such as CD14, z5 or seed_0).
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w])")
#: The marker before the kernel's JSON of agreement objects in the probe cell's output.
CLAIMS_MARKER = "<<countvae-tutorial-claims>>"


@dataclass(frozen=True)
class Tolerance:
    """Numbers on the matching lines of some code cells may move by ``abs + rel * |value|``.

    Parameters
    ----------
    cells
        Code cells (1-based, as in the failure messages) the rule covers.
    abs, rel
        The absolute and relative tolerance; one unit of the number's last printed digit is added,
        since a value that moves by the tolerance can print one digit further away.
    why
        Where the tolerance comes from (the Monte Carlo error or seed-to-seed spread it is derived
        from); stated so that a reader can judge it.
    line
        A regular expression; only lines that contain a match are covered (all lines when None).
    integers
        Whether integers are covered too (counts of DE calls, of genes per group); otherwise an
        integer (a shape, a seed, a number of cells) must match exactly.
    below
        Only numbers whose stored magnitude is below this are covered (rounding noise such as a
        maximum difference of 4e-13 nats beside numbers that must match more closely).
    above
        Only numbers whose stored magnitude is at least this are covered (one column of a table whose
        values lie in another range than the others', such as the largest principal angle).
    suffix
        Only numbers followed directly by this text are covered (``"%"``: percentages).
    prefix
        Only numbers preceded directly by this text are covered (``"ica "``: one entry of a line that lists
        several quantities, each with its own tolerance).
    """

    cells: tuple[int, ...]
    abs: float = 0.0
    rel: float = 0.0
    why: str = ""
    line: str | None = None
    integers: bool = False
    below: float | None = None
    above: float | None = None
    suffix: str | None = None
    prefix: str | None = None

    def covers(self, cell: int, line: str, number: re.Match) -> bool:
        """Whether this rule applies to ``number`` (a match on the stored ``line``) of code cell ``cell``."""
        if cell not in self.cells or (self.line is not None and re.search(self.line, line) is None):
            return False
        if self.suffix is not None and not line[number.end() :].startswith(self.suffix):
            return False
        if self.prefix is not None and not line[: number.start()].endswith(self.prefix):
            return False
        magnitude = abs(float(number.group()))
        return (self.below is None or magnitude < self.below) and (self.above is None or magnitude >= self.above)

    def allows(self, stored: str, fresh: str) -> bool:
        """Whether the printed number ``fresh`` is within this tolerance of ``stored``."""
        if _is_integer(stored) and _is_integer(fresh) and not self.integers:
            return stored == fresh
        a, b = float(stored), float(fresh)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        limit = self.abs + self.rel * max(abs(a), abs(b)) + max(_last_digit(stored), _last_digit(fresh))
        return abs(a - b) <= limit


@dataclass(frozen=True)
class FreeLines:
    """Lines of some code cells whose words are not compared (their content is an :class:`Agreement`'s).

    ``line`` is a regular expression matched against the stored line (None: every line of the cells,
    whose number may then change too). Outputs and figures of the cells are still counted.
    """

    cells: tuple[int, ...]
    why: str
    line: str | None = None

    def covers(self, cell: int, line: str) -> bool:
        """Whether ``line`` of code cell ``cell`` is free."""
        return cell in self.cells and (self.line is None or re.search(self.line, line) is not None)


@dataclass(frozen=True)
class MaskedWords:
    """Words of some code cells that are not compared: coordinates of one fit, such as which latent
    dimension correlates best with a marker (``pattern`` is a regular expression for them)."""

    cells: tuple[int, ...]
    pattern: str
    why: str


@dataclass(frozen=True)
class OptionalWarning:
    """A warning that some code cells may or may not print: a count crossing a threshold by the last digits.

    Its stderr lines that match ``pattern`` (with the source line Python echoes after each) are left out on
    both sides before the comparison; an output left empty by that is left out too.
    """

    cells: tuple[int, ...]
    pattern: str
    why: str


@dataclass(frozen=True)
class Agreement:
    """A discrete output compared by agreement between the stored run and a fresh one.

    Parameters
    ----------
    name
        What it is, in the failure message.
    expression
        Python evaluated in the notebook's kernel after its last cell: for ``"ari"`` a pandas Series of
        labels indexed by cell names, for ``"jaccard"`` an iterable of items (genes, pairs).
    metric
        ``"ari"`` (adjusted Rand index over the cells both runs label) or ``"jaccard"``.
    minimum
        The bound the agreement must reach.
    why
        Where the bound comes from.
    """

    name: str
    expression: str
    metric: str
    minimum: float
    why: str


@dataclass(frozen=True)
class NotebookChecks:
    """How one tutorial's fresh outputs are compared with its stored ones."""

    tolerances: Sequence[Tolerance] = ()
    free_lines: Sequence[FreeLines] = ()
    agreements: Sequence[Agreement] = field(default_factory=tuple)
    masked_words: Sequence[MaskedWords] = ()
    optional_warnings: Sequence[OptionalWarning] = ()

    def without_optional_warnings(self, cell: int, outputs: list[str]) -> list[str]:
        """``outputs`` of code cell ``cell`` without the stderr lines of its optional warnings."""
        patterns = [w.pattern for w in self.optional_warnings if cell in w.cells]
        if not patterns:
            return outputs
        kept = []
        for output in outputs:
            if output.startswith("stderr: "):
                lines, skip_echo = [], False
                for line in output.removeprefix("stderr: ").split("\n"):
                    if skip_echo and line.startswith(" "):
                        skip_echo = False
                        continue
                    skip_echo = any(re.search(p, line) for p in patterns)
                    if not skip_echo:
                        lines.append(line)
                if not lines:
                    continue
                output = "stderr: " + "\n".join(lines)
            kept.append(output)
        return kept

    def masked(self, cell: int, line: str) -> str:
        """``line`` with the words of this cell's :class:`MaskedWords` rules replaced (numbers among them too)."""
        for mask in self.masked_words:
            if cell in mask.cells:
                line = re.sub(mask.pattern, "<masked>", line)
        return line

    def tolerance(self, cell: int, line: str, number: re.Match) -> Tolerance:
        """The first rule covering ``number`` on ``line`` of ``cell``; an exact one when none does."""
        return next((t for t in self.tolerances if t.covers(cell, line, number)), _EXACT)

    def is_free(self, cell: int, line: str) -> bool:
        """Whether ``line`` of ``cell`` is exempt from the word comparison."""
        return any(rule.covers(cell, line) for rule in self.free_lines)

    def probe_source(self) -> str:
        """The code of a cell that prints, after the notebook's last cell, the objects of its agreements."""
        expressions = ", ".join(f"{a.name!r}: {a.expression}" for a in self.agreements)
        return "\n".join(
            [
                "def _countvae_claim(value):",
                "    if hasattr(value, 'to_dict'):",
                "        return {str(k): str(v) for k, v in value.to_dict().items()}",
                "    return sorted(str(v) for v in value)",
                "",
                "",
                "import json as _countvae_json",
                "",
                f"print({CLAIMS_MARKER!r} + _countvae_json.dumps("
                f"{{k: _countvae_claim(v) for k, v in {{{expressions}}}.items()}}))",
            ]
        )


_EXACT = Tolerance(cells=(), why="exact")


def _content(output: str) -> str:
    """A comparable output without the kind it starts with ("stdout: ", "text/plain: ")."""
    return output.split(": ", 1)[1] if ": " in output else ""


def _words(line: str) -> str:
    """``line`` with its numbers replaced and its whitespace runs collapsed (a table's columns widen when a
    number gains a digit or a sign)."""
    return " ".join(NUMBER.sub("<n>", line).split())


def _is_integer(text: str) -> bool:
    return re.fullmatch(r"[-+]?\d+", text) is not None


def _last_digit(text: str) -> float:
    """One unit of the last printed digit of a number: 0.01 for "0.57", 1e-19 for "6.821210e-13", 0 for "12"."""
    if _is_integer(text):
        return 0.0  # an integer is not rounded: 12 calls are 12 calls
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def normalise(text: str) -> str:
    """``text`` with every volatile part replaced by a placeholder and progress bars removed."""
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = line.rsplit("\r", 1)[-1]  # a carriage return redraws the line: keep what was drawn last
        if _PROGRESS.search(line):
            continue
        for pattern, placeholder in _SUBSTITUTIONS:
            line = pattern.sub(placeholder, line)
        lines.append(line.rstrip())
    return "\n".join(lines).strip("\n")


def _rich_text(output: nbformat.NotebookNode) -> Iterable[str]:
    data = output.get("data", {})
    # a figure must still be there, but its pixels may differ (fonts, renderer versions)
    yield from (f"{mime}: <figure>" for mime in sorted(data) if mime.startswith("image/"))
    for mime in TEXT_MIME:
        # A table displayed as text and as HTML says the same twice; the text keeps each row on one line,
        # which the rules' line patterns need.
        if mime == "text/html" and "text/plain" in data:
            continue
        if mime in data:
            value = data[mime]
            value = "".join(value) if isinstance(value, list) else str(value)
            yield f"{mime}: {normalise(value)}"


def comparable_outputs(notebook: nbformat.NotebookNode) -> list[list[str]]:
    """Per code cell: its stdout, its stderr, then each display and error in order, as normalised text.

    Each stream is joined over the cell: the kernel may split one print into several messages, and
    stdout and stderr are flushed independently, so only each stream's whole text is stable.
    """
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        streams = {"stdout": "", "stderr": ""}
        rich = []
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                streams[output.get("name", "stdout")] = streams.get(output.get("name", "stdout"), "") + output.text
            elif kind in ("execute_result", "display_data"):
                rich.extend(_rich_text(output))
            elif kind == "error":
                rich.append(f"error: {output.get('ename')}: {normalise(output.get('evalue', ''))}")
        texts = [f"{name}: {normalise(text)}" for name, text in streams.items() if normalise(text)]
        cells.append(texts + rich)
    return cells


def _line_differences(cell: int, old: str, new: str, checks: NotebookChecks) -> list[str]:
    """What differs between a stored and a fresh line beyond what ``checks`` allows (empty: the same)."""
    if checks.is_free(cell, old):
        return []
    old, new = checks.masked(cell, old), checks.masked(cell, new)
    if _words(old) != _words(new):
        return [f"code cell {cell}: words differ:\n  stored: {old!r}\n  now:    {new!r}"]
    problems = []
    for match, b in zip(NUMBER.finditer(old), NUMBER.findall(new), strict=True):
        a, rule = match.group(), checks.tolerance(cell, old, match)
        if a != b and (rule is _EXACT or not rule.allows(a, b)):
            allowed = "exactly" if rule is _EXACT else f"within abs {rule.abs:g} + rel {rule.rel:g} ({rule.why})"
            problems.append(f"code cell {cell}: {b} where the stored notebook has {a}, to match {allowed}: {old!r}")
    return problems


def differences(
    stored: nbformat.NotebookNode, fresh: nbformat.NotebookNode, checks: NotebookChecks | None = None
) -> list[str]:
    """Human-readable differences between two runs of one notebook beyond ``checks`` (empty: same claims)."""
    checks = checks or NotebookChecks()
    a, b = comparable_outputs(stored), comparable_outputs(fresh)
    if len(a) != len(b):
        return [f"the notebooks have {len(a)} and {len(b)} code cells"]
    problems = []
    for number, (old, new) in enumerate(zip(a, b, strict=True), start=1):
        old, new = checks.without_optional_warnings(number, old), checks.without_optional_warnings(number, new)
        kinds_old, kinds_new = [o.split(":", 1)[0] for o in old], [o.split(":", 1)[0] for o in new]
        if kinds_old != kinds_new:
            problems.append(f"code cell {number}: outputs {kinds_old} stored, {kinds_new} now")
            continue
        for out_old, out_new in zip(old, new, strict=True):
            # the kinds are compared above: the lines are the content, so that a rule anchored at a line's
            # start covers an output's first line too
            lines_old, lines_new = _content(out_old).split("\n"), _content(out_new).split("\n")
            if len(lines_old) != len(lines_new):
                if all(checks.is_free(number, line) for line in lines_old):
                    continue
                problems.append(
                    f"code cell {number}: {len(lines_old)} lines stored, {len(lines_new)} now:\n"
                    f"  stored: {out_old[:400]!r}\n  now:    {out_new[:400]!r}"
                )
                continue
            for line_old, line_new in zip(lines_old, lines_new, strict=True):
                problems.extend(_line_differences(number, line_old, line_new, checks))
    return problems


def claims_from_probe(notebook: nbformat.NotebookNode) -> dict:
    """The agreement objects the probe cell printed (the notebook's last code cell), parsed."""
    cell = [c for c in notebook.cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    if CLAIMS_MARKER not in text:
        raise ValueError(f"the probe cell printed no claims: {text[-2000:]!r}")
    return json.loads(text.split(CLAIMS_MARKER, 1)[1].strip().splitlines()[0])


def agreement_score(metric: str, stored: object, fresh: object) -> float:
    """ARI of two labelings over the cells both have, or Jaccard of two item lists."""
    if metric == "ari":
        from sklearn.metrics import adjusted_rand_score

        common = sorted(set(stored) & set(fresh))
        if not common or len(common) < 0.99 * max(len(stored), len(fresh)):
            return float("nan")  # the runs labelled other cells: not comparable
        return float(adjusted_rand_score([stored[k] for k in common], [fresh[k] for k in common]))
    if metric == "jaccard":
        a, b = set(stored), set(fresh)
        return 1.0 if not a | b else len(a & b) / len(a | b)
    raise ValueError(f"unknown agreement metric {metric!r}")


def agreement_differences(checks: NotebookChecks, stored: dict, fresh: dict) -> list[str]:
    """The agreements of ``checks`` that a fresh run's objects do not reach against the stored ones."""
    problems = []
    for claim in checks.agreements:
        if claim.name not in stored:
            problems.append(f"{claim.name}: no stored value; rebuild the notebook's claims")
            continue
        score = agreement_score(claim.metric, stored[claim.name], fresh.get(claim.name, []))
        if not score >= claim.minimum:
            problems.append(
                f"{claim.name}: {claim.metric} {score:.3f} with the stored run, below {claim.minimum} ({claim.why})"
            )
    return problems
