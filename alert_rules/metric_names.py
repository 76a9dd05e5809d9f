"""The metric names the rules read: the metric table's (exporters/catalog.py), nothing spelled here.

`metric_names.GPU_TEMPERATURE` is `exporters.catalog.GPU_TEMPERATURE`; a name that is not in the
catalog fails when the rules are generated. What stays here is rule logic, not names: the label
matchers some rules add to a metric.
"""

from __future__ import annotations

from typing import Any

from exporters import catalog

# uncorrectable errors since the driver loaded (the aggregate counter repeats the same events
# and is not supported everywhere)
GPU_ECC_UNCORRECTED = 'error_type="uncorrected",counter="volatile"'
REMEDIATION_ACTION_FAILED = 'result="failed"'


def __getattr__(name: str) -> Any:
    """Every other attribute is the catalog's (PEP 562), so there is no second list to keep."""
    try:
        return getattr(catalog, name)
    except AttributeError:
        raise AttributeError(f"{name} is not in exporters/catalog.py's metric table") from None
