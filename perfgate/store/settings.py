"""Read perfgate's settings files: ``[tool.perfgate]`` in pyproject.toml, baselines/tolerances.toml, and the
machine's own <baselines>/<id>/tolerances.toml.

Files here, rules in perfgate.judge.config: every table is checked there, with the file and key named.
"""
from __future__ import annotations

from pathlib import Path

from perfgate.judge.baseline_choice import tolerances_id
from perfgate.judge.config import ConfigError, Settings, apply_table, table_of
from perfgate.store.readers import read_toml
from perfgate.store.safe_paths import absolute_keeping_last_link, inside_root


def _read_toml(path: Path) -> dict:
    return read_toml(path, fix="fix the syntax (UTF-8 TOML)", error=ConfigError)


def ids_with_tolerances(baselines_root: Path) -> list[str]:
    """The hardware ids whose baselines folder holds a tolerances.toml."""
    root = Path(baselines_root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "tolerances.toml").exists())


def load_settings(rootdir: Path, baselines_dir: Path | None = None, hardware_id: str | None = None) -> Settings:
    """Read pyproject.toml's [tool.perfgate], then <baselines>/tolerances.toml, then the machine's
    <baselines>/<id>/tolerances.toml on top: ``hardware_id``'s own, else the nearest of its family's
    (perfgate.judge.baseline_choice.tolerances_id), read once.

    The last file exists because noise is a property of the machine: a shared 2-core VM
    needs wider tolerances on timing ratios than an H200 node, for the same test. ``hardware_id``
    is one perfgate.machine.hardware_id already checked (it names a folder; the path is also
    kept inside the baselines root)."""
    rootdir = Path(rootdir)
    pyproject = rootdir / "pyproject.toml"
    table: dict = {}
    if pyproject.exists():
        tool = table_of(_read_toml(pyproject).get("tool"), f"{pyproject} [tool]")
        table = table_of(tool.get("perfgate"), f"{pyproject} [tool.perfgate]")
    base = table.get("baselines", "baselines")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{pyproject} [tool.perfgate].baselines: must be a folder path as a string, like "
                          f"\"baselines\", got {base!r}"[:300])
    settings = Settings(baselines=absolute_keeping_last_link(baselines_dir or (rootdir / base)))
    if table:
        apply_table(settings, table, f"{pyproject} [tool.perfgate]")
        settings.sources.append(str(pyproject))
    tol_file = inside_root(settings.baselines, settings.baselines / "tolerances.toml", what="tolerances file")
    if tol_file.exists():
        apply_table(settings, _read_toml(tol_file), str(tol_file))
        settings.sources.append(str(tol_file))
    if hardware_id:
        settings.tolerances_id = tolerances_id(hardware_id, ids_with_tolerances(settings.baselines))
        hw_file = inside_root(settings.baselines, settings.baselines / settings.tolerances_id / "tolerances.toml",
                              what="tolerances file")
        if hw_file.exists():
            apply_table(settings, _read_toml(hw_file), str(hw_file))
            settings.sources.append(str(hw_file))
    return settings
