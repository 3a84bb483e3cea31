"""The embedded demo: a structured-generation task and a small policy, built locally (no downloads).

Entry point: `verl_ext.demo.build.ensure_demo_assets` (CLI: `python -m verl_ext.demo.build`).
"""
