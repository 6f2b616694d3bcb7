"""A small base for analysis results (``.summary``, ``print_summary()``, an HTML repr) and ``Attempt``, the value
of one analysis or why it could not be computed."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass
class Attempt:
    """The value of one analysis, or why it could not be computed (``error``)."""

    value: object = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Result:
    """Base of every result object: subclasses set ``title``, ``summary`` and optionally ``notes``."""

    title: str = "result"
    summary: pd.DataFrame
    notes: list

    def _notes(self) -> list:
        return list(getattr(self, "notes", []) or [])

    def print_summary(self, *, decimals: int = 4) -> None:
        print(self._text(decimals))

    def _text(self, decimals: int = 4) -> str:
        with pd.option_context("display.max_columns", 50, "display.width", 160):
            lines = [self.title, "=" * len(self.title), self.summary.round(decimals).to_string()]
        lines += [f"note: {n}" for n in self._notes()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.title}; {len(self.summary)} summary rows>"

    def _repr_html_(self) -> str:
        notes = "".join(f"<li>{n}</li>" for n in self._notes())
        return (f"<h4>{self.title}</h4>" + self.summary.to_html(float_format=lambda v: f"{v:.4g}")
                + (f"<ul>{notes}</ul>" if notes else ""))
