"""Informer tuning from the Settings: the one place where app/kube meets the configuration."""

from __future__ import annotations

from app.config import Settings
from app.kube.informer import InformerOptions

_STREAMING_LIST: dict[str, bool | None] = {"on": True, "off": False, "auto": None}


def informer_options(settings: Settings) -> InformerOptions:
    """The configurable options (docs/design/product.md §5); the rest keep the informer's defaults."""
    return InformerOptions(
        page_size=settings.list_page_size,
        watch_timeout_range=(settings.watch_timeout_min_seconds, settings.watch_timeout_max_seconds),
        inactivity_timeout=settings.watch_inactivity_timeout_seconds,
        max_object_bytes=settings.max_object_bytes,
        streaming_list=_STREAMING_LIST[settings.streaming_list],
        initial_events_timeout=settings.initial_events_timeout_seconds,
    )
