"""Build hook: puts the generated stubs (package `rollout`, i.e. rollout.v1.rollout_pb2 ...) into the sdist and wheel.

From a checkout they come from ../gen/python/rollout, the one copy `buf generate` writes and CI checks for freshness.
An sdist carries them at its root as rollout/, so a wheel built from the sdist (`python -m build`) finds them there.
"""
from __future__ import annotations

from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class StubsBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        root = Path(self.root)
        for source in (root.parent / "gen" / "python" / "rollout", root / "rollout"):
            if (source / "v1" / "rollout_pb2.py").is_file():
                build_data["force_include"][str(source)] = "rollout"
                return
        raise RuntimeError(f"generated stubs not found under {root.parent / 'gen' / 'python'}: run `npx buf generate` in the repository")
