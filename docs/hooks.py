"""MkDocs hook: the config and CLI references, generated at build time from the code itself, and the record of the
reproduced experiments, taken from the repository as it is.

The config reference walks the pydantic schema (``fedsl.config.schema.RunConfig``), the CLI
reference walks typer's click commands, so neither can drift from the code. REPRODUCTION.md and each experiment's
page (``reproduction/pages/*.md``, with the figures they show) are served at the same paths as in the repository, so
that their links work on the site as they do on a checkout.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

from mkdocs.structure.files import File
from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a!r}`" if isinstance(a, str) else f"`{a}`" for a in typing.get_args(annotation))
    if isinstance(annotation, type):
        return annotation.__name__
    text = re.sub(r"fedsl\.experiments\.\w+\.", "", str(annotation).replace("typing.", ""))  # config's modules
    return text.replace("|", "\\|")


def _default(field) -> str:
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{field.default!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _rows(annotation, f"{prefix}{name}.")
            continue
        yield f"| `{prefix}{name}` | {_type_name(annotation)} | {_cell(_default(field))} | " \
              f"{_cell(field.description or '')} |"


def config_reference() -> str:
    from fedsl.config.schema import Claim, RunConfig

    head = ["| key | type | default | meaning |", "|---|---|---|---|"]
    return "\n".join([
        "# Config keys",
        "",
        "Every key of a run's TOML file (`fedsl run my.toml`), as dotted names for `--set KEY=VALUE`, generated",
        "from the schema (`fedsl.config.schema.RunConfig`). A key left unset takes its default; the",
        "paper's rules fill the server's defaults (printed with each run). Unknown keys, wrong types and",
        "out-of-range values stop before any work with one line.",
        "",
        *head, *_rows(RunConfig),
        "",
        "## Claims (`[[claims]]`)",
        "",
        "What `fedsl report` judges from a group's runs "
        "(see [Reproduce a figure](../tutorials/reproduce-a-figure.md)).",
        "",
        *head, *_rows(Claim),
        "",
    ])


def cli_reference() -> str:
    import click
    import typer

    from fedsl.cli import app

    lines = ["# Command line", "", "Generated from the `fedsl` command's own help (`fedsl --help`, "
             "`fedsl COMMAND --help`).", ""]

    def walk(cmd: click.Command, path: str) -> None:
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():  # as the CLI lists them: run, resume, ... first
                if not sub.hidden:
                    walk(sub, f"{path} {name}")
            return
        lines.extend([f"## `{path}`", "", (cmd.help or "").strip(), ""])
        args = [p for p in cmd.params if isinstance(p, click.Argument)]
        usage = " ".join([path, "[OPTIONS]"] + [a.name.upper() for a in args])
        lines.extend([f"    {usage}", ""])
        rows = []
        for p in cmd.params:
            if p.name == "help":
                continue
            names = ", ".join(f"`{o}`" for o in (p.opts + p.secondary_opts)) if isinstance(p, click.Option) \
                else f"`{p.name.upper()}`"
            default = "" if p.default in (None, False, (), []) or callable(p.default) else f"`{p.default}`"
            rows.append(f"| {names} | {_cell(getattr(p, 'help', None) or '')} | {default} |")
        if rows:
            lines.extend(["| argument or option | meaning | default |", "|---|---|---|", *rows, ""])

    walk(typer.main.get_command(app), "fedsl")
    return "\n".join(lines)


ROOT = Path(__file__).resolve().parent.parent
RECORD = "REPRODUCTION.md"
PAGES = "reproduction/pages"
FIGURE = re.compile(r"\]\((\.\./[\w./-]+\.png)\)")  # a page's figure: ../FOLDER/NAME.png


def record_pages() -> list[tuple[str, str]]:
    """(the page's path in the repository, its title) of each experiment's page, in name order."""
    return [(f"{PAGES}/{p.name}", p.read_text().splitlines()[0].lstrip("# ").strip())
            for p in sorted((ROOT / PAGES).glob("*.md"))]


def on_config(config):
    pages = [{title: path} for path, title in record_pages()]
    config["nav"].append({"Reproduction": [{"Summary (REPRODUCTION.md)": RECORD}, *pages]})
    return config


def on_files(files, config):
    for path, text in (("reference/config.md", config_reference()), ("reference/cli.md", cli_reference())):
        files.append(File.generated(config, path, content=text))
    figures = set()
    for path in [RECORD, *(p for p, _ in record_pages())]:
        files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
        for rel in FIGURE.findall((ROOT / path).read_text()):
            figures.add((Path(path).parent / rel).as_posix().replace("reproduction/pages/../", "reproduction/"))
    for path in sorted(figures):
        files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    return files
