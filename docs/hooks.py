"""MkDocs hooks: the dashboard's screenshots (dashboards/screenshots/*.png, kept
beside the script that takes them) become site files under screenshots/, and
the code blocks' colours (Pygments' classes, see codehilite in mkdocs.yml)
become css/pygments.css, written from the installed Pygments so that the
two always agree."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File
from pygments.formatters import HtmlFormatter

ROOT = Path(__file__).resolve().parents[1]


def on_files(files, config):
    for png in sorted((ROOT / "dashboards" / "screenshots").glob("*.png")):
        files.append(File.generated(config, f"screenshots/{png.name}", abs_src_path=str(png)))
    css = HtmlFormatter(style="default").get_style_defs(".codehilite")
    files.append(File.generated(config, "css/pygments.css", content=css))
    return files
