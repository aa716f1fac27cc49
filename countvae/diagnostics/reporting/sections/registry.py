"""The report's sections in report order, and how a requested subset is resolved (names or :class:`Section` objects).

``report(fits, heldout, sections=...)`` runs the sections given (default: :data:`DEFAULT_SECTIONS`,
plus any added with :func:`register_section`); a section that another requires is added to the run.
The sections of :data:`OPTIONAL_SECTIONS` need more than the fits (the restrictions section needs
restricted fits): they run only when asked for, by name or through their request.
"""

from __future__ import annotations

from collections.abc import Sequence

from countvae.diagnostics.reporting.sections.about import AboutSection
from countvae.diagnostics.reporting.sections.alignment import AlignmentSection
from countvae.diagnostics.reporting.sections.base import Section
from countvae.diagnostics.reporting.sections.batch_mixing import BatchMixingSection
from countvae.diagnostics.reporting.sections.calibration import CalibrationSection
from countvae.diagnostics.reporting.sections.downstream import DownstreamReportSection
from countvae.diagnostics.reporting.sections.ground_truth import GroundTruthSection
from countvae.diagnostics.reporting.sections.guide_spread import GuideSpreadSection
from countvae.diagnostics.reporting.sections.ica_components import ICAComponentsSection
from countvae.diagnostics.reporting.sections.invariants import InvariantsSection
from countvae.diagnostics.reporting.sections.markers import MarkersSection
from countvae.diagnostics.reporting.sections.per_cell import PerCellSection
from countvae.diagnostics.reporting.sections.placement import PlacementSection
from countvae.diagnostics.reporting.sections.ppc import PPCSection
from countvae.diagnostics.reporting.sections.predictive import PredictiveSection
from countvae.diagnostics.reporting.sections.restrictions import RestrictionsSection
from countvae.diagnostics.reporting.sections.seed_groups import SeedGroupsSection
from countvae.diagnostics.reporting.sections.subspace import SubspaceSection
from countvae.diagnostics.reporting.sections.training_cells import TrainingCellsSection
from countvae.errors import InvalidArgumentError

#: The default sections, in the order the report shows them.
DEFAULT_SECTIONS: tuple[Section, ...] = (
    InvariantsSection(),
    PredictiveSection(),
    SeedGroupsSection(),
    AlignmentSection(),
    ICAComponentsSection(),
    SubspaceSection(),
    MarkersSection(),
    GuideSpreadSection(),
    PPCSection(),
    DownstreamReportSection(),
    BatchMixingSection(),
    PlacementSection(),
    TrainingCellsSection(),
    GroundTruthSection(),
    CalibrationSection(),
    PerCellSection(),
    AboutSection(),
)
#: Sections run only when asked for, each with the section it is shown before.
OPTIONAL_SECTIONS: tuple[tuple[Section, str], ...] = ((RestrictionsSection(), "calibration"),)
_registry: list[Section] = list(DEFAULT_SECTIONS)


def registered_sections() -> tuple[Section, ...]:
    """The sections a report runs by default, in report order."""
    return tuple(_registry)


def known_sections() -> tuple[Section, ...]:
    """Every section a report can run, in report order: the registered ones and the optional ones."""
    known = list(_registry)
    for section, before in OPTIONAL_SECTIONS:
        names = [s.name for s in known]
        known.insert(names.index(before) if before in names else len(known), section)
    return tuple(known)


def register_section(section: Section, before: str = "about") -> None:
    """Add ``section`` to the default sections, shown before the section named ``before`` (default: "About").

    Raises
    ------
    InvalidArgumentError
        If a section of that name is registered already, or ``before`` is not a registered name.

    """
    names = [s.name for s in _registry]
    if section.name in {s.name for s in known_sections()}:
        raise InvalidArgumentError(f"A report section named {section.name!r} is registered already.")
    if before not in names:
        raise InvalidArgumentError(f"No registered report section {before!r}; sections: {names}.")
    _registry.insert(names.index(before), section)


def unregister_section(name: str) -> None:
    """Remove a section added with :func:`register_section` (the default sections cannot be removed)."""
    if name in {s.name for s in DEFAULT_SECTIONS}:
        raise InvalidArgumentError(f"{name!r} is a default report section; run a subset with sections=... instead.")
    _registry[:] = [s for s in _registry if s.name != name]


def resolve_sections(requested: Sequence[str | Section] | None) -> tuple[Section, ...]:
    """The sections to run: ``requested`` (names or objects; ``None``: all registered) and what they require.

    A name may also be one of :data:`OPTIONAL_SECTIONS`.

    Registered sections keep the report's order; other objects follow in the order given.

    Raises
    ------
    InvalidArgumentError
        For an unknown name, a repeated name, or a requirement that names no known section.

    """
    known = {s.name: s for s in known_sections()}
    if requested is None:
        chosen = list(_registry)
    else:
        chosen = []
        for item in requested:
            if isinstance(item, str) and item not in known:
                raise InvalidArgumentError(
                    f"Unknown report section {item!r}; the sections are {list(known)} (or pass Section objects)."
                )
            section = known[item] if isinstance(item, str) else item
            if not isinstance(section, Section):
                raise InvalidArgumentError(f"A report section is a name or a Section, got {type(item).__name__}.")
            if section.name in {s.name for s in chosen}:
                raise InvalidArgumentError(f"The report section {section.name!r} is asked for twice.")
            chosen.append(section)
    by_name = {s.name: s for s in chosen}
    pending = list(chosen)
    while pending:
        for required in pending.pop().requires:
            if required in by_name:
                continue
            if required not in known:
                raise InvalidArgumentError(f"A report section requires {required!r}, which is not a known section.")
            by_name[required] = known[required]
            pending.append(known[required])
    order = {name: i for i, name in enumerate(known)}
    listed = sorted(
        (s for s in by_name.values() if s.name in order and known[s.name] is s), key=lambda s: order[s.name]
    )
    return (*listed, *(s for s in by_name.values() if s not in listed))


def compute_order(sections: Sequence[Section]) -> list[Section]:
    """``sections`` in an order where each comes after the sections it requires."""
    done: list[Section] = []
    names = {s.name: s for s in sections}

    def visit(section: Section, path: tuple[str, ...]) -> None:
        if section in done:
            return
        if section.name in path:
            raise InvalidArgumentError(f"The report sections {list(path)} require each other in a cycle.")
        for required in section.requires:
            visit(names[required], (*path, section.name))
        done.append(section)

    for section in sections:
        visit(section, ())
    return done
