"""The embedded demo: a structured-generation task and a small policy that verl_ext builds itself (no downloads) and
ships built (demo/built).

Entry point: `verl_ext.demo.build.ensure_demo_assets` (CLI: `python -m verl_ext.demo.build`).
"""
