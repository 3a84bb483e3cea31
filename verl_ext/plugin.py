"""Loaded by verl in every process that imports it, through the ``verl.plugins`` entry point."""

from verl_ext.registration import register_all

register_all()
