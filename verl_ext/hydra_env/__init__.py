"""Hydra's ``hydra/env`` group as verl_ext sets it in verl's own applications (verl_ext/startup.py)."""
