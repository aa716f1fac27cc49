"""The report's sections: the protocol (:mod:`.base`) and the default sections in report order (:mod:`.registry`)."""

from countvae.diagnostics.reporting.sections.base import Section, SectionResult, Shared
from countvae.diagnostics.reporting.sections.registry import (
    DEFAULT_SECTIONS,
    register_section,
    registered_sections,
    resolve_sections,
    unregister_section,
)

__all__ = [
    "DEFAULT_SECTIONS",
    "Section",
    "SectionResult",
    "Shared",
    "register_section",
    "registered_sections",
    "resolve_sections",
    "unregister_section",
]
