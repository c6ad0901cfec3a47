from pathlib import Path

from processors._config.docgen import render

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_configuration_reference_is_in_sync() -> None:
    assert DOC.read_text() == render(), "docs/configuration.md is stale: run `make docs`"


def test_every_setting_is_documented() -> None:
    from processors._config.settings import Settings

    text = render()
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description"
        assert f"LOCKGATE_{name.upper()}" in text
