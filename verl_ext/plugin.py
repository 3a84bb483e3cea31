"""Loaded by verl in every process that imports it, through the ``verl.plugins`` entry point.

verl logs an exception raised here at debug level only, so a verl that verl_ext was not checked against is
reported here as a warning (and nothing is registered); ``verl_ext.main`` refuses it at start-up.
"""

import warnings

from verl_ext import compat

_problem = compat.version_problem("verl")
if _problem is None:
    from verl_ext.registration import register_all

    register_all()
else:
    warnings.warn(f"verl_ext is not loaded: {_problem}", stacklevel=1)
