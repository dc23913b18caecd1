"""MkDocs hook: the dashboard's screenshots (dashboards/screenshots/*.png, kept
beside the script that takes them) become site files under screenshots/."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def on_files(files, config):
    for png in sorted((ROOT / "dashboards" / "screenshots").glob("*.png")):
        files.append(File.generated(config, f"screenshots/{png.name}", abs_src_path=str(png)))
    return files
