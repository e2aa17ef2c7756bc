"""The `checks` section: what the data checks between ingest and training compare, and what each does.

Every check has an action: `fail` stops the day before training (nothing is published; the flow
ends in `DataCheckFailed`), `warn` records it and goes on, `off` skips it.  A day whose change is
real (a launch, a holiday) is rerun with `--set checks.<name>.action=warn`; the lineage records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

ACTIONS = ("fail", "warn", "off")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckAction:
    action: str = "fail"
    """`fail` (the day stops before training), `warn` (recorded, the run goes on) or `off`."""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")


def _fail() -> CheckAction:
    return CheckAction(action="fail")


def _warn() -> CheckAction:
    return CheckAction(action="warn")


@dataclass(frozen=True, kw_only=True, slots=True)
class ChecksConfig:
    """Thresholds of the data checks, and one action per check (`checks.<name>.action`)."""

    window_days: int = 7
    """The day is compared with the completed days among the `window_days` before it; with fewer
    than 2 of them only the absolute checks (padded rows, click rate of 0 or 1, duplicates) run."""
    min_volume_ratio: float = 0.3
    """volume: fail when the day's rows read are under this share of the window's median (a partial export)."""
    max_volume_ratio: float = 3.0
    """volume: ... or over this many times it (a replayed or doubled export)."""
    max_ctr_change: float = 0.5
    """click_rate: relative change of the click rate against the window's median (lost or broken labels)."""
    max_missing_increase: float = 0.3
    """missing_rate: rise of one field's missing share over its median, absolute (a field dropped upstream)."""
    max_padded_share: float = 0.05
    """padded_rows: share of rows with missing trailing fields (rows cut short: the columns shift)."""
    max_duplicate_share: float = 0.2
    """duplicates: share of rows that exactly copy another row of the day (a replayed export)."""
    max_quarantined_increase: float = 0.005
    """quarantined: rise of the quarantined share over its median, absolute (a format change upstream)."""
    max_psi: float = 0.25
    """psi: population stability index of a dense field's values against the window's (a unit or scale change)."""
    max_oov_increase: float = 0.2
    """oov_rate: rise of one field's share of values the previous vocabulary lacks, absolute (re-hashed ids)."""
    max_feature_auc: float = 0.99
    """leakage: a feature whose value or presence alone predicts the label with this AUC."""
    max_one_class_missing: float = 0.99
    """leakage: ... or missing on this share of one class's rows (at most half of the other's)."""
    volume: CheckAction = field(default_factory=_fail)
    """volume: the day's rows read outside [min_volume_ratio, max_volume_ratio] x the window's median."""
    click_rate: CheckAction = field(default_factory=_fail)
    """click_rate: a click rate of 0 or 1 (always), or a relative change over `max_ctr_change`."""
    padded_rows: CheckAction = field(default_factory=_fail)
    """padded_rows: over `max_padded_share` of rows with missing trailing fields (always)."""
    missing_rate: CheckAction = field(default_factory=_fail)
    """missing_rate: a field's missing share up by more than `max_missing_increase`."""
    duplicates: CheckAction = field(default_factory=_fail)
    """duplicates: over `max_duplicate_share` of rows exact copies of another (always)."""
    leakage: CheckAction = field(default_factory=_fail)
    """leakage: a feature that gives the label away (always)."""
    quarantined: CheckAction = field(default_factory=_warn)
    """quarantined: the quarantined share up by more than `max_quarantined_increase`."""
    psi: CheckAction = field(default_factory=_warn)
    """psi: a dense field's PSI against the window over `max_psi`."""
    oov_rate: CheckAction = field(default_factory=_warn)
    """oov_rate: a field's share of values the previous vocabulary lacks up by more than `max_oov_increase`."""
    distinct_keys: CheckAction = field(default_factory=_warn)
    """distinct_keys: one field's distinct keys of the day outside the volume ratios of their median."""

    def __post_init__(self) -> None:
        if self.window_days < 1:
            raise ValueError(f"checks.window_days must be >= 1, got {self.window_days}")
        if not 0 <= self.min_volume_ratio <= 1 <= self.max_volume_ratio:
            raise ValueError(
                f"checks.min_volume_ratio ({self.min_volume_ratio}) must be in [0, 1] and checks.max_volume_ratio "
                f"({self.max_volume_ratio}) >= 1"
            )
        for name in (
            "max_ctr_change",
            "max_missing_increase",
            "max_padded_share",
            "max_duplicate_share",
            "max_quarantined_increase",
            "max_psi",
            "max_oov_increase",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"checks.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_feature_auc", "max_one_class_missing"):
            if not 0.5 < getattr(self, name) <= 1:
                raise ValueError(f"checks.{name} must be in (0.5, 1], got {getattr(self, name)}")

    def action(self, check: str) -> str:
        """The action of check `check`."""
        return getattr(self, check).action


CHECKS: tuple[str, ...] = tuple(f.name for f in fields(ChecksConfig) if f.type in ("CheckAction", CheckAction))
"""Every check's name, in the order they are reported."""


def overridden(cfg: ChecksConfig) -> dict[str, str]:
    """The checks whose action differs from the default (for the lineage): name -> action."""
    default = ChecksConfig()
    return {name: cfg.action(name) for name in CHECKS if cfg.action(name) != default.action(name)}
