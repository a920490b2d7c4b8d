"""The values ``capture.mode`` and ``capture.mode.full.update.type`` take, and what each mode puts
in an event: the table the settings are checked against (``config.source``) and the capture turns
into change-stream options (``capture.capture_modes``, which documents the modes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CaptureMode:
    full_update: bool  # updates carry the whole document in ``after``
    pre_image: bool  # updates, replaces and deletes carry the previous document in ``before``


CAPTURE_MODES = {
    "change_streams_update_full": CaptureMode(full_update=True, pre_image=False),
    "change_streams": CaptureMode(full_update=False, pre_image=False),
    "change_streams_with_pre_image": CaptureMode(full_update=False, pre_image=True),
    "change_streams_update_full_with_pre_image": CaptureMode(full_update=True, pre_image=True),
}
FULL_UPDATE_TYPES = ("lookup", "post_image")


def check_full_update_type(capture_mode: str, full_update_type: str) -> None:
    """Refuse ``post_image`` with a mode whose updates carry no full document: it would do nothing."""
    if full_update_type == "post_image" and not CAPTURE_MODES[capture_mode].full_update:
        full_modes = ", ".join(name for name, mode in CAPTURE_MODES.items() if mode.full_update)
        raise ValueError(
            f"key 'capture.mode.full.update.type' is 'post_image', but capture.mode '{capture_mode}' "
            f"puts no full document in updates; use capture.mode {full_modes}, or drop the key"
        )
