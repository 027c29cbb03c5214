"""Renderers: the Plan as Kubernetes manifests, docker compose files or systemd units.

`render(fleet, plan, target, out_dir, ...)` writes a directory deterministically;
`check_dir(path)` validates one (schemas plus inferplane's own semantic checks).
"""

from inferplane.deploy.checks import CheckProblem, check_dir
from inferplane.deploy.options import RenderOptions
from inferplane.deploy.render import TARGETS, Target, render, render_files, render_warnings

__all__ = [
    "TARGETS",
    "CheckProblem",
    "RenderOptions",
    "Target",
    "check_dir",
    "render",
    "render_files",
    "render_warnings",
]
