"""Allure, optional at run time: attachments and dynamic metadata are no-ops unless allure-pytest
is installed and ``--alluredir`` was given (its listener is only registered then)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import allure
except ImportError:  # pragma: no cover - allure-pytest is a dependency, but stay safe without it
    allure = None  # type: ignore[assignment]


def active(config: pytest.Config) -> bool:
    return allure is not None and config.pluginmanager.has_plugin("allure_listener")


@contextlib.contextmanager
def step(title: str) -> Iterator[None]:
    if allure is None:
        yield
        return
    with allure.step(title):
        yield


def attach_file(config: pytest.Config, path: Path, name: str) -> None:
    if not active(config) or not path.exists():
        return
    kinds = {".json": allure.attachment_type.JSON, ".csv": allure.attachment_type.CSV,
             ".yaml": allure.attachment_type.YAML, ".png": allure.attachment_type.PNG,
             ".svg": allure.attachment_type.SVG, ".txt": allure.attachment_type.TEXT}
    allure.attach.file(str(path), name=name, attachment_type=kinds.get(path.suffix, allure.attachment_type.TEXT))


def attach_text(config: pytest.Config, text: str, name: str) -> None:
    if active(config):
        allure.attach(text, name=name, attachment_type=allure.attachment_type.TEXT)


def describe(config: pytest.Config, *, title: str, file: str, scenario: str, description: str,
             parameters: dict[str, Any], volatile: dict[str, Any]) -> None:
    """Dynamic title, feature (the file), story and label (the scenario), description, parameters."""
    if not active(config):
        return
    allure.dynamic.title(title)
    allure.dynamic.feature(file)
    allure.dynamic.story(scenario)
    allure.dynamic.label("scenario", scenario)
    if description:
        allure.dynamic.description(description)
    for k, v in parameters.items():
        allure.dynamic.parameter(k, v)
    for k, v in volatile.items():  # kept out of the history id, so Allure trends keep working
        allure.dynamic.parameter(k, v, excluded=True)
