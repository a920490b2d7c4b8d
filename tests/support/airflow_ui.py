"""What Airflow's UI saves when an on-call engineer opens a Variable and saves it unchanged.

The UI shows a Variable as the REST API returns it (``VariableResponse``: JSON passed through
Airflow's secrets masker, so a key holding ``token``, ``secret``, ... reads ``"***"``), and its
editor parses that JSON in JavaScript, where an integer past 2**53 becomes the nearest double.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

JS_SAFE_INTEGER = 2**53 - 1


def as_the_rest_api_shows(key: str, value: str) -> str:
    from airflow.api_fastapi.core_api.datamodels.variables import VariableResponse

    shown = VariableResponse(key=key, value=value, description=None, is_encrypted=False, team_name=None)
    return shown.val


def as_the_ui_saves(key: str, value: str) -> str:
    """``value`` after a round trip through the REST API and the UI's JavaScript JSON editor."""
    return json.dumps(javascript_numbers(json.loads(as_the_rest_api_shows(key, value))), indent=2)


def javascript_numbers(value: Any) -> Any:
    """``value`` with every integer as JavaScript parses and prints it (``JSON.parse``/``stringify``):
    past 2**53 it is rounded to a double, printed with its shortest digits and zeros after them."""
    if isinstance(value, dict):
        return {key: javascript_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [javascript_numbers(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > JS_SAFE_INTEGER:
        return int(Decimal(repr(float(value))))
    return value
